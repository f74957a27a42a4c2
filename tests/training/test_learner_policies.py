"""One learner process hosting several policies: each has its own learner, versions and
checkpoints; a frozen one never updates; ``init_checkpoint`` loads; a restarted learner trains
every logged step once per policy.

The learner process is real (spawned as the server spawns it) and reads a real experience log;
the test plays the server's end of its socket.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from learner_support import Learner

from rlserve.config.fields import to_table
from rlserve.learners.ppo import PPOLearner, PPOSettings
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.spaces import describe
from rlserve.run.checkpoints import checkpoints_in, trained_through_of
from rlserve.run.experience_log import ExperienceLog, encode_payload
from rlserve.server.policies import policy_paths

pytestmark = pytest.mark.timeout(240)

OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = spaces.Discrete(2)
STEPS = 16
"""Steps per fragment; two fragments make one batch."""
PPO = PPOSettings(
    train_batch_size=2 * STEPS,
    minibatch_size=STEPS,
    num_epochs=1,
    hidden=(8,),
    device="cpu",
    max_policy_lag=1000,  # every logged step is fresh, so every one is trained
)


def policy_setup(run: Path, policy_id: str, index: int, **more: Any) -> dict[str, Any]:
    return {
        "policy_id": policy_id,
        "ppo": {**to_table(PPO), "seed": index},
        "observation_space": describe(OBS),
        "action_space": describe(ACT),
        "frozen": False,
        "init_checkpoint": None,
        "checkpoint_dir": str(policy_paths(run, policy_id, flat=False).checkpoints),
        **more,
    }


def fragment(policy_id: str, seed: int) -> Fragment:
    rng = np.random.default_rng(seed)
    return Fragment(
        episode_id=f"e{seed}",
        agent_id="agent0",
        policy_id=policy_id,
        obs=rng.uniform(-1, 1, (STEPS + 1, 3)).astype(np.float32),
        actions=rng.integers(0, 2, STEPS),
        rewards=rng.normal(size=STEPS).astype(np.float32),
        behaviour_logp=np.full(STEPS, np.log(0.5), np.float32),
        policy_chosen=np.ones(STEPS, bool),
        weights_version=np.zeros(STEPS, np.int64),
        terminated=False,
        truncated=False,
    )


def is_(kind: str, policy_id: str, **fields: Any) -> Callable[[dict[str, Any]], bool]:
    def check(message: dict[str, Any]) -> bool:
        return (
            message["type"] == kind
            and message.get("policy_id") == policy_id
            and all(message.get(k) == v for k, v in fields.items())
        )

    return check


def append(log: ExperienceLog, *fragments: Fragment) -> int:
    """Log each fragment as one record (as remote episodes are); return the last seq."""
    for f in fragments:
        log.append("fragments", len(f), encode_payload([f.to_wire()]))
    return log.last_seq


def test_policies_train_apart_a_frozen_one_never_and_init_checkpoint_loads(
    tmp_path: Path,
) -> None:
    init_path = tmp_path / "other-run" / "ckpt_0000009.pt"
    init_path.parent.mkdir()
    donor = PPOLearner(OBS, ACT, PPOSettings(**{**PPO.__dict__, "seed": 99}))
    donor.save(init_path, {"trained_through": 12345})
    log = ExperienceLog(tmp_path / "experience")
    log.open()
    learner = Learner(
        tmp_path,
        [
            policy_setup(tmp_path, "red", 0),
            policy_setup(tmp_path, "blue", 1),
            policy_setup(tmp_path, "fixed", 2, frozen=True, init_checkpoint=str(init_path)),
        ],
        published={},
    )
    try:
        ready = learner.wait_for(lambda m: m["type"] == "ready", "ready")
        assert ready["policies"]["fixed"]["initialised_from"] == str(init_path)
        assert ready["policies"]["fixed"]["frozen"] is True
        first = {
            pid: learner.wait_for(is_("weights", pid), f"{pid}'s first weights")
            for pid in ("red", "blue", "fixed")
        }
        assert {pid: m["package"]["version"] for pid, m in first.items()} == {
            "red": 0,
            "blue": 0,
            "fixed": 0,
        }
        # The frozen policy serves the donor's actor: loaded, and not its own fresh one.
        for name, array in donor.weights().arrays.items():
            np.testing.assert_array_equal(first["fixed"]["package"]["arrays"][name], array)
        assert not np.array_equal(
            first["fixed"]["package"]["arrays"]["actor.0.weight"],
            first["blue"]["package"]["arrays"]["actor.0.weight"],
        )
        # Red gets a batch; blue half of one; the frozen policy three fragments (skipped).
        through = append(
            log,
            fragment("red", 1),
            fragment("blue", 2),
            fragment("fixed", 3),
            fragment("red", 4),
            fragment("fixed", 5),
            fragment("fixed", 6),
        )
        learner.send({"type": "available", "through": through})
        red_v1 = learner.wait_for(
            lambda m: is_("weights", "red")(m) and m["package"]["version"] == 1, "red v1"
        )
        assert red_v1["metrics"]["learner/steps_trained"] == 2 * STEPS
        red_ckpt = learner.wait_for(is_("checkpointed", "red", reason="interval"), "red's ckpt")
        assert Path(red_ckpt["path"]) == tmp_path / "policies/red/checkpoints/ckpt_0000001.pt"
        assert red_ckpt["trained_through"] == through
        # The frozen policy settled as far as the log goes: checkpointed again (idle), so the
        # log's clean-up is not held back by it; blue still holds half a batch: not settled.
        idle = learner.wait_for(is_("checkpointed", "fixed", reason="idle"), "fixed's ckpt")
        assert idle["trained_through"] == through
        assert not learner.of("checkpointed", "blue")
        # Blue's batch completes with the next fragment: its own version 1.
        through = append(log, fragment("blue", 7))
        learner.send({"type": "available", "through": through})
        blue_v1 = learner.wait_for(
            lambda m: is_("weights", "blue")(m) and m["package"]["version"] == 1, "blue v1"
        )
        assert blue_v1["metrics"]["learner/steps_trained"] == 2 * STEPS
        learner.send({"type": "stop"})
        for pid in ("red", "blue", "fixed"):
            learner.wait_for(is_("checkpointed", pid, reason="shutdown"), f"{pid}'s final ckpt")
        learner.process.join(60)
        assert learner.process.exitcode == 0
    finally:
        learner.kill()
        log.close()
    # Frozen: one publication ever, no update, its steps counted as skipped.
    assert len(learner.of("weights", "fixed")) == 1
    fixed = learner.latest_metrics("fixed")
    assert fixed["learner/updates"] == 0
    assert fixed["learner/steps_skipped_frozen"] == 3 * STEPS
    assert learner.latest_metrics("red")["learner/steps_skipped_frozen"] == 0
    # Each policy's checkpoints in its own folder; nothing in the single-policy places.
    for pid, updates in (("red", 1), ("blue", 1), ("fixed", 0)):
        folder = tmp_path / "policies" / pid / "checkpoints"
        assert checkpoints_in(folder)[-1].name == f"ckpt_{updates:07d}.pt"
    assert not (tmp_path / "checkpoints").exists()


def test_a_restarted_learner_trains_each_logged_step_once_per_policy(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path / "experience")
    log.open()
    policies = [policy_setup(tmp_path, "red", 0), policy_setup(tmp_path, "blue", 1)]
    first = Learner(tmp_path, policies, published={})
    try:
        first.wait_for(lambda m: m["type"] == "ready", "ready")
        through = append(log, fragment("red", 1), fragment("red", 2))
        first.send({"type": "available", "through": through})
        first.wait_for(is_("checkpointed", "red", trained_through=2), "red's first ckpt")
        # Blue had nothing: saved as idle, settled at 2.
        first.wait_for(is_("checkpointed", "blue", trained_through=2), "blue's idle ckpt")
        # Blue gets half a batch (it stays settled at 2), red a whole one (settles at 5).
        through = append(log, fragment("blue", 3), fragment("red", 4), fragment("red", 5))
        first.send({"type": "available", "through": through})
        first.wait_for(is_("checkpointed", "red", trained_through=5), "red's second ckpt")
        assert first.of("weights", "red")[-1]["package"]["version"] == 2
        assert [m["package"]["version"] for m in first.of("weights", "blue")] == [0]
        versions = {"red": 2, "blue": 0}  # what the server serves when the learner dies
    finally:
        first.kill()  # a crash: no final checkpoint
    red_kept = checkpoints_in(tmp_path / "policies/red/checkpoints")
    blue_kept = checkpoints_in(tmp_path / "policies/blue/checkpoints")
    assert [trained_through_of(p) for p in red_kept] == [2, 5]
    assert [trained_through_of(p) for p in blue_kept] == [2]

    second = Learner(tmp_path, policies, published=versions)
    try:
        ready = second.wait_for(lambda m: m["type"] == "ready", "ready")
        assert ready["policies"]["red"]["trained_through"] == 5
        assert ready["policies"]["blue"]["trained_through"] == 2
        # Reads on from 2: blue takes record 3 again (not in its weights), red skips 4 and 5.
        through = append(log, fragment("blue", 6), fragment("red", 7), fragment("red", 8))
        second.send({"type": "available", "through": through})
        blue_v1 = second.wait_for(is_("weights", "blue"), "blue's first update")
        red_v3 = second.wait_for(is_("weights", "red"), "red's third update")
        consumed = second.wait_for(
            lambda m: m["type"] == "consumed" and m["through"] == through, "the read"
        )
        second.send({"type": "stop"})
        for pid in ("red", "blue"):
            second.wait_for(is_("checkpointed", pid, reason="shutdown"), f"{pid}'s final ckpt")
    finally:
        second.kill()
        log.close()
    # The versions go on from the served ones; nothing was published again at the start.
    assert blue_v1["package"]["version"] == 1
    assert red_v3["package"]["version"] == 3
    assert len(second.of("weights", "red")) == len(second.of("weights", "blue")) == 1
    # Each logged step trained exactly once per policy across the crash: red 6 fragments of
    # its own (1, 2, 4, 5, 7, 8), blue 2 (3, 6).
    red, blue = second.latest_metrics("red"), second.latest_metrics("blue")
    assert (red["learner/updates"], red["learner/steps_trained"]) == (3, 6 * STEPS)
    assert (blue["learner/updates"], blue["learner/steps_trained"]) == (1, 2 * STEPS)
    assert red["learner/steps_consumed"] == 6 * STEPS
    assert blue["learner/steps_consumed"] == 2 * STEPS
    # And the process read every logged step once in the lineage of the weights.
    assert consumed["steps_consumed"] == 8 * STEPS
