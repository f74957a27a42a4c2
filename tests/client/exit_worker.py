"""A local-inference client process for the exit-flush tests: ``python exit_worker.py MODE ADDRESS
COUNT``.

It plays COUNT CartPole episodes (seeds 0, 1, ...), prints one JSON line with the steps and
episodes it logged, and exits. Modes:

* ``no-close``: the README's loop as people write it, without ``close()``: the client must ship
  what it holds when the interpreter exits.
* ``with``: the same loop inside ``with PolicyClient(...) as client:``.
* ``server-gone``: nothing ships on its own (a huge batch), and after the JSON line the process
  waits for a line on stdin (the test stops the server first), then exits without ``close()``.
"""

from __future__ import annotations

import json
import sys

import gymnasium as gym

from rlserve import PolicyClient
from rlserve.client.local import LocalConfig


def play(client: PolicyClient, count: int) -> dict[str, int]:
    """Play ``count`` episodes; the steps and episodes logged."""
    env = gym.make("CartPole-v1")
    steps = 0
    for seed in range(count):
        episode_id, (obs, _), done = client.start_episode(), env.reset(seed=seed), False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(client.get_action(episode_id, obs))
            client.log_returns(episode_id, float(reward))
            steps += 1
            done = terminated or truncated
        client.end_episode(episode_id, obs, truncated=truncated and not terminated)
    return {"steps": steps, "episodes": count}


def main() -> int:
    mode, address, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "no-close":
        client = PolicyClient(address, seed=1)
        print(json.dumps(play(client, count)), flush=True)
        return 0
    if mode == "with":
        with PolicyClient(address, seed=1) as client:
            played = play(client, count)
        print(json.dumps(played), flush=True)
        return 0
    if mode == "server-gone":
        import rlserve.client.exit_flush

        rlserve.client.exit_flush.EXIT_FLUSH_TIMEOUT = 2.0
        hold = LocalConfig(batch_steps=100_000, batch_interval=3600.0)
        client = PolicyClient(address, seed=1, local=hold)
        print(json.dumps(play(client, count)), flush=True)
        sys.stdin.readline()
        return 0
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
