"""``--callbacks module:Class`` on ``rlserve serve`` (periodic results) and ``rlserve train``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rlserve import PolicyClient

ROOT = Path(__file__).parents[2]

PROBE = '''
import json, os
from rlserve.algorithm import Callbacks


class Probe(Callbacks):
    """Writes one JSON line per event into $PROBE_FILE."""

    def _write(self, **event):
        with open(os.environ["PROBE_FILE"], "a") as out:
            out.write(json.dumps(event) + "\\n")

    def on_algorithm_init(self, *, algorithm, **kwargs):
        self._write(event="init")

    def on_train_result(self, *, algorithm, result, **kwargs):
        self._write(event="result", iteration=result["training_iteration"],
                    steps=result["env_runners"]["num_env_steps_sampled"])

    def on_episode_end(self, *, algorithm, episode, **kwargs):
        self._write(event="episode", source=episode.source, length=episode.length)

    def on_checkpoint(self, *, algorithm, path, policy_id, version, **kwargs):
        self._write(event="checkpoint", path=path, policy_id=policy_id, version=version)

    def on_algorithm_stop(self, *, algorithm, **kwargs):
        self._write(event="stop")
'''


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable module ``probe_callbacks`` whose Probe writes events to the returned file."""
    (tmp_path / "probe_callbacks.py").write_text(textwrap.dedent(PROBE))
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("PROBE_FILE", str(events))
    paths = [str(tmp_path), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    return events


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events written so far: whole lines only (the server may be writing the last one)."""
    if not path.exists():
        return []
    whole = path.read_text().rpartition("\n")[0]
    return [json.loads(line) for line in whole.splitlines()]


@pytest.mark.timeout(240)
def test_serve_tells_episodes_periodic_results_and_checkpoints(
    launch_server: Any, probe: Path
) -> None:
    server = launch_server(
        "--callbacks", "probe_callbacks:Probe", "--checkpoint-every", "2",
        "--ppo-train-batch-size", "256", "--ppo-minibatch-size", "128",
        "--ppo-num-epochs", "1",
    )  # fmt: skip
    env = gym.make("CartPole-v1")
    deadline = time.monotonic() + 180
    with PolicyClient(server.address, "remote") as client:
        episode = 0
        while not any(e["event"] == "result" for e in read_events(probe)):
            assert time.monotonic() < deadline, server.log()[-3000:]
            obs, _ = env.reset(seed=episode)
            episode += 1
            episode_id = client.start_episode()
            over = False
            while not over:
                obs, reward, terminated, truncated, _ = env.step(client.get_action(episode_id, obs))
                client.log_returns(episode_id, float(reward))
                over = terminated or truncated
            client.end_episode(episode_id, obs, truncated=not terminated)
    assert server.stop() == 0, server.log()[-3000:]
    events = read_events(probe)
    names = [e["event"] for e in events]
    assert names[0] == "init" and names[-1] == "stop" and names.count("stop") == 1
    episodes = [e for e in events if e["event"] == "episode"]
    assert len(episodes) >= episode - 1  # the last one may end after the result
    assert {e["source"] for e in episodes} == {episodes[0]["source"]}
    assert episodes[0]["source"].startswith("client-")
    (first, *_) = [e for e in events if e["event"] == "result"]
    assert first["iteration"] == 1 and first["steps"] > 0
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    assert checkpoints and Path(checkpoints[-1]["path"]).is_file()  # older ones are pruned
    assert all(Path(c["path"]).parent == server.run_folder / "checkpoints" for c in checkpoints)
    assert all(c["policy_id"] == "default" for c in checkpoints)
    assert [c["version"] for c in checkpoints] == sorted(c["version"] for c in checkpoints)
    assert "Probe" in (server.run_folder / "config.toml").read_text()


@pytest.mark.timeout(200)
def test_train_tells_its_callbacks(tmp_path: Path, probe: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "rlserve.cli", "train", "--env", "CartPole-v1",
            "--stop-steps", "512", "--iteration-steps", "256", "--num-envs", "2",
            "--run-dir", str(tmp_path), "--name", "t", "--no-progress",
            "--callbacks", "probe_callbacks:Probe",
        ],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = [e["event"] for e in read_events(probe)]
    assert names[0] == "init" and names[-1] == "stop"
    assert names.count("result") >= 1 and "episode" in names and "checkpoint" in names


def test_a_callbacks_class_that_cannot_be_imported_is_one_clear_line(
    run_rlserve: Any,
) -> None:
    proc = run_rlserve("train", "--env", "CartPole-v1", "--callbacks", "nowhere_to_be_found:Thing")
    assert proc.returncode == 2, proc.stderr
    assert "cannot be imported" in proc.stderr and "Traceback" not in proc.stderr
