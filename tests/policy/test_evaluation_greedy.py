"""Evaluation episodes (``training_enabled=False``) of a DQN policy act greedily (epsilon 0), on
the server (remote inference) and in a local-mode client's collector; training episodes explore
with the shipped epsilon, and a PPO policy samples in both."""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlserve.algorithm.sources import policy_table
from rlserve.experience.collector import Collector
from rlserve.learners.models import ActorCritic, QNetwork
from rlserve.policy import NumpyPolicy
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request
from rlserve.server.policies import PolicySpec
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats
from service_fakes import RecordingSink

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(6)
STEPS = 60


def _dqn_package() -> WeightsPackage:
    """Q-values whose greedy choice depends on the observation; epsilon 1: exploring is random."""
    torch.manual_seed(0)
    model = QNetwork(OBS, ACT, (8,), "relu", False)
    return WeightsPackage(1, model.spec(1.0), model.q_arrays())


def _ppo_package() -> WeightsPackage:
    torch.manual_seed(0)
    model = ActorCritic(OBS, ACT, (8,), "tanh")
    return WeightsPackage(1, model.spec(), model.actor_arrays())


def _observations(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (STEPS, 3)).astype(np.float32)


def _greedy(package: WeightsPackage, obs: np.ndarray) -> list[int]:
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    return [int(a) for a in policy.compute_actions(obs, explore=False).actions]


def _served_actions(package: WeightsPackage, obs: np.ndarray) -> dict[str, list[int]]:
    """Each step's actions of a training episode, an evaluation episode and an evaluation
    agent of a multi-agent episode, asked for together (one forward pass per step)."""
    service = Service(
        {"default": (OBS, ACT)}, Limits(), None, 8, RecordingSink(), ServerStats(), seed=0
    )
    service.set_weights("default", package)
    session = Session(authenticated=True)
    replies: dict[str, list[int]] = {"train": [], "eval": [], "eval_agent": []}

    def call(message: dict[str, Any], name: str | None = None) -> None:
        def respond(reply: dict[str, Any]) -> None:
            assert reply["type"] != "error", reply
            if name is not None:
                replies[name].append(
                    int(reply["action"] if "action" in reply else reply["actions"][0])
                )

        service.handle(parse_request(message), session, respond)

    async def run() -> None:
        call({"type": "start_episode", "episode_id": "train"})
        call({"type": "start_episode", "episode_id": "eval", "training_enabled": False})
        call({"type": "start_episode", "episode_id": "agents", "training_enabled": False})
        for row in obs:
            call({"type": "get_action", "episode_id": "train", "observation": row}, "train")
            call({"type": "get_action", "episode_id": "eval", "observation": row}, "eval")
            call(
                {
                    "type": "get_action",
                    "episode_id": "agents",
                    "agent_ids": ["x"],
                    "observations": [row],
                },
                "eval_agent",
            )
            await asyncio.sleep(0)  # the batch's flush
            for episode in ("train", "eval"):
                call({"type": "log_returns", "episode_id": episode, "reward": 0.0})
            call(
                {
                    "type": "log_returns",
                    "episode_id": "agents",
                    "agent_ids": ["x"],
                    "rewards": [0.0],
                }
            )

    asyncio.run(run())
    return replies


def test_the_server_acts_greedily_in_evaluation_episodes_of_a_dqn_policy() -> None:
    package = _dqn_package()
    obs = _observations(1)
    served = _served_actions(package, obs)
    greedy = _greedy(package, obs)
    assert len(set(greedy)) > 1  # the greedy choice depends on the observation
    assert served["eval"] == greedy
    assert served["eval_agent"] == greedy
    # Training episodes explore (epsilon 1: uniformly random, so mostly not the greedy one).
    assert sum(a != g for a, g in zip(served["train"], greedy, strict=True)) > STEPS // 2


def test_a_stochastic_policy_samples_in_evaluation_episodes_as_in_any() -> None:
    package = _ppo_package()
    obs = _observations(2)
    served = _served_actions(package, obs)
    greedy = _greedy(package, obs)
    assert served["eval"] != greedy  # near-uniform logits of fresh weights: samples differ


def _collector(package: WeightsPackage) -> Collector:
    specs = {"default": PolicySpec("default", OBS, ACT)}
    policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=3)
    return Collector(
        policy_table(specs, None), {"default": policy}, 100, 16, lambda f: None, lambda s: None
    )


@pytest.mark.parametrize("call", ["one", "batch", "agents"])
def test_a_local_client_acts_greedily_in_evaluation_episodes_of_a_dqn_policy(call: str) -> None:
    package = _dqn_package()
    obs = _observations(3)
    greedy = _greedy(package, obs)
    collector = _collector(package)
    train = collector.start_episode(None, True)
    evaluation = collector.start_episode(None, False)
    got: dict[str, list[int]] = {"train": [], "eval": []}
    for row in obs:
        if call == "one":
            got["train"].append(int(collector.get_one_action(train, row)))
            got["eval"].append(int(collector.get_one_action(evaluation, row)))
        elif call == "batch":  # both episodes in one call: the rows act apart
            actions = collector.get_action([train, evaluation], np.stack([row, row]))
            got["train"].append(int(actions[0]))
            got["eval"].append(int(actions[1]))
        else:
            got["train"].append(int(collector.get_agent_actions(train, {"x": row})["x"]))
            got["eval"].append(int(collector.get_agent_actions(evaluation, {"x": row})["x"]))
        if call != "agents":  # an agent's next observation needs no reward in between
            collector.log_returns(train, 0.0)
            collector.log_returns(evaluation, 0.0)
    assert got["eval"] == greedy
    assert sum(a != g for a, g in zip(got["train"], greedy, strict=True)) > STEPS // 2
