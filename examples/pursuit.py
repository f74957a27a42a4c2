"""Two teams, one frozen: chasers learn to catch a runner whose policy does not change.

Two chasers (team ``chaser``) and one runner (team ``runner``) move on a small square grid.
The chasers share one policy and are rewarded when either of them lands on the runner's cell;
the runner is paid the opposite. The runner's policy is frozen on the server
(``frozen = true`` in ``examples/pursuit.toml``, optionally ``init_checkpoint`` to load an
opponent trained in another run): it acts but never learns, so the chasers learn against a fixed
opponent, the usual first stage of self-play.

Run the server, then this client::

    rlserve serve --config examples/pursuit.toml
    python examples/pursuit.py --episodes 2000

Every agent acts every tick; the catch (or the time limit) ends the episode with ``__all__``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

CHASERS = ("chaser_0", "chaser_1")
RUNNER = "runner_0"
MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])
"""Actions: stay, up, down, left, right."""


class PursuitEnv:
    """A ``size`` x ``size`` grid with two chasers and one runner.

    Observations (per agent, float32): own cell, then the other agents' cells relative to it
    (chasers see the runner first), all divided by ``size - 1``. Rewards: +1 to the chasers and
    -1 to the runner at the catch (the episode terminates), else -0.05 to chasers and +0.05 to
    the runner each tick; truncated after ``max_ticks`` ticks.
    """

    def __init__(self, size: int = 5, max_ticks: int = 20):
        self.size = size
        self.max_ticks = max_ticks
        self._rng = np.random.default_rng()
        self._cells: dict[str, np.ndarray] = {}
        self._ticks = 0

    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        """Place the three agents on distinct random cells."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        flat = self._rng.choice(self.size * self.size, size=3, replace=False)
        agents = (*CHASERS, RUNNER)
        self._cells = {
            a: np.array(divmod(int(c), self.size)) for a, c in zip(agents, flat, strict=True)
        }
        self._ticks = 0
        return self._observations()

    def step(
        self, actions: dict[str, int]
    ) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, bool], dict[str, bool]]:
        """Move every agent; return observations, rewards, terminateds and truncateds."""
        for agent, action in actions.items():
            moved = self._cells[agent] + MOVES[int(action)]
            self._cells[agent] = np.clip(moved, 0, self.size - 1)
        self._ticks += 1
        caught = any((self._cells[c] == self._cells[RUNNER]).all() for c in CHASERS)
        chaser_reward = 1.0 if caught else -0.05
        rewards = {c: chaser_reward for c in CHASERS} | {RUNNER: -chaser_reward}
        cut = not caught and self._ticks >= self.max_ticks
        terminated = {a: caught for a in rewards} | {"__all__": caught}
        truncated = {a: cut for a in rewards} | {"__all__": cut}
        return self._observations(), rewards, terminated, truncated

    def _observations(self) -> dict[str, np.ndarray]:
        scale = float(self.size - 1)
        out = {}
        for agent in (*CHASERS, RUNNER):
            own = self._cells[agent]
            others = [RUNNER, *(c for c in CHASERS if c != agent)] if agent != RUNNER else CHASERS
            parts = [own, *(self._cells[o] - own for o in others)]
            out[agent] = (np.concatenate(parts) / scale).astype(np.float32)
        return out


def play_episode(client: Any, env: PursuitEnv, seed: int | None = None) -> float:
    """Play one episode with actions from ``client``; return the chasers' return (each)."""
    obs = env.reset(seed)
    episode_id = client.start_episode()
    chaser_return = 0.0
    while True:
        actions = client.get_action(episode_id, obs)
        obs, rewards, terminated, truncated = env.step(actions)
        chaser_return += rewards[CHASERS[0]]
        done = terminated["__all__"] or truncated["__all__"]
        client.log_returns(episode_id, rewards)
        if done:
            client.end_episode(episode_id, obs, truncated=truncated["__all__"])
            return chaser_return


def main() -> None:
    """Play episodes against a server and print the chasers' mean return of every 100."""
    from rlserve import PolicyClient

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:9900")
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument(
        "--inference",
        choices=["local", "remote"],
        default="local",
        help="local: the client chooses actions with numpy; remote: the server chooses every one",
    )
    args = parser.parse_args()
    env = PursuitEnv()
    with PolicyClient(args.address, inference_mode=args.inference) as client:
        returns: list[float] = []
        for episode in range(args.episodes):
            returns.append(play_episode(client, env, seed=episode))
            if len(returns) == 100:
                print(f"episodes {episode + 1:>6}: chasers' mean return {np.mean(returns):+.2f}")
                returns.clear()


if __name__ == "__main__":
    main()
