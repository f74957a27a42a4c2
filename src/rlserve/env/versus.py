"""A turn-based PettingZoo game against a fixed opponent, as a single-agent gymnasium env.

:class:`VersusOpponent` wraps a PettingZoo ``AECEnv`` whose observations follow PettingZoo
classic's form (a ``Dict`` of ``observation`` and ``action_mask``, as tictactoe, connect four
or chess): one seat is the learner, every other seat plays the ``opponent`` inside
:meth:`~VersusOpponent.step`, so a hosted single-agent learner trains against it. The
learner's seat rotates through ``possible_agents`` with each reset (in a two-player game it
moves first in every other game). Its reward is the sum of what PettingZoo's ``rewards``
give its seat after its move and the opponents' moves that follow; the episode ends when its
seat is terminated or truncated.

With ``mask=False`` the observation is the game's ``observation`` alone: the learner cannot
see which moves are legal. An illegal move is then never passed to the game (PettingZoo's
classic games end it with a warning); it ends the episode as a loss with ``illegal_reward``,
in either mode, and is counted in :attr:`VersusOpponent.illegal_moves`.

PettingZoo is an optional dependency (the ``pettingzoo`` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.env.pettingzoo import require_pettingzoo
from rlserve.errors import ConfigError, EnvError

__all__ = ["Opponent", "VersusOpponent", "uniform_legal"]

Opponent = Callable[[Any, np.random.Generator], int]
"""An opponent: ``(its observation, a random generator) -> its action``."""

OBSERVATION = "observation"
MASK = "action_mask"


def uniform_legal(observation: Any, rng: np.random.Generator) -> int:
    """A uniformly random legal move of a PettingZoo classic observation (its ``action_mask``)."""
    return int(rng.choice(np.flatnonzero(observation[MASK])))


class VersusOpponent(gym.Env[Any, Any]):
    """One seat of a PettingZoo ``AECEnv`` against ``opponent`` (see the module doc).

    Args:
        env: The AEC env (e.g. ``pettingzoo.classic.tictactoe_v3.env()``).
        opponent: Plays every seat but the learner's; uniformly random legal moves by default.
        mask: Keep the ``action_mask`` in the observation (``Dict`` of ``action_mask`` and
            ``observation``); without it the observation is the game's ``observation`` alone.
        illegal_reward: The learner's reward for an illegal move, which ends the episode.

    Attributes:
        illegal_moves: The learner's illegal moves since this env was built.
        seat: The learner's seat in the current game.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        env: Any,
        opponent: Opponent | None = None,
        *,
        mask: bool = True,
        illegal_reward: float = -1.0,
    ) -> None:
        pz = require_pettingzoo()
        if not isinstance(env, pz.AECEnv):
            raise ConfigError(
                f"VersusOpponent needs a turn-based PettingZoo AECEnv, got {type(env).__name__}; "
                "pass e.g. pettingzoo.classic.tictactoe_v3.env()"
            )
        self.env = env
        self.seats = list(env.possible_agents)
        space = env.observation_space(self.seats[0])
        if not isinstance(space, gym.spaces.Dict) or set(space.spaces) != {OBSERVATION, MASK}:
            raise ConfigError(
                f"VersusOpponent needs PettingZoo classic observations, a Dict of '{OBSERVATION}' "
                f"and '{MASK}', got {space}; wrap a classic game (tictactoe, connect four, chess)"
            )
        self.observation_space = (
            gym.spaces.Dict({MASK: space[MASK], OBSERVATION: space[OBSERVATION]})
            if mask
            else space[OBSERVATION]
        )
        self.action_space = env.action_space(self.seats[0])
        self.opponent = opponent or uniform_legal
        self.mask = mask
        self.illegal_reward = float(illegal_reward)
        self.illegal_moves = 0
        self.games = 0
        self.seat = self.seats[0]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Start a game in the next seat; the opponents move first where their seats do."""
        super().reset(seed=seed)
        self.env.reset(seed=seed, options=options)
        self.seat = self.seats[self.games % len(self.seats)]
        self.games += 1
        _, over = self._opponents_move()
        if over:
            raise EnvError(
                f"{type(self.env).__name__}: the game ended before seat {self.seat!r} moved"
            )
        return self._observation(), {"seat": self.seat}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Play the learner's move, then the opponents' until its turn comes or the game ends."""
        move = int(action)
        legal = self.env.observe(self.seat)[MASK]
        if not 0 <= move < len(legal) or not legal[move]:
            self.illegal_moves += 1
            info = {"seat": self.seat, "illegal_move": True}
            return self._observation(), self.illegal_reward, True, False, info
        self.env.step(move)
        reward = float(self.env.rewards.get(self.seat, 0.0))
        later, over = self._opponents_move()
        terminated = over and bool(self.env.terminations.get(self.seat, True))
        return (
            self._observation(),
            reward + later,
            terminated,
            over and not terminated,
            {"seat": self.seat},
        )

    def _opponents_move(self) -> tuple[float, bool]:
        """Let the opponents play until the learner's turn: its reward on the way, game over."""
        env, reward = self.env, 0.0
        while True:
            if env.terminations.get(self.seat, True) or env.truncations.get(self.seat, False):
                return reward, True
            if env.agent_selection == self.seat:
                return reward, False
            agent = env.agent_selection
            env.step(self.opponent(env.observe(agent), self.np_random))
            reward += float(env.rewards.get(self.seat, 0.0))

    def _observation(self) -> Any:
        observation = self.env.observe(self.seat)
        if not self.mask:
            return observation[OBSERVATION]
        return {MASK: observation[MASK], OBSERVATION: observation[OBSERVATION]}

    def close(self) -> None:
        """Close the wrapped game."""
        self.env.close()
