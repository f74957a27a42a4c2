"""The training driver on a deterministic toy learner: routing, update order, publication,
log positions, checkpoints and unknown policies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlserve.learners.base import Learner
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment
from rlserve.run.checkpoints import checkpoints_in, trained_through_of
from rlserve.training.driver import TrainingDriver
from rlserve.training.policy_learner import PolicyLearner


class Toy(Learner):
    """Updates once per ``batch`` buffered steps, oldest first; remembers what it trained on."""

    def __init__(self, batch: int):
        self.batch = batch
        self.buffer: list[Fragment] = []
        self.trained: list[str] = []
        self._version = 0
        self._counters = {"updates": 0}

    def ingest(self, fragments: list[Fragment]) -> None:
        self.buffer += fragments

    @property
    def buffered_steps(self) -> int:
        return sum(len(f) for f in self.buffer)

    @property
    def sample_steps(self) -> int:
        return self.batch

    def ready(self) -> bool:
        return self.buffered_steps >= self.batch

    def update(self) -> dict[str, float]:
        taken = 0
        while taken < self.batch:
            fragment = self.buffer.pop(0)
            self.trained.append(fragment.episode_id)
            taken += len(fragment)
        self._version += 1
        self._counters["updates"] += 1
        return {"steps": float(taken)}

    def weights(self) -> WeightsPackage:
        raise AssertionError("the driver never builds weights itself")

    def counters(self) -> dict[str, int]:
        return dict(self._counters, version=self._version)

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        path.write_text(json.dumps({"counters": self.counters(), "extra": extra}))

    def load(self, path: Path) -> dict[str, Any]:
        raise AssertionError("not used")

    def initialise_from(self, path: Path) -> None:
        raise AssertionError("not used")


def fragment(policy_id: str, episode_id: str, steps: int = 2) -> Fragment:
    return Fragment(
        episode_id=episode_id,
        agent_id="agent0",
        policy_id=policy_id,
        obs=np.zeros((steps + 1, 1), np.float32),
        actions=np.zeros(steps, np.int64),
        rewards=np.zeros(steps, np.float32),
        behaviour_logp=np.zeros(steps, np.float32),
        policy_chosen=np.ones(steps, bool),
        weights_version=np.zeros(steps, np.int64),
        terminated=False,
        truncated=False,
    )


class Recorder:
    """The driver's hooks, recording what they are handed."""

    def __init__(self) -> None:
        self.published: list[tuple[str, int, dict[str, float], int]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.unknown: list[str] = []

    def publish(self, policy: PolicyLearner, metrics: dict[str, float]) -> None:
        self.published.append((policy.policy_id, policy.learner.version, metrics, policy.settled))


def driver_of(
    batches: dict[str, int], tmp_path: Path | None = None, **options: Any
) -> tuple[TrainingDriver, Recorder, dict[str, Toy]]:
    toys = {pid: Toy(batch) for pid, batch in batches.items()}
    if tmp_path is None:
        policies = {pid: PolicyLearner.in_process(pid, toy) for pid, toy in toys.items()}
    else:
        policies = {
            pid: PolicyLearner(
                {"policy_id": pid, "checkpoint_dir": str(tmp_path / pid)}, toy, {}, 1
            )
            for pid, toy in toys.items()
        }
        for pid in toys:
            (tmp_path / pid).mkdir()
    hooks = Recorder()
    driver = TrainingDriver(
        policies,
        hooks.publish,
        hooks.checkpoints.append,
        on_unknown=hooks.unknown.append,
        **options,
    )
    return driver, hooks, toys


def test_fragments_go_to_their_policy_in_order_and_unknown_ones_are_counted_once() -> None:
    driver, hooks, toys = driver_of({"a": 100, "b": 100})
    driver.take(
        [fragment("a", "a1"), fragment("x", "x1", 3), fragment("b", "b1"), fragment("a", "a2")]
    )
    # Nothing reaches a learner before ingest: each policy gets its share in one hand-off.
    assert toys["a"].buffer == [] and toys["b"].buffer == []
    driver.take([fragment("x", "x2", 4), fragment("y", "y1")])
    driver.ingest()
    assert [f.episode_id for f in toys["a"].buffer] == ["a1", "a2"]
    assert [f.episode_id for f in toys["b"].buffer] == ["b1"]
    assert hooks.unknown == ["x", "y"]
    assert driver.unknown_steps == {"x": 7, "y": 2}


def test_ready_policies_update_in_turn_and_each_update_is_published() -> None:
    driver, hooks, toys = driver_of({"a": 2, "b": 4})
    driver.take([fragment("a", f"a{i}") for i in range(2)] + [fragment("b", "b0", 4)])
    driver.ingest()
    assert driver.train() == ["a", "b"]
    # One update per ready policy per pass: a, b, then a again (b is no longer ready).
    assert [(pid, version) for pid, version, _, _ in hooks.published] == [
        ("a", 1),
        ("b", 1),
        ("a", 2),
    ]
    assert [metrics for _, _, metrics, _ in hooks.published] == [
        {"steps": 2.0},
        {"steps": 4.0},
        {"steps": 2.0},
    ]
    assert toys["a"].trained == ["a0", "a1"] and toys["b"].trained == ["b0"]
    assert driver.train() == []  # nothing left that is ready


def test_a_round_stops_at_the_update_bound_and_the_rest_waits_for_the_next() -> None:
    driver, hooks, toys = driver_of({"a": 2, "b": 2}, max_updates_per_round=2)
    driver.take([fragment("a", f"a{i}") for i in range(5)] + [fragment("b", "b0")])
    driver.ingest()
    assert driver.train() == ["a", "b"]
    assert toys["a"].counters()["updates"] == 2 and toys["a"].buffered_steps == 6
    assert driver.train() == ["a"]
    assert toys["a"].counters()["updates"] == 4 and toys["b"].counters()["updates"] == 1
    assert len(hooks.published) == 5


def test_an_interruption_ends_the_round_after_the_current_update() -> None:
    driver, hooks, _ = driver_of({"a": 2, "b": 2})
    driver.take([fragment(pid, f"{pid}{i}") for i in range(3) for pid in "ab"])
    driver.ingest()
    asked: list[int] = []

    def interrupted() -> bool:
        asked.append(len(hooks.published))
        return len(hooks.published) == 3

    assert driver.train(interrupted) == ["a", "b"]
    assert asked == [1, 2, 3]
    assert [pid for pid, *_ in hooks.published] == ["a", "b", "a"]


def test_log_positions_settle_once_nothing_read_waits_and_skip_what_was_trained() -> None:
    driver, hooks, toys = driver_of({"a": 4, "b": 2})
    driver.take([fragment("a", "a1")], seq=1)
    driver.take([fragment("b", "b1")], seq=2)
    driver.ingest(through=2, log_steps=4)
    # b's batch is not trained yet, nor a's: neither has the log in its weights.
    assert (driver.policies["a"].settled, driver.policies["b"].settled) == (0, 0)
    driver.train()
    assert hooks.published == [("b", 1, {"steps": 2.0}, 2)]  # settled before it is published
    assert driver.trained_through == 0  # a still holds record 1's steps
    driver.take([fragment("a", "a3")], seq=3)
    driver.ingest(through=3, log_steps=2)
    assert driver.policies["b"].settled == 3  # nothing of b waits: settled as it reads
    driver.train()
    assert driver.trained_through == 3 and driver.log_steps == 6
    # A restarted reader goes back to the lowest position; what a policy trained is skipped.
    driver.restart_at(1)
    driver.take([fragment("a", "again")], seq=1)
    driver.take([fragment("a", "new")], seq=4)
    driver.ingest(through=4)
    assert [f.episode_id for f in toys["a"].buffer] == ["new"]


def test_fragments_from_no_log_are_never_skipped() -> None:
    driver, _, toys = driver_of({"a": 100})
    driver.restart_at(5)
    driver.take([fragment("a", "a1")])
    driver.ingest()
    assert [f.episode_id for f in toys["a"].buffer] == ["a1"]
    assert driver.position == 5


def test_checkpoints_every_n_updates_again_for_idle_policies_and_on_request(
    tmp_path: Path,
) -> None:
    driver, hooks, _ = driver_of({"a": 2, "b": 2}, tmp_path, checkpoint_every=2)
    driver.take([fragment("b", "b0")], seq=1)
    driver.take([fragment("a", f"a{i}") for i in range(2)], seq=2)
    driver.ingest(through=2)
    driver.train()
    # a's second update: its checkpoint, then b's again (b trained past its own checkpoint).
    reasons = [(m["policy_id"], m["reason"], m["trained_through"]) for m in hooks.checkpoints]
    assert reasons == [("a", "interval", 2), ("b", "idle", 2)]
    assert trained_through_of(checkpoints_in(tmp_path / "a")[-1]) == 2
    saved = json.loads(checkpoints_in(tmp_path / "a")[-1].read_text())
    assert saved["counters"]["updates"] == 2 and saved["extra"]["reason"] == "interval"
    hooks.checkpoints.clear()
    driver.save_all("request")
    assert [(m["policy_id"], m["reason"]) for m in hooks.checkpoints] == [
        ("a", "request"),
        ("b", "request"),
    ]
    assert [p.name for p in checkpoints_in(tmp_path / "a")] == ["ckpt_0000002.pt"]
    assert [p.name for p in checkpoints_in(tmp_path / "b")] == ["ckpt_0000001.pt"]


def test_a_policy_without_a_checkpoint_folder_is_not_checkpointed_by_the_driver() -> None:
    driver, _, _ = driver_of({"a": 2})
    with pytest.raises(RuntimeError, match="no checkpoint folder"):
        driver.save_all("request")
