"""VersusOpponent: a PettingZoo classic game against a fixed opponent as a single-agent env."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.env import VersusOpponent, uniform_legal
from rlserve.errors import ConfigError

pytest.importorskip("pettingzoo")
tictactoe_v3 = pytest.importorskip("pettingzoo.classic.tictactoe_v3")

pytestmark = pytest.mark.timeout(60)


def lowest_legal(observation: Any, rng: np.random.Generator) -> int:
    """A scripted opponent: the lowest-numbered free square."""
    return int(np.flatnonzero(observation["action_mask"])[0])


def board(obs: dict[str, np.ndarray]) -> np.ndarray:
    """The 9 squares from the learner's view: 1 its mark, 2 the opponent's, 0 free."""
    planes = obs["observation"].reshape(9, 2)  # squares in action order (column-major board)
    return planes[:, 0] + 2 * planes[:, 1]


def test_spaces_follow_the_game_with_and_without_the_mask() -> None:
    env = VersusOpponent(tictactoe_v3.env())
    assert isinstance(env.observation_space, gym.spaces.Dict)
    assert env.observation_space["observation"].shape == (3, 3, 2)
    assert env.observation_space["action_mask"].shape == (9,)
    assert env.action_space == gym.spaces.Discrete(9)
    bare = VersusOpponent(tictactoe_v3.env(), mask=False)
    assert bare.observation_space.shape == (3, 3, 2)
    obs, _ = bare.reset(seed=0)
    assert bare.observation_space.contains(obs)


def test_seats_alternate_and_the_opponent_moves_first_in_the_second_seat() -> None:
    env = VersusOpponent(tictactoe_v3.env(), lowest_legal)
    obs, info = env.reset(seed=0)
    assert info["seat"] == "player_1"
    assert board(obs).tolist() == [0] * 9
    assert obs["action_mask"].tolist() == [1] * 9
    obs, reward, terminated, truncated, _ = env.step(4)
    # The learner's mark at 4, then the opponent's at the lowest free square, 0.
    assert board(obs).tolist() == [2, 0, 0, 0, 1, 0, 0, 0, 0]
    assert obs["action_mask"].tolist() == [0, 1, 1, 1, 0, 1, 1, 1, 1]
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, info = env.reset()
    assert info["seat"] == "player_2"
    assert board(obs).tolist() == [2, 0, 0, 0, 0, 0, 0, 0, 0]
    assert obs["action_mask"].tolist() == [0] + [1] * 8


def test_a_win_a_loss_and_a_draw_pay_plus_one_minus_one_and_zero() -> None:
    env = VersusOpponent(tictactoe_v3.env(), lowest_legal)
    env.reset(seed=0)  # learner X first; the opponent fills 0, 1, 2, ... in order
    rewards = [env.step(move)[1:3] for move in (4, 5, 3)]
    # The opponent holds 0 and 1; squares 3, 4, 5 are a line: the learner wins.
    assert rewards == [(0.0, False), (0.0, False), (1.0, True)]
    env.reset()  # learner O second: the opponent plays 0, 1, 2 (a line) while O plays 4, 8
    rewards = [env.step(move)[1:3] for move in (4, 8)]
    assert rewards == [(0.0, False), (-1.0, True)]
    env.reset()  # learner X again: a draw, X 1 3 4 6 8 / O 0 2 5 7 (the lowest free square)
    results = [env.step(move)[1:3] for move in (1, 3, 4, 6, 8)]
    assert results[-1] == (0.0, True) and all(not done for _, done in results[:-1])


def test_an_illegal_move_loses_is_counted_and_never_reaches_the_game() -> None:
    env = VersusOpponent(tictactoe_v3.env(), lowest_legal, mask=False)
    env.reset(seed=0)
    env.step(4)  # the opponent answers at 0
    obs, reward, terminated, truncated, info = env.step(0)
    assert (reward, terminated, truncated, info["illegal_move"]) == (-1.0, True, False, True)
    assert env.illegal_moves == 1
    assert obs[:, :, 1].sum() == 1  # the game saw one opponent mark and nothing more


def test_the_random_opponent_plays_legal_moves_and_is_seeded() -> None:
    def games(seed: int) -> list[float]:
        env = VersusOpponent(tictactoe_v3.env())
        env.reset(seed=seed)
        rng, out = np.random.default_rng(0), []
        for _ in range(50):
            obs, _ = env.reset()
            done, reward = False, 0.0
            while not done:
                obs, reward, terminated, truncated, _ = env.step(uniform_legal(obs, rng))
                done = terminated or truncated
            out.append(reward)
        assert env.illegal_moves == 0
        return out

    assert games(3) == games(3)


def test_refuses_what_it_cannot_wrap() -> None:
    with pytest.raises(ConfigError, match="AECEnv"):
        VersusOpponent(gym.make("CartPole-v1"))


def test_hosted_ppo_never_takes_an_illegal_move() -> None:
    from rlserve import PPOConfig

    envs: list[VersusOpponent] = []

    def creator(config: Any) -> VersusOpponent:
        envs.append(VersusOpponent(tictactoe_v3.env()))
        return envs[-1]

    config = (
        PPOConfig()
        .environment(creator)
        .debugging(seed=0)
        .training(train_batch_size=1024, minibatch_size=256, num_epochs=2, hidden=[32])
    )
    with config.build() as algo:
        for _ in range(3):
            algo.train()
    assert sum(env.games for env in envs) > 500
    assert sum(env.illegal_moves for env in envs) == 0


@pytest.mark.timeout(300)
def test_hosted_ppo_learns_to_beat_a_random_player_at_a_reduced_budget(
    learning_device: str,
) -> None:
    """Issue 23's mask target at a fifth of its budget (the bench's settings and game): the
    greedy player wins or draws most games against a uniformly random legal opponent and never
    took an illegal move. Measured (seed 0): 93.5% of the 200 games at 40,000 steps, 51% before
    training; bench/tictactoe.py reaches 95% at ~78,000 steps."""
    from rlserve import PPOConfig

    envs: list[VersusOpponent] = []

    def creator(config: Any) -> VersusOpponent:
        envs.append(VersusOpponent(tictactoe_v3.env()))
        return envs[-1]

    config = (
        PPOConfig()
        .environment(creator)
        .debugging(seed=0)
        .training(train_batch_size=512, device=learning_device)
    )
    with config.build() as algo:
        while algo.env_steps_sampled < 40_000:
            algo.train()
        judge = VersusOpponent(tictactoe_v3.env())
        won_or_drawn = 0
        for game in range(200):
            obs, _ = judge.reset(seed=10_000 + game)
            done, reward = False, 0.0
            while not done:
                action = algo.compute_single_action(obs, explore=False)
                obs, reward, terminated, truncated, _ = judge.step(action)
                done = terminated or truncated
            won_or_drawn += reward >= 0
    assert sum(env.illegal_moves for env in envs) + judge.illegal_moves == 0
    assert won_or_drawn / 200 >= 0.85, won_or_drawn
