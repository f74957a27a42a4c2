"""Two agents must meet: a cooperative multi-agent simulator driven by a multi-agent client.

A red and a blue agent stand at different cells of a short corridor. Each tick both move at once
(left, stay or right); they are rewarded only when they stand on the same cell, and pay a little
for every tick they have not met yet. To do well each agent must walk towards the other, so both
policies must learn: a lone agent that walks while the other dithers wastes ticks, and two that
walk the same way never meet. Red acts with the policy ``red``, blue with ``blue`` (the server's
``[mapping]`` in ``examples/meeting.toml``).

Run the server, then this client::

    rlserve serve --config examples/meeting.toml
    python examples/meeting.py --episodes 3000

The simulator keeps its own loop: observations, rewards and done flags are dicts keyed by agent
id, as in RLlib's ``MultiAgentEnv``, and ``__all__`` marks the end of the episode.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

AGENTS = ("red_0", "blue_0")
"""The agent ids: the server maps ``red_*`` to the policy ``red`` and ``blue_*`` to ``blue``."""


class MeetingEnv:
    """A corridor of ``size`` cells in which two agents must stand on the same cell.

    Observations (per agent, float32): own cell, the other's cell and the signed distance to it,
    each divided by ``size - 1``. Actions: 0 left, 1 stay, 2 right. Rewards: +1 to both when
    they meet (the episode terminates), else -0.1 each tick; the episode is truncated after
    ``max_ticks`` ticks.
    """

    def __init__(self, size: int = 6, max_ticks: int = 12):
        self.size = size
        self.max_ticks = max_ticks
        self._rng = np.random.default_rng()
        self._cells = {agent: 0 for agent in AGENTS}
        self._ticks = 0

    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        """Place the agents on two different random cells; return their observations."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        red, blue = self._rng.choice(self.size, size=2, replace=False)
        self._cells = {"red_0": int(red), "blue_0": int(blue)}
        self._ticks = 0
        return self._observations()

    def step(
        self, actions: dict[str, int]
    ) -> tuple[
        dict[str, np.ndarray], dict[str, float], dict[str, bool], dict[str, bool], dict[str, Any]
    ]:
        """Move both agents; return observations, rewards, terminateds, truncateds, infos."""
        for agent, action in actions.items():
            self._cells[agent] = int(
                np.clip(self._cells[agent] + int(action) - 1, 0, self.size - 1)
            )
        self._ticks += 1
        met = self._cells["red_0"] == self._cells["blue_0"]
        reward = 1.0 if met else -0.1
        rewards = {agent: reward for agent in AGENTS}
        terminated = {agent: met for agent in AGENTS} | {"__all__": met}
        cut = not met and self._ticks >= self.max_ticks
        truncated = {agent: cut for agent in AGENTS} | {"__all__": cut}
        return self._observations(), rewards, terminated, truncated, {}

    def _observations(self) -> dict[str, np.ndarray]:
        scale = float(self.size - 1)
        out = {}
        for agent, other in (("red_0", "blue_0"), ("blue_0", "red_0")):
            own, theirs = self._cells[agent], self._cells[other]
            out[agent] = np.array(
                [own / scale, theirs / scale, (theirs - own) / scale], dtype=np.float32
            )
        return out


def play_episode(client: Any, env: MeetingEnv, seed: int | None = None) -> float:
    """Play one episode with actions from ``client``; return the team's return per agent."""
    obs = env.reset(seed)
    episode_id = client.start_episode()
    total = 0.0
    while True:
        actions = client.get_action(episode_id, obs)
        obs, rewards, terminated, truncated, _ = env.step(actions)
        total += sum(rewards.values())
        client.log_returns(episode_id, rewards)
        if terminated["__all__"] or truncated["__all__"]:
            client.end_episode(episode_id, obs, truncated=truncated["__all__"])
            return total / len(AGENTS)


def main() -> None:
    """Play episodes against a server and print the mean return of every 100."""
    from rlserve import PolicyClient

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:9900")
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument(
        "--inference",
        choices=["local", "remote"],
        default="local",
        help="local: the client chooses actions with numpy; remote: the server chooses every one",
    )
    args = parser.parse_args()
    env = MeetingEnv()
    with PolicyClient(args.address, inference_mode=args.inference) as client:
        returns: list[float] = []
        for episode in range(args.episodes):
            returns.append(play_episode(client, env, seed=episode))
            if len(returns) == 100:
                print(f"episodes {episode + 1:>6}: mean return per agent {np.mean(returns):+.2f}")
                returns.clear()


if __name__ == "__main__":
    main()
