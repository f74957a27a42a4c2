"""``rlserve serve --ray``'s bad input: each one line naming the fix, before anything starts."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from rlserve.cli.serve_ray import ray_serving
from rlserve.cluster.connect import LearnerPlacement, connect
from rlserve.errors import ConfigError


def _closed_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def test_ray_without_the_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(
        ConfigError, match=r"--ray needs Ray.*pip install -e '\.\[ray\]' in the checkout"
    ) as e:
        connect("127.0.0.2:6379")
    assert "\n" not in str(e.value)


def test_a_cluster_that_does_not_answer_is_named_with_the_fix() -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    address = f"127.0.0.2:{_closed_port('127.0.0.2')}"
    with pytest.raises(ConfigError, match=rf"the Ray cluster at {address} does not answer") as e:
        connect(address, timeout_s=2.0)
    assert "ray start --head" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        connect("no-port-here")


def test_learner_resources_are_read_as_json() -> None:
    placement = LearnerPlacement.parse('{"GPU": 1, "CPU": 2, "sim": 0.5}')
    assert placement.options() == {"num_cpus": 2.0, "num_gpus": 1.0, "resources": {"sim": 0.5}}
    assert LearnerPlacement.parse(None).options() == {"num_cpus": 1.0, "num_gpus": 0.0}
    for bad in ("GPU=1", "[1]", '{"GPU": -1}', '{"GPU": "x"}'):
        with pytest.raises(ConfigError, match=r"--ray-learner-resources .*JSON map"):
            LearnerPlacement.parse(bad)


@pytest.mark.timeout(240)
def test_serve_refuses_an_unanswering_cluster_before_making_the_run(
    run_rlserve: Any, tmp_path: Path
) -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    address = f"127.0.0.2:{_closed_port('127.0.0.2')}"
    done = run_rlserve(
        "serve",
        "--spaces-from",
        "CartPole-v1",
        "--run-dir",
        str(tmp_path / "runs"),
        "--port",
        "0",
        "--ray",
        address,
    )
    assert done.returncode != 0
    assert f"the Ray cluster at {address} does not answer" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_ray_flags_without_ray_are_refused(run_rlserve: Any) -> None:
    done = run_rlserve(
        "serve", "--spaces-from", "CartPole-v1", "--ray-learner-resources", '{"GPU": 1}'
    )
    assert done.returncode != 0
    assert "--ray-learner-resources apply to a server on Ray: add --ray ADDRESS" in done.stderr


def test_replicas_without_ray_are_refused() -> None:
    args = argparse.Namespace(ray=None, replicas=2, ray_node_ip=None, front_end_of=None)
    with pytest.raises(ConfigError, match=r"--replicas apply to a server on Ray: add --ray"):
        ray_serving(args, object())
