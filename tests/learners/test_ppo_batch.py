"""PPO's batch over a backlog past the step cap: built from the fragments it keeps, the same."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.learners.ppo import PPOLearner, PPOSettings
from rlserve.learners.ppo_batch import (
    TrainingBatch,
    batch_of_fragments,
    build_batch,
    fragments_within_cap,
)
from rlserve.protocol.fragment import Fragment

OBS_SPACE = spaces.Box(-1.0, 1.0, (3,), np.float32)
CPU = torch.device("cpu")
TOLERANCE = 1e-6
"""Absolute tolerance of float32 columns computed over batches of different sizes."""


def _settings(**overrides: Any) -> PPOSettings:
    values: dict[str, Any] = {
        "train_batch_size": 32,
        "minibatch_size": 16,
        "hidden": (16,),
        "device": "cpu",
        "seed": 0,
    }
    values.update(overrides)
    return PPOSettings(**values)


def _backlog(rng: np.random.Generator, count: int, newest: int) -> list[Fragment]:
    """``count`` fragments of 1-20 steps, of versions up to ``newest`` out of order, some of
    their steps logged (not chosen by the policy, or without a log-probability)."""
    fragments = []
    for index in range(count):
        steps = int(rng.integers(1, 21))
        version = int(rng.integers(max(0, newest - 4), newest + 1))
        chosen = rng.random(steps) > 0.2
        logp = np.where(rng.random(steps) > 0.1, -0.7, np.nan).astype(np.float32)
        fragments.append(
            Fragment(
                episode_id=f"e{index}",
                agent_id="agent0",
                policy_id="default",
                obs=rng.uniform(-1, 1, (steps + 1, 3)).astype(np.float32),
                actions=rng.integers(0, 2, steps).astype(np.int64),
                rewards=rng.normal(0, 1, steps).astype(np.float32),
                behaviour_logp=logp,
                policy_chosen=chosen,
                weights_version=np.full(steps, version, np.int64)
                - (rng.random(steps) < 0.3).astype(np.int64),
                terminated=bool(rng.random() < 0.5),
                truncated=False,
            )
        )
    return fragments


def _assert_same(trimmed: TrainingBatch, full: TrainingBatch) -> None:
    assert trimmed.tensors is not None and full.tensors is not None
    assert trimmed.tensors.keys() == full.tensors.keys()
    for name, column in full.tensors.items():
        np.testing.assert_allclose(
            trimmed.tensors[name].numpy(), column.numpy(), atol=TOLERANCE, err_msg=name
        )
    assert trimmed.steps_logged == full.steps_logged
    assert trimmed.steps_dropped_cap == full.steps_dropped_cap
    assert trimmed.excluded == full.excluded
    assert trimmed.stats.keys() == full.stats.keys()
    for name, value in full.stats.items():
        assert trimmed.stats[name] == pytest.approx(value, abs=TOLERANCE), name


@pytest.mark.parametrize("logged_steps", ["exclude", "bc", "on_policy"])
@pytest.mark.parametrize("seed", range(6))
def test_a_backlog_past_the_cap_gives_the_batch_of_every_fragment(
    logged_steps: str, seed: int
) -> None:
    cfg = _settings(logged_steps=logged_steps, max_policy_lag=3, truncated_traces=seed % 2 == 0)
    model = PPOLearner(OBS_SPACE, spaces.Discrete(2), cfg).model
    rng = np.random.default_rng(seed)
    fragments = _backlog(rng, 200, newest=9)
    version = 9
    args = (model, cfg, version, None, None, CPU)
    within = fragments_within_cap(fragments, cfg, version)
    assert within is not None, "the backlog was not trimmed: the test shows nothing"
    kept, _, left_out = within
    assert len(kept) < len(fragments) // 4 and left_out > 0
    _assert_same(build_batch(fragments, *args), batch_of_fragments(fragments, *args))


def test_a_batch_within_the_cap_is_not_trimmed() -> None:
    cfg = _settings()
    fragments = _backlog(np.random.default_rng(0), 3, newest=2)
    assert sum(len(f) for f in fragments) <= cfg.step_cap
    assert fragments_within_cap(fragments, cfg, 2) is None


def test_a_kept_fragment_whose_gae_overflows_makes_the_cap_choose_among_all() -> None:
    cfg = _settings()
    model = PPOLearner(OBS_SPACE, spaces.Discrete(2), cfg).model
    fragments = _backlog(np.random.default_rng(1), 100, newest=5)
    within = fragments_within_cap(fragments, cfg, 5)
    assert within is not None
    overflowing = within[0][-1]
    overflowing.rewards[:] = 3e38  # its GAE sums past float32's largest
    args = (model, cfg, 5, None, None, CPU)
    batch = build_batch(fragments, *args)
    assert batch.excluded, "the overflowing fragment was not left out"
    _assert_same(batch, batch_of_fragments(fragments, *args))
