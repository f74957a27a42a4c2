"""Clients that play CartPole against a server and count what they did (cluster serving tests)."""

from __future__ import annotations

import threading
import time

import gymnasium as gym

from rlserve import PolicyClient
from rlserve.client.local import LocalConfig
from rlserve.errors import EpisodeLostError, RLServeError

STEP_S = 0.002
"""A simulator's time per step: a few hundred steps a second per client, not tens of thousands."""


class LocalPlayer(threading.Thread):
    """Plays CartPole through a local-inference client and counts every step it took."""

    def __init__(self, address: str | list[str], seed: int):
        super().__init__(daemon=True)
        patient = LocalConfig(
            batch_steps=64, batch_interval=0.05, max_buffered_steps=50_000, when_full="block"
        )
        self.client = PolicyClient(
            address,
            inference_mode="local",
            local=patient,
            reconnect_timeout=60,
            update_interval=0.5,
        )
        self.seed = seed
        self.stop = threading.Event()
        self.steps = 0

    def run(self) -> None:
        env = gym.make("CartPole-v1")
        episode = 0
        while not self.stop.is_set():
            obs, _ = env.reset(seed=self.seed + episode)
            eid = self.client.start_episode()
            done = truncated = terminated = False
            while not done:
                action = self.client.get_action(eid, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                self.client.log_returns(eid, float(reward))
                self.steps += 1
                done = terminated or truncated
                time.sleep(STEP_S)
            self.client.end_episode(eid, obs, truncated=truncated and not terminated)
            episode += 1

    def finish(self) -> None:
        """Stop playing, and send every batch still buffered."""
        self.stop.set()
        self.join(60)
        self.client.close()


class RemotePlayer(threading.Thread):
    """Plays CartPole through a remote-inference client, starting over after a lost episode."""

    def __init__(self, address: str | list[str], seed: int):
        super().__init__(daemon=True)
        self.client = PolicyClient(
            address, inference_mode="remote", timeout=30, reconnect_timeout=60
        )
        self.seed = seed
        self.stop = threading.Event()
        self.episodes = 0
        self.lost = 0
        self.errors: list[str] = []

    def run(self) -> None:
        env = gym.make("CartPole-v1")
        while not self.stop.is_set():
            try:
                obs, _ = env.reset(seed=self.seed + self.episodes)
                eid = self.client.start_episode()
                for _ in range(60):
                    action = self.client.get_action(eid, obs)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    self.client.log_returns(eid, float(reward))
                    if terminated or truncated:
                        break
                self.client.end_episode(eid, obs)
                self.episodes += 1
            except EpisodeLostError:
                self.lost += 1
            except RLServeError as exc:
                self.errors.append(str(exc))
                time.sleep(0.05)

    def finish(self) -> None:
        """Stop playing."""
        self.stop.set()
        self.join(60)
        self.client.close()
