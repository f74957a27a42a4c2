"""The replay buffer: n-step sums against hand-computed values, its bound, sampling, checkpoint."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch

from rlserve.learners.replay import ReplayBuffer, n_step_transitions
from rlserve.protocol.fragment import Fragment


def _fragment(steps: int, terminated: bool = False, start: float = 0.0) -> Fragment:
    obs = (start + np.arange(steps + 1, dtype=np.float32))[:, None].repeat(2, axis=1)
    return Fragment(
        episode_id="e",
        agent_id="agent0",
        policy_id="default",
        obs=obs,
        actions=np.arange(steps, dtype=np.int64) % 2,
        rewards=np.arange(1, steps + 1, dtype=np.float32),
        behaviour_logp=np.zeros(steps, np.float32),
        policy_chosen=np.ones(steps, bool),
        weights_version=np.zeros(steps, np.int64),
        terminated=terminated,
        truncated=False,
    )


def test_n_step_sums_next_obs_and_discounts_by_hand() -> None:
    # rewards 1, 2, 3, 4; gamma 0.5; n = 2; the episode terminates after the 4th step.
    obs = np.arange(5, dtype=np.float32)[:, None]
    returns, next_obs, discounts = n_step_transitions(
        obs, np.array([1, 2, 3, 4], np.float32), True, 0.5, 2
    )
    np.testing.assert_allclose(returns, [1 + 0.5 * 2, 2 + 0.5 * 3, 3 + 0.5 * 4, 4])
    np.testing.assert_array_equal(next_obs[:, 0], [2, 3, 4, 4])
    # t=2 reaches the terminal state after 2 steps, t=3 after 1: no bootstrap for either.
    np.testing.assert_allclose(discounts, [0.25, 0.25, 0.0, 0.0])


def test_a_cut_or_truncated_fragment_bootstraps_from_its_last_obs() -> None:
    obs = np.arange(4, dtype=np.float32)[:, None]
    returns, next_obs, discounts = n_step_transitions(
        obs, np.array([1, 1, 1], np.float32), False, 0.9, 3
    )
    np.testing.assert_allclose(returns, [1 + 0.9 + 0.81, 1 + 0.9, 1], rtol=1e-6)
    np.testing.assert_array_equal(next_obs[:, 0], [3, 3, 3])
    np.testing.assert_allclose(discounts, [0.9**3, 0.9**2, 0.9], rtol=1e-6)


def test_a_sum_stops_before_a_logged_action_and_bootstraps_there() -> None:
    # rewards 1..6, gamma 0.5, n = 3, terminated after step 5; the actions of steps 2 and 5 were
    # logged (log_action): a sum may start at one (its first action is the one taken) but not
    # run through one.
    chosen = np.array([True, True, False, True, True, False])
    returns, next_obs, discounts = n_step_transitions(
        np.arange(7, dtype=np.float32)[:, None],
        np.arange(1, 7, dtype=np.float32),
        True,
        0.5,
        3,
        chosen,
    )
    np.testing.assert_allclose(returns, [1 + 0.5 * 2, 2, 3 + 0.5 * 4 + 0.25 * 5, 4 + 0.5 * 5, 5, 6])
    np.testing.assert_array_equal(next_obs[:, 0], [2, 2, 5, 5, 5, 6])
    np.testing.assert_allclose(discounts, [0.25, 0.5, 0.125, 0.25, 0.5, 0.0])


def test_one_step_is_plain_td() -> None:
    obs = np.arange(3, dtype=np.float32)[:, None]
    returns, next_obs, discounts = n_step_transitions(
        obs, np.array([5, 7], np.float32), True, 0.99, 1
    )
    np.testing.assert_allclose(returns, [5, 7])
    np.testing.assert_array_equal(next_obs[:, 0], [1, 2])
    np.testing.assert_allclose(discounts, [0.99, 0.0])


def test_the_ring_keeps_only_the_newest_capacity_transitions() -> None:
    buffer = ReplayBuffer(5, 2, gamma=1.0, n_step=1, seed=0)
    assert buffer.add_fragment(_fragment(3, start=0)) == 3
    assert len(buffer) == 3
    buffer.add_fragment(_fragment(4, start=100))
    assert len(buffer) == 5 and buffer.added == 7
    state = buffer.state()
    # Oldest first: the last step of the first fragment went, then the 4 new ones.
    np.testing.assert_array_equal(state["obs"][:, 0], [1, 2, 100, 101, 102, 103][-5:])
    one_big = ReplayBuffer(3, 2, gamma=1.0, seed=0)
    one_big.add_fragment(_fragment(10))
    assert len(one_big) == 3
    np.testing.assert_array_equal(one_big.state()["obs"][:, 0], [7, 8, 9])


def test_sampling_is_seeded_and_within_what_is_stored() -> None:
    a = ReplayBuffer(100, 2, gamma=0.9, seed=3)
    b = ReplayBuffer(100, 2, gamma=0.9, seed=3)
    for buffer in (a, b):
        buffer.add_fragment(_fragment(20))
    batch_a, batch_b = a.sample(16), b.sample(16)
    np.testing.assert_array_equal(batch_a.indices, batch_b.indices)
    assert batch_a.indices.max() < 20
    np.testing.assert_array_equal(batch_a.obs[:, 0], batch_a.indices)
    np.testing.assert_array_equal(batch_a.next_obs[:, 0], batch_a.indices + 1)
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(4, 2, gamma=0.9).sample(1)


def test_box_actions_are_stored_as_float_rows() -> None:
    buffer = ReplayBuffer(8, 1, gamma=0.9, action_shape=(2,))
    buffer.add(
        np.zeros((3, 1), np.float32), np.ones((2, 2), np.float32), np.ones(2, np.float32), False
    )
    assert buffer.sample(4).actions.shape == (4, 2)
    with pytest.raises(ValueError, match="actions has shape"):
        buffer.add(np.zeros((3, 1), np.float32), np.ones(2), np.ones(2, np.float32), False)


@pytest.mark.parametrize("via", ["torch", "npz"])
def test_state_round_trips_through_safe_loaders(via: str) -> None:
    buffer = ReplayBuffer(6, 2, gamma=0.9, n_step=2, seed=1)
    buffer.add_fragment(_fragment(4, terminated=True))
    buffer.add_fragment(_fragment(5, start=50))
    buffer.sample(3)  # the generator has moved on
    raw = io.BytesIO()
    if via == "torch":
        torch.save({k: torch.from_numpy(v) for k, v in buffer.state().items()}, raw)
        raw.seek(0)
        state = torch.load(raw, weights_only=True)
    else:
        np.savez(raw, **buffer.state())
        raw.seek(0)
        state = dict(np.load(raw, allow_pickle=False))
    twin = ReplayBuffer(6, 2, gamma=0.9, n_step=2, seed=99)
    twin.load_state(state)
    assert len(twin) == len(buffer) == 6 and twin.added == buffer.added == 9
    for name, array in buffer.state().items():
        np.testing.assert_array_equal(twin.state()[name], array)
    np.testing.assert_array_equal(twin.sample(8).indices, buffer.sample(8).indices)


def test_a_smaller_buffer_keeps_the_newest_and_other_targets_are_refused() -> None:
    buffer = ReplayBuffer(10, 2, gamma=0.9, n_step=2)
    buffer.add_fragment(_fragment(8))
    small = ReplayBuffer(3, 2, gamma=0.9, n_step=2)
    small.load_state(buffer.state())
    np.testing.assert_array_equal(small.state()["obs"][:, 0], [5, 6, 7])
    with pytest.raises(ValueError, match="keep n_step and gamma"):
        ReplayBuffer(10, 2, gamma=0.9, n_step=3).load_state(buffer.state())
    with pytest.raises(ValueError, match="other spaces"):
        ReplayBuffer(10, 3, gamma=0.9, n_step=2).load_state(buffer.state())


def _piece(
    obs: list[float], rewards: list[float], terminated: bool = False, truncated: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool, bool]:
    return (
        np.array(obs, np.float32)[:, None],
        np.zeros(len(rewards), np.int64),
        np.array(rewards, np.float32),
        terminated,
        truncated,
    )


def test_n_step_sums_are_joined_across_an_episodes_fragments_by_hand() -> None:
    # One episode in three fragments: obs 0..6, rewards 1..6, terminated after the 6th step;
    # gamma 0.5, n = 3. The middle fragment is one step long, so the first fragment's last
    # sum needs both later fragments.
    buffer = ReplayBuffer(20, 1, gamma=0.5, n_step=3)
    for obs, actions, rewards, terminated, truncated in (
        _piece([0, 1, 2, 3], [1, 2, 3]),
        _piece([3, 4], [4]),
        _piece([4, 5, 6], [5, 6], terminated=True),
    ):
        buffer.add(obs, actions, rewards, terminated, key=("e", "agent0"), truncated=truncated)
    state = buffer.state()
    # By hand: t=0: 1 + 2/2 + 3/4 = 2.75, ..., t=3: 4 + 5/2 + 6/4 = 8 (reaches the terminal
    # state after 3 steps), t=4: 5 + 6/2 = 8, t=5: 6.
    np.testing.assert_allclose(state["rewards"], [2.75, 4.5, 6.25, 8.0, 8.0, 6.0])
    np.testing.assert_array_equal(state["next_obs"][:, 0], [3, 4, 5, 6, 6, 6])
    np.testing.assert_allclose(state["discounts"], [0.125, 0.125, 0.125, 0.0, 0.0, 0.0])
    whole = n_step_transitions(
        np.arange(7, dtype=np.float32)[:, None], np.arange(1, 7, dtype=np.float32), True, 0.5, 3
    )
    for column, expected in zip(("rewards", "next_obs", "discounts"), whole, strict=True):
        np.testing.assert_allclose(state[column], expected)


@pytest.mark.parametrize(
    ("pieces", "rewards", "next_obs", "discounts"),
    [
        # The second fragment starts with a logged action: the first one's open sums end there.
        (
            [([0, 1, 2], [True, True]), ([2, 3, 4], [False, True]), ([4, 5], [True])],
            [1 + 0.5 * 2, 2, 3 + 0.5 * 4 + 0.25 * 5, 4 + 0.5 * 5, 5],
            [2, 2, 5, 5, 5],
            [0.25, 0.5, 0.125, 0.25, 0.5],
        ),
        # Its second action is logged: the sums joined across the cut stop before it.
        (
            [([0, 1, 2], [True, True]), ([2, 3, 4, 5], [True, False, True])],
            [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3, 4 + 0.5 * 5, 5],
            [3, 3, 3, 5, 5],
            [0.125, 0.25, 0.5, 0.25, 0.5],
        ),
    ],
)
def test_joined_sums_stop_before_a_logged_action_of_a_later_fragment(
    pieces: list[tuple[list[float], list[bool]]],
    rewards: list[float],
    next_obs: list[float],
    discounts: list[float],
) -> None:
    # One episode of rewards 1..5 (obs 0..5), gamma 0.5, n = 3, in fragments.
    buffer = ReplayBuffer(20, 1, gamma=0.5, n_step=3)
    for obs, chosen in pieces:
        steps = len(chosen)
        first = int(obs[0]) + 1
        buffer.add(
            np.array(obs, np.float32)[:, None],
            np.zeros(steps, np.int64),
            np.arange(first, first + steps, dtype=np.float32),
            False,
            key="e",
            chosen=np.array(chosen),
        )
    state = buffer.state()
    np.testing.assert_allclose(state["rewards"], rewards)
    np.testing.assert_array_equal(state["next_obs"][:, 0], next_obs)
    np.testing.assert_allclose(state["discounts"], discounts)
    whole = n_step_transitions(
        np.arange(6, dtype=np.float32)[:, None],
        np.arange(1, 6, dtype=np.float32),
        False,
        0.5,
        3,
        np.concatenate([chosen for _, chosen in pieces]),
    )
    for column, expected in zip(("rewards", "next_obs", "discounts"), whole, strict=True):
        np.testing.assert_allclose(state[column], expected)


def test_a_truncated_episodes_joined_sums_bootstrap_from_its_final_obs() -> None:
    buffer = ReplayBuffer(20, 1, gamma=0.5, n_step=3)
    buffer.add(*_piece([0, 1, 2], [1, 1])[:4], key="e")
    obs, actions, rewards, terminated, truncated = _piece([2, 3], [1], truncated=True)
    buffer.add(obs, actions, rewards, terminated, key="e", truncated=truncated)
    state = buffer.state()
    np.testing.assert_allclose(state["rewards"], [1.75, 1.5, 1.0])
    np.testing.assert_array_equal(state["next_obs"][:, 0], [3, 3, 3])
    np.testing.assert_allclose(state["discounts"], [0.125, 0.25, 0.5])


def test_only_the_continuation_of_the_same_episode_is_joined() -> None:
    def cut_sums(first_key: str, second_key: str, second_start: float) -> np.ndarray:
        buffer = ReplayBuffer(20, 1, gamma=0.5, n_step=2)
        buffer.add(*_piece([0, 1, 2], [1, 1])[:4], key=first_key)
        start = second_start
        buffer.add(*_piece([start, start + 1], [4])[:4], key=second_key)
        return buffer.state()["rewards"]

    np.testing.assert_allclose(cut_sums("a", "a", 2), [1.5, 1 + 0.5 * 4, 4])  # joined
    np.testing.assert_allclose(cut_sums("a", "b", 2), [1.5, 1, 4])  # another episode
    np.testing.assert_allclose(cut_sums("a", "a", 7), [1.5, 1, 4])  # not where it ended
    # Without a key (the old form of add) nothing is joined.
    buffer = ReplayBuffer(20, 1, gamma=0.5, n_step=2)
    buffer.add(*_piece([0, 1, 2], [1, 1])[:4])
    buffer.add(*_piece([2, 3], [4])[:4])
    np.testing.assert_allclose(buffer.state()["rewards"], [1.5, 1, 4])


def test_a_joined_sum_whose_row_was_overwritten_is_left_alone() -> None:
    buffer = ReplayBuffer(3, 1, gamma=0.5, n_step=3)
    buffer.add(*_piece([0, 1, 2], [1, 1])[:4], key="e")
    buffer.add(*_piece([2, 3, 4, 5], [2, 2, 2])[:4], key="e")  # overwrites rows of 0 and 1
    state = buffer.state()
    np.testing.assert_array_equal(state["obs"][:, 0], [2, 3, 4])
    np.testing.assert_allclose(state["rewards"], [3.5, 3.0, 2.0])
    np.testing.assert_array_equal(state["next_obs"][:, 0], [5, 5, 5])


def test_fragments_through_add_fragment_are_joined_by_episode_and_agent() -> None:
    buffer = ReplayBuffer(20, 2, gamma=0.5, n_step=2)
    buffer.add_fragment(_fragment(2))  # obs 0, 1, 2; rewards 1, 2
    buffer.add_fragment(_fragment(2, start=2, terminated=True))  # obs 2, 3, 4; rewards 1, 2
    np.testing.assert_allclose(buffer.state()["rewards"], [2, 2 + 0.5 * 1, 1 + 0.5 * 2, 2])
    np.testing.assert_allclose(buffer.state()["discounts"], [0.25, 0.25, 0.0, 0.0])


def _sums_by_hand(
    rewards: np.ndarray, chosen: np.ndarray, terminated: bool, gamma: float, n: int
) -> tuple[list[float], list[int], list[float]]:
    """Each step's sum, bootstrap step and discount, one reward at a time."""
    sums, ends, discounts = [], [], []
    steps = len(rewards)
    for t in range(steps):
        k, total = 0, 0.0
        while k < n and t + k < steps and (k == 0 or chosen[t + k]):
            total += gamma**k * float(rewards[t + k])
            k += 1
        sums.append(total)
        ends.append(t + k)
        discounts.append(0.0 if terminated and t + k == steps else gamma**k)
    return sums, ends, discounts


def test_sums_joined_across_any_cuts_are_the_one_piece_sums_by_hand() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        steps, n = int(rng.integers(1, 15)), int(rng.integers(1, 6))
        terminated = bool(rng.integers(2))
        obs = np.arange(steps + 1, dtype=np.float32)[:, None]
        rewards = rng.normal(size=steps).astype(np.float32)
        chosen = rng.random(steps) < 0.7
        sums, ends, discounts = _sums_by_hand(rewards, chosen, terminated, 0.7, n)
        cuts = {int(c) for c in rng.integers(1, steps, size=3)} if steps > 1 else set()
        buffer = ReplayBuffer(100, 1, gamma=0.7, n_step=n)
        for a, b in itertools.pairwise([0, *sorted(cuts), steps]):
            buffer.add(
                obs[a : b + 1],
                np.zeros(b - a, np.int64),
                rewards[a:b],
                terminated and b == steps,
                key="e",
                chosen=chosen[a:b],
            )
        state = buffer.state()
        np.testing.assert_allclose(state["rewards"], sums, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(state["next_obs"][:, 0], ends)
        np.testing.assert_allclose(state["discounts"], discounts, rtol=1e-6)


# -- compact observation storage ---------------------------------------------------------------


def test_whole_byte_spaces_are_stored_as_uint8_and_sampled_as_the_same_float32() -> None:
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (21, 5)).astype(np.float32)
    fragment = _fragment(20)
    fragment.obs = obs
    wide = ReplayBuffer(50, 5, gamma=0.9, seed=4)
    compact = ReplayBuffer(50, 5, gamma=0.9, seed=4, obs_dtype=np.uint8)
    for buffer in (wide, compact):
        buffer.add_fragment(fragment)
    assert compact.state()["obs"].dtype == np.uint8 and compact.state()["obs"].nbytes * 4 == (
        wide.state()["obs"].nbytes
    )
    a, b = wide.sample(32), compact.sample(32)
    assert b.obs.dtype == np.float32 and b.next_obs.dtype == np.float32
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(a.next_obs, b.next_obs)
    # A float32 checkpoint's replay loads into the compact buffer with the same values.
    twin = ReplayBuffer(50, 5, gamma=0.9, seed=4, obs_dtype=np.uint8)
    twin.load_state(wide.state())
    np.testing.assert_array_equal(twin.state()["obs"], compact.state()["obs"])
    with pytest.raises(ValueError, match="float32 or uint8"):
        ReplayBuffer(4, 2, gamma=0.9, obs_dtype=np.int16)


@pytest.mark.parametrize(
    ("low", "high", "dtype", "stored"),
    [
        (0, 255, np.uint8, np.uint8),  # an image
        (0, 1, np.int8, np.uint8),  # a legal-move mask
        (0, 1, np.int64, np.uint8),  # a one-hot Discrete
        (-1, 1, np.int8, np.float32),  # negative whole numbers
        (0, 1000, np.int16, np.float32),  # beyond a byte
        (0.0, 1.0, np.float32, np.float32),  # a float Box, even in [0, 255]
    ],
)
def test_storage_dtype_keeps_uint8_for_whole_bytes_only(
    low: float, high: float, dtype: type, stored: type
) -> None:
    from rlserve.learners.replay import storage_dtype

    lows, highs = np.full(3, low, dtype), np.full(3, high, dtype)
    assert storage_dtype(lows, highs, np.dtype(dtype)) == np.dtype(stored)
