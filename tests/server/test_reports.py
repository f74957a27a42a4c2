"""Validation of reported fragments (``report_samples``) by :class:`FragmentChecker`."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.errors import LimitExceededError, SpaceError
from rlserve.protocol.limits import Limits
from rlserve.server.reports import FragmentChecker, check_summaries

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def fragment(steps: int = 4, **changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "episode_id": "e1",
        "obs": np.zeros((steps + 1, 3), np.float64),
        "actions": np.ones(steps, np.int32),
        "rewards": np.ones(steps, np.float64),
        "behaviour_logp": np.full(steps, -0.7),
        "policy_chosen": np.ones(steps, bool),
        "weights_version": np.full(steps, 2, np.int64),
        "terminated": True,
        "truncated": False,
    }
    return raw | changes


def checker(action_space: gym.Space[Any] | None = None) -> FragmentChecker:
    return FragmentChecker(OBS, action_space or gym.spaces.Discrete(3), "default", Limits())


def test_a_valid_fragment_comes_back_in_the_trained_dtypes() -> None:
    out = checker().check(fragment(), published_version=2, where="r")
    assert (out.obs.dtype, out.rewards.dtype, out.behaviour_logp.dtype) == (np.float32,) * 3
    assert out.actions.dtype == np.int64 and out.weights_version.dtype == np.int64
    assert out.terminated and len(out) == 4 and out.policy_id == "default"


def test_a_logged_action_has_an_unknown_log_probability_whatever_was_sent() -> None:
    chosen = np.array([True, False, True, True])
    logp = np.array([-0.7, 1e39, -0.7, -0.7])
    out = checker().check(fragment(policy_chosen=chosen, behaviour_logp=logp), 2, "r")
    assert np.isnan(out.behaviour_logp[1]) and not np.isnan(out.behaviour_logp[[0, 2, 3]]).any()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"behaviour_logp": np.array([-0.7, -1e30, -0.7, -0.7])}, "behaviour_logp"),
        ({"actions": np.array([0, 1, -1, 0])}, "choice indices 0..2"),
        ({"actions": np.array([0, 1, 3, 0])}, "choice indices 0..2"),
        ({"weights_version": np.array([2, 2, 3, 2])}, "not versions this server published"),
        ({"weights_version": np.array([2, -1, 2, 2])}, "not versions this server published"),
        ({"obs": np.full((5, 3), 1.5)}, "outside Box"),
        ({"rewards": np.array([1.0, 3e38, 1.0, 1.0])}, "rewards"),
        ({"obs": np.zeros((4, 3))}, "shape \\(5, 3\\)"),
    ],
    ids=[
        "logp",
        "negative-action",
        "action-n",
        "future-version",
        "negative-version",
        "bounds",
        "reward",
        "obs-shape",
    ],
)
def test_bad_fragments_are_refused_with_the_field_named(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpaceError, match=message):
        checker().check(fragment(**changes), published_version=2, where="r.fragments[0]")


def test_an_unbounded_box_and_box_actions() -> None:
    unbounded = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    box_actions = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    check = FragmentChecker(unbounded, box_actions, "p", Limits()).check
    out = check(fragment(obs=np.full((5, 3), 1e6), actions=np.zeros((4, 2))), 2, "r")
    assert out.actions.dtype == np.float32 and out.actions.shape == (4, 2)


MIXED = gym.spaces.Dict(
    {
        "gear": gym.spaces.MultiDiscrete([3, 2], start=[1, 0]),
        "lights": gym.spaces.MultiBinary(2),
        "steer": gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
    }
)


def test_structured_actions_are_reported_in_the_flat_layout() -> None:
    # gear (2 choice-index columns), lights (2 bits), steer (1 value): 5 float columns.
    actions = np.array([[0, 1, 1, 0, 0.25], [2, 0, 0, 1, -3.0]], np.float64)
    out = checker(MIXED).check(fragment(2, actions=actions), 2, "r")
    assert out.actions.dtype == np.float32 and out.actions.shape == (2, 5)
    ints = checker(gym.spaces.MultiDiscrete([4, 4])).check(
        fragment(2, actions=np.array([[3, 0], [1, 2]], np.int64)), 2, "r"
    )
    np.testing.assert_array_equal(ints.actions, [[3, 0], [1, 2]])


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        (np.zeros((2, 4)), r"shape \(2, 5\)"),
        (np.array([[3, 1, 1, 0, 0.0], [0, 0, 0, 0, 0]]), "column 0 holds 3.0.*0..2"),
        (np.array([[0, 1, 0.5, 0, 0.0], [0, 0, 0, 0, 0]]), "column 2 holds 0.5.*0..1"),
        (np.array([[0, 1, 1, 0, np.nan], [0, 0, 0, 0, 0]]), "finite"),
    ],
)
def test_structured_actions_out_of_their_layout_are_refused(
    actions: np.ndarray, message: str
) -> None:
    with pytest.raises(SpaceError, match=message):
        checker(MIXED).check(fragment(2, actions=actions), 2, "r")


@pytest.mark.parametrize("episode_id", [None, 7, ""], ids=repr)
def test_a_missing_non_string_or_empty_fragment_episode_id_is_a_bad_value(episode_id: Any) -> None:
    """Section 7.10 step 5.1: bad_value; only a length over max_id_length is limit_exceeded."""
    raw = fragment(episode_id=episode_id)
    if episode_id is None:
        del raw["episode_id"]
    with pytest.raises(SpaceError, match=r"^r: 'episode_id' must be a non-empty string$"):
        checker().check(raw, 2, "r")


def test_a_fragment_episode_id_over_the_length_limit_is_limit_exceeded() -> None:
    with pytest.raises(LimitExceededError, match="'episode_id' has 129 characters; the limit"):
        checker().check(fragment(episode_id="x" * 129), 2, "r")


SUMMARY = {"episode_id": "e1", "return": 3.0, "length": 3}


def test_a_summary_reason_sent_as_nil_is_the_default() -> None:
    """Section 3.2: nil and absent are the same, here too."""
    (absent,) = check_summaries([SUMMARY], Limits(), "r")
    (nil,) = check_summaries([{**SUMMARY, "reason": None}], Limits(), "r")
    assert nil == absent and nil.reason == "terminated"


def test_a_summary_tells_an_untrained_episode_and_nothing_but_a_boolean() -> None:
    """``training_enabled``: absent or nil is true; false marks steps that travel in no fragment."""
    (absent,) = check_summaries([SUMMARY], Limits(), "r")
    (nil,) = check_summaries([{**SUMMARY, "training_enabled": None}], Limits(), "r")
    (untrained,) = check_summaries([{**SUMMARY, "training_enabled": False}], Limits(), "r")
    assert absent.training_enabled and nil.training_enabled and not untrained.training_enabled
    with pytest.raises(SpaceError, match=r"episodes\[0\]: 'training_enabled' must be a boolean"):
        check_summaries([{**SUMMARY, "training_enabled": 0}], Limits(), "r")


@pytest.mark.parametrize("reason", ["", "done", 3], ids=repr)
def test_an_unknown_summary_reason_is_refused(reason: Any) -> None:
    with pytest.raises(SpaceError, match=r"episodes\[0\]: unknown reason"):
        check_summaries([{**SUMMARY, "reason": reason}], Limits(), "r")


def test_reported_infos_are_kept_and_checked() -> None:
    infos = [{"lives": 3}, None, {}, {"pos": [1, 2]}]
    out = checker().check(fragment(infos=infos), 2, "r")
    assert out.infos == infos
    assert checker().check(fragment(), 2, "r").infos is None
    with pytest.raises(SpaceError, match="'infos' must be a list of 4 maps or nils"):
        checker().check(fragment(infos=infos[:3]), 2, "r")
    with pytest.raises(SpaceError, match=r"'infos'\[1\] must be a map or nil"):
        checker().check(fragment(infos=[None, 1, None, None]), 2, "r")
    small = FragmentChecker(OBS, gym.spaces.Discrete(3), "default", Limits(max_info_bytes=16))
    with pytest.raises(LimitExceededError, match=r"r.infos\[0\]: info is"):
        small.check(fragment(infos=[{"a": "x" * 40}, None, None, None]), 2, "r")


def test_a_memory_policys_fragment_keeps_its_state_in() -> None:
    state = np.arange(6, dtype=np.float64) / 10
    out = checker().check(fragment(state_in=state), 2, "r", state_size=6)
    assert out.state_in is not None and out.state_in.dtype == np.float32
    np.testing.assert_allclose(out.state_in, state)
    assert checker().check(fragment(), 2, "r").state_in is None


@pytest.mark.parametrize(
    ("state_in", "state_size", "message"),
    [
        (np.zeros(4), 6, "'state_in' has 4 values; policy 'default' has a recurrent state of 6"),
        (None, 6, "has memory (a recurrent state of 6 values) but the fragment has no"),
        (np.zeros(6), 0, "'state_in' has 6 values but policy 'default' has no memory"),
    ],
)
def test_a_state_in_that_does_not_fit_the_policy_is_refused(
    state_in: Any, state_size: int, message: str
) -> None:
    raw = fragment() if state_in is None else fragment(state_in=state_in)
    with pytest.raises(SpaceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checker().check(raw, 2, "r.fragments[0]", state_size=state_size)
