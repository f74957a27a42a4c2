"""What an operator meets: the documented metrics, endpoints.json, ``rlserve status``, the resume
message and the warning about episodes that were never ended, against a real server."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import play_cartpole

from rlserve import PolicyClient
from rlserve.client.local import LocalConfig
from rlserve.server.stats import COUNTERS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

METRICS_DOC = Path(__file__).parents[2] / "docs" / "metrics.md"
SMALL_PPO = (
    "--ppo-train-batch-size",
    "64",
    "--ppo-minibatch-size",
    "32",
    "--ppo-num-epochs",
    "1",
    "--fragment-length",
    "16",
)


def documented_metrics() -> set[str]:
    """The names in the first column of the tables of docs/metrics.md."""
    return set(re.findall(r"^\| `([a-z_]+/[a-z_0-9]+)` \|", METRICS_DOC.read_text(), re.M))


def prometheus_names(text: str) -> set[str]:
    return {line.split()[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_docs_list_exactly_the_metrics_the_server_exports(launch_server: Any) -> None:
    """After remote and local traffic and a learner update, the exported names are the doc's."""
    server = launch_server(*SMALL_PPO, "--seed", "3")
    documented = documented_metrics()
    assert len(documented) > 40
    before = server.metrics()
    # Present from the start, with their initial values (no update yet).
    assert before["learner/updates"] == 0
    assert before["learner/policy_loss"] is None
    assert set(before) == documented, set(before) ^ documented
    server.wait_for_weights()
    with PolicyClient(server.address, inference_mode="remote") as client:
        remote = [play_cartpole(client, seed=s, max_steps=20) for s in range(3)]
    local_config = LocalConfig(batch_steps=32, batch_interval=0.1)
    with PolicyClient(server.address, inference_mode="local", local=local_config, seed=5) as local:
        local_steps = sum(play_cartpole(local, seed=s, max_steps=20).length for s in range(10, 14))
    metrics = server.wait_until(
        lambda m: m["episodes/completed"] >= 7 and m["learner/updates"] >= 1,
        timeout=120,
        what="7 episodes (3 remote, 4 local) and a learner update",
    )
    # Local episodes are counted as started when their summary arrives.
    assert metrics["episodes/started"] == len(remote) + 4
    assert metrics["samples/steps_reported"] == local_steps
    assert metrics["samples/env_steps"] == local_steps + sum(r.length for r in remote)
    assert math.isfinite(metrics["learner/policy_loss"])
    assert set(metrics) == documented, set(metrics) ^ documented
    reply = httpx.get(f"{server.http_url}/metrics", timeout=10)
    expected = {
        "rlserve_" + name.replace("/", "_") + ("_total" if name in COUNTERS else "")
        for name in documented
    }
    assert prometheus_names(reply.text) == expected


def test_endpoints_file_says_where_the_server_listens_and_when_it_stopped(
    launch_server: Any,
) -> None:
    server = launch_server()
    endpoints = json.loads((server.run_folder / "endpoints.json").read_text())
    assert endpoints["state"] == "running"
    assert endpoints["pid"] == server.process.pid
    assert endpoints["tls"] is False
    assert endpoints["binary"] == {
        "host": "127.0.0.1",
        "port": server.port,
        "url": f"tcp://127.0.0.1:{server.port}",
    }
    assert endpoints["http"]["port"] == server.http_port
    assert endpoints["http"]["url"] == server.http_url
    # The ports in the file are the ones that answer.
    with PolicyClient(endpoints["binary"]["url"], inference_mode="remote") as client:
        client.start_episode()
    assert server.stop() == 0
    stopped = json.loads((server.run_folder / "endpoints.json").read_text())
    assert stopped["state"] == "stopped"
    assert stopped["stopped"] >= stopped["started"]
    assert not list(server.run_folder.glob(".endpoints.json*"))


def test_status_shows_progress_and_needs_the_token(
    launch_server: Any, run_rlserve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = launch_server("--token", "s3cret")
    server.wait_for_weights()
    with PolicyClient(server.address, token="s3cret", inference_mode="remote") as client:
        play_cartpole(client, seed=1, max_steps=5)
        client.start_episode()
        run = str(server.run_folder)
        refused = run_rlserve("status", run)
        assert refused.returncode != 0
        assert len(refused.stderr.strip().splitlines()) == 1
        assert "--token" in refused.stderr and "RLSERVE_TOKEN" in refused.stderr
        shown = run_rlserve("status", run, "--token", "s3cret")
        assert shown.returncode == 0, shown.stderr
        assert "5 env steps" in shown.stdout
        assert "1 connected" in shown.stdout
        assert "2 started, 1 completed, 0 timed out, 1 active" in shown.stdout
        assert "weights v0" in shown.stdout
        monkeypatch.setenv("RLSERVE_TOKEN", "s3cret")
        by_address = run_rlserve("status", server.http_url, "--json")
        assert by_address.returncode == 0, by_address.stderr
        assert json.loads(by_address.stdout)["metrics"]["samples/env_steps"] == 5
    server.stop()
    # A stopped server's folder is summarised from its progress.csv.
    down = run_rlserve("status", run)
    assert down.returncode == 0, down.stderr
    assert "finished (stopped" in down.stdout and f"--resume {run}" in down.stdout
    assert "5 env steps" in down.stdout
    gone = run_rlserve("status", server.http_url)
    assert gone.returncode != 0 and "no rlserve server answers" in gone.stderr
    assert "Traceback" not in down.stderr + gone.stderr


def test_resume_says_what_it_resumed_from(launch_server: Any) -> None:
    first = launch_server(*SMALL_PPO, "--checkpoint-every", "1")
    first.wait_for_weights()
    with PolicyClient(first.address, inference_mode="remote") as client:
        for seed in range(8):
            play_cartpole(client, seed=seed, max_steps=20)
    first.wait_until(lambda m: m["learner/updates"] >= 1, timeout=120, what="an update")
    assert first.stop() == 0
    steps = json.loads((first.run_folder / "server_state.json").read_text())["env_steps"]
    # Read before resuming: the resumed learner trains on the log's untrained steps and may
    # checkpoint again (the run keeps --checkpoint-every 1) before the line below is read.
    checkpoint = first.checkpoints[-1]
    second = launch_server(resume=first.run_folder)
    second.wait_for_weights()
    deadline = time.monotonic() + 60
    while "continues from" not in second.stdout() and time.monotonic() < deadline:
        time.sleep(0.1)
    out = second.stdout()
    assert f"resuming {first.run_folder}: {steps:,} env steps, 8 episodes completed" in out
    updates = int(checkpoint.stem.split("_")[1])
    assert f"the learner continues from {checkpoint} ({updates:,} updates)" in out


def test_episodes_never_ended_are_reported_once_with_the_fix(launch_server: Any) -> None:
    server = launch_server("--idle-timeout", "0.3", "--metrics-interval", "0.1")
    server.wait_for_weights()
    with PolicyClient(server.address, inference_mode="remote") as client:
        for _ in range(3):
            client.start_episode()
        server.wait_until(lambda m: m["episodes/timed_out"] >= 3, what="3 timed-out episodes")
    lines = [line for line in server.log().splitlines() if "never ended by end_episode" in line]
    # Rate-limited: the first at once, the others within the minute are held back.
    assert len(lines) == 1, server.log()
    assert "call end_episode(episode_id, observation)" in lines[0]
    assert "--idle-timeout" in lines[0]
