"""One metric stream for served and hosted runs: the same names in TensorBoard and
``progress.csv``, read back from the files; ``rlserve status`` of a finished or hosted run; and
the real ``GET /metrics`` by the Prometheus conventions."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from e2e_support import play_cartpole
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlserve import PolicyClient, PPOConfig
from rlserve.run.progress_file import PROGRESS_COLUMNS, PROGRESS_FILE, read_progress

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

METRICS_DOC = Path(__file__).parents[2] / "docs" / "metrics.md"
SMALL_PPO = (
    "--ppo-train-batch-size", "64", "--ppo-minibatch-size", "32", "--ppo-num-epochs", "1",
    "--fragment-length", "16", "--metrics-interval", "0.2", "--no-progress",
)  # fmt: skip
SHARED = {
    "episodes/return_mean",
    "episodes/return_min",
    "episodes/return_max",
    "episodes/length_mean",
    "episodes/completed",
    "samples/env_steps",
    "samples/env_steps_per_second",
    "learner/updates",
    "learner/steps_trained",
    "learner/weights_version",
    "learner/policy_loss",
    "learner/value_loss",
    "learner/entropy",
    "learner/approx_kl",
    "learner/update_seconds",
}
"""Quantities both kinds of run have (a served run's learner has updated at least once)."""


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(folder)).Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def _documented() -> tuple[set[str], set[str]]:
    """The served names (the tables' rows) and the names only hosted runs write."""
    text = METRICS_DOC.read_text()
    served = set(re.findall(r"^\| `([a-z_]+/[a-z_0-9]+)` \|", text, re.M))
    hosted = text.partition("## Hosted runs")[2].partition("And these")[2]
    return served, set(re.findall(r"^- `([a-z_]+/[a-z_]+)`:", hosted, re.M))


def _served_run(launch_server: Any) -> Path:
    server = launch_server(*SMALL_PPO, "--seed", "4")
    server.wait_for_weights()
    with PolicyClient(server.address, inference_mode="remote") as client:
        for seed in range(6):
            play_cartpole(client, seed=seed, max_steps=20)
    server.wait_until(lambda m: m["learner/updates"] >= 1, timeout=120, what="an update")
    assert server.stop() == 0
    folder: Path = server.run_folder
    return folder


def _hosted_run(tmp_path: Path) -> Path:
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2)
        .training(train_batch_size=128, minibatch_size=64, num_epochs=1)
        .training(min_env_steps_per_iteration=128, model={"fcnet_hiddens": [16]})
        .resources(device="cpu")
        .debugging(seed=4)
        .reporting(run_dir=str(tmp_path / "runs"), name="hosted", progress=False)
    )
    with config.build() as algo:
        for _ in range(3):
            algo.train()
        steps = algo.env_steps_sampled
    folder = tmp_path / "runs" / "hosted"
    assert _scalars(folder)["samples/env_steps"][-1] == (steps, float(steps))
    return folder


def test_served_and_hosted_runs_write_the_same_names(
    launch_server: Any, run_rlserve: Any, tmp_path: Path
) -> None:
    served_folder = _served_run(launch_server)
    hosted_folder = _hosted_run(tmp_path)
    served, hosted = _scalars(served_folder), _scalars(hosted_folder)
    assert set(served) >= SHARED, SHARED - set(served)
    assert set(hosted) >= SHARED, SHARED - set(hosted)
    # Each name a hosted run shares with the served tables is one the served run writes, and
    # the hosted run's other names are the doc's hosted-only list.
    served_names, hosted_only = _documented()
    assert set(hosted) & served_names <= set(served), (set(hosted) & served_names) - set(served)
    assert set(hosted) - served_names == hosted_only, (set(hosted) - served_names) ^ hosted_only
    # Steps are the x axis of both.
    assert all(step == value for step, value in hosted["samples/env_steps"])
    assert all(step == value for step, value in served["samples/env_steps"])

    for folder in (served_folder, hosted_folder):
        header = (folder / PROGRESS_FILE).read_text().splitlines()[0]
        assert header == ",".join(PROGRESS_COLUMNS)
    hosted_rows = read_progress(hosted_folder)
    assert len(hosted_rows) == 3  # one per iteration
    assert hosted_rows[-1]["samples/env_steps"] == hosted["samples/env_steps"][-1][1]
    last = read_progress(served_folder)[-1]
    assert last["samples/env_steps"] == served["samples/env_steps"][-1][1]
    assert last["learner/updates"] is not None and last["learner/updates"] >= 1

    shown = run_rlserve("status", str(hosted_folder))
    assert shown.returncode == 0, shown.stderr
    assert "hosted, 3 reports" in shown.stdout
    assert f"{int(hosted_rows[-1]['samples/env_steps'] or 0):,} env steps" in shown.stdout
    done = run_rlserve("status", str(served_folder), "--json")
    assert done.returncode == 0, done.stderr
    assert '"state": "finished' in done.stdout and "--resume" in done.stdout


TWO_POLICIES = """\
[server]
fragment_length = 16

[policies.red]
spaces_from = "CartPole-v1"

[policies.blue]
spaces_from = "CartPole-v1"
"""


@pytest.fixture(scope="module")
def scraped(module_launcher: Any, tmp_path_factory: pytest.TempPathFactory) -> httpx.Response:
    """``GET /metrics`` of a real server with two policies, after a 5-step episode of ``red``."""
    config = tmp_path_factory.mktemp("config") / "two.toml"
    config.write_text(TWO_POLICIES)
    server = module_launcher("--no-progress", spaces=("--config", str(config)))
    with PolicyClient(server.address, inference_mode="remote", multiagent=False) as client:
        eid = client.start_episode(policy_id="red")
        obs = np.zeros(4, dtype=np.float32)
        for _ in range(5):
            client.get_action(eid, obs)
            client.log_returns(eid, 1.0)
        client.end_episode(eid, obs)
    return httpx.get(f"{server.http_url}/metrics", timeout=10)


def test_prometheus_endpoint_follows_the_conventions(scraped: httpx.Response) -> None:
    reply = scraped
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(reply.text)}
    typed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", reply.text, re.M))
    helped = set(re.findall(r"^# HELP (\S+) ", reply.text, re.M))
    for name, family in families.items():
        shown = name + "_total" if family.type == "counter" else name
        assert typed.get(shown, typed.get(name)) == family.type, name
        assert shown in helped or name in helped, name
        assert family.type in ("counter", "gauge")
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name == name + "_total"
            assert not re.search(r"_s$|_per_s$", sample.name), sample.name
    counters = {"episodes_completed", "samples_env_steps", "learner_updates", "server_errors"}
    for short in counters:
        assert families[f"rlserve_{short}"].type == "counter"
    assert families["rlserve_samples_env_steps"].samples[0].value == 5
    gauges = {"server_clients", "samples_steps_queued", "server_uptime_seconds"}
    for short in gauges:
        assert families[f"rlserve_{short}"].type == "gauge"
    by_policy = families["rlserve_policy_learner_updates"]
    assert by_policy.type == "counter"
    assert {s.labels["policy"] for s in by_policy.samples} == {"red", "blue"}
    assert not any(k.startswith("rlserve_policies_") for k in families)


def test_promtool_accepts_the_endpoint(scraped: httpx.Response) -> None:
    """Prometheus's own linter (Debian's ``prometheus`` package); skipped where it is missing."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input=scraped.text,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
