"""A client process for the end-to-end tests: ``python e2e_client_worker.py ADDRESS MODE ...``.

Modes:

* ``episodes SEED COUNT [MAX_STEPS]``: play COUNT CartPole episodes (seeds SEED, SEED+1, ...),
  print one JSON line with their results and exit 0.
* ``hang SEED STEPS``: start an episode, take STEPS actions, print ``ready <episode_id>`` and then
  sleep until killed (a client that dies mid-episode).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import gymnasium as gym
from e2e_support import play_cartpole

from rlserve import PolicyClient


def main() -> int:
    address, mode, *rest = sys.argv[1:]
    client = PolicyClient(
        address, inference_mode="remote", client_name=f"worker-{mode}", timeout=30
    )
    if mode == "episodes":
        seed, count = int(rest[0]), int(rest[1])
        max_steps = int(rest[2]) if len(rest) > 2 else None
        results = [
            dataclasses.asdict(play_cartpole(client, seed + i, max_steps=max_steps))
            for i in range(count)
        ]
        client.close()
        print(json.dumps(results), flush=True)
        return 0
    if mode == "hang":
        seed, steps = int(rest[0]), int(rest[1])
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seed)
        eid = client.start_episode()
        for _ in range(steps):
            action = client.get_action(eid, obs)
            obs, reward, terminated, _, _ = env.step(action)
            assert not terminated
            client.log_returns(eid, float(reward))
        print(f"ready {eid}", flush=True)
        while True:
            time.sleep(60)
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
