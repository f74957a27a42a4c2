"""One hosted multi-agent run that mixes algorithms: a PPO policy and a DQN policy, each trained
on its own schedule by ``train()``, saved, restored and exported as what it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from algorithm_toys import Mimic

from rlserve import PPOConfig
from rlserve.algorithm.algorithm import Algorithm
from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.learners.dqn import DQNLearner
from rlserve.learners.ppo import PPOLearner

DQN_SETTINGS: dict[str, Any] = {
    "learning_starts": 100,
    "train_every": 16,
    "batch_size": 32,
    "exploration_steps": 600,
    "epsilon_end": 0.05,
    "target_update_interval": 50,
    "tau": 1.0,
    "updates_per_step": 0.5,
}


def _config(**dqn_overrides: Any) -> Any:
    return (
        PPOConfig()
        .environment(Mimic)
        .env_runners(num_envs_per_env_runner=2)
        .training(
            train_batch_size=256,
            minibatch_size=64,
            num_epochs=4,
            lr=3e-3,
            model={"fcnet_hiddens": [16]},
            min_env_steps_per_iteration=1024,
        )
        .multi_agent(
            # "a" copies the sign with PPO (the config's algorithm); "b" plays the opposite with
            # DQN: the settings of every DQN policy, then its own overrides.
            policies={"a": {}, "b": {"algo": "dqn", "lr": 3e-3, **dqn_overrides}},
            policy_mapping={"a": "a", "b": "b"},  # rules are saved with the config
            algorithm_settings={"dqn": {**DQN_SETTINGS, "model": {"fcnet_hiddens": [16]}}},
        )
        .resources(device="cpu")
        .debugging(seed=5)
    )


def _greedy(algo: Algorithm, policy_id: str) -> list[int]:
    """The policy's greedy actions for the signs +1 and -1."""
    return [
        int(algo.compute_single_action(np.array([sign], np.float32), policy_id=policy_id))
        for sign in (1.0, -1.0)
    ]


@pytest.mark.timeout(120)
def test_a_ppo_and_a_dqn_policy_train_on_their_own_schedules(tmp_path: Path) -> None:
    with _config().build() as algo:
        assert isinstance(algo.learners["a"], PPOLearner)
        assert isinstance(algo.learners["b"], DQNLearner)
        b = algo.learners["b"].config  # type: ignore[attr-defined]
        assert (b.lr, b.learning_starts, b.hidden, b.device) == (3e-3, 100, (16,), "cpu")
        # The DQN learner's steps taken in at each of its updates: a round apart.
        dqn_learner = algo.learners["b"]
        ingested_at: list[int] = []
        update = dqn_learner.update

        def recording_update() -> dict[str, float]:
            ingested_at.append(dqn_learner.counters()["env_steps_ingested"])
            return update()

        dqn_learner.update = recording_update  # type: ignore[method-assign]
        versions = []
        for _ in range(4):
            result = algo.train()
            versions.append((algo.learners["a"].version, algo.learners["b"].version))
        ppo, dqn = result["learners"]["a"], result["learners"]["b"]
        # Each policy's own metrics: PPO's for a, DQN's for b.
        assert np.isfinite(ppo["policy_loss"]) and "q_loss" not in ppo
        assert np.isfinite(dqn["q_loss"]) and "policy_loss" not in dqn
        # Both weights versions move, iteration after iteration.
        assert versions[0][0] >= 1 and versions[0][1] >= 1
        assert versions[-1][0] > versions[0][0] and versions[-1][1] > versions[0][1]
        # DQN's schedule: a round (one version) per train_every steps past its warm-up, not
        # one per PPO batch; PPO one update per full batch of its own agent's steps.
        # Not a whole PPO batch's worth of steps (its agent's 128) between two updates.
        assert max(np.diff(ingested_at)) <= 2 * 16, ingested_at
        ingested = dqn["env_steps_ingested"]
        assert dqn["updates"] >= (ingested - 100) // 16 - 2, dqn
        assert dqn["gradient_steps"] >= 0.5 * (ingested - 100) - 16, dqn
        assert ppo["updates"] <= ppo["steps_trained"] // 256, ppo
        assert ppo["updates"] >= 5
        # Both learned their task: a copies the sign, b plays the opposite.
        assert _greedy(algo, "a") == [1, 0]
        assert _greedy(algo, "b") == [0, 1]
        evaluation = algo.evaluate(4)["evaluation"]["env_runners"]
        assert evaluation["episode_return_mean"] >= 15  # of 16; random play scores about 8
        folder = algo.save(tmp_path / "mixed")
        counters = {pid: learner.counters() for pid, learner in algo.learners.items()}
    # The run folder records each policy's algorithm, so a restore rebuilds the same thing.
    text = (folder / "config.toml").read_text()
    assert "[policies.b]" in text and 'algo = "dqn"' in text and "[dqn]" in text
    with Algorithm.from_checkpoint(folder) as restored:
        assert isinstance(restored.learners["b"], DQNLearner)
        assert {pid: x.counters() for pid, x in restored.learners.items()} == counters
        assert _greedy(restored, "b") == [0, 1]
        restored.train()
    # The export rebuilds each policy's own model.
    from rlserve.algorithm.export import load_model
    from rlserve.learners.models import ActorCritic, QNetwork

    assert isinstance(load_model(folder, policy_id="a")[0], ActorCritic)
    assert isinstance(load_model(folder, policy_id="b")[0], QNetwork)


@pytest.mark.timeout(60)
def test_a_restore_into_another_algorithm_is_refused(tmp_path: Path) -> None:
    config = _config().training(min_env_steps_per_iteration=64)
    with config.build() as algo:
        folder = algo.save(tmp_path / "ckpt")
    changed = _config().multi_agent(policies={"a": {}, "b": {}})  # b would be PPO's now
    with pytest.raises(ConfigError, match=r"policy 'b' in .* is dqn's.*algo='dqn'"):
        Algorithm.from_checkpoint(folder, changed)


def test_mistakes_in_mixed_policies_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="unknown algorithm 'dq'"):
        PPOConfig().multi_agent(policies={"b": {"algo": "dq"}})
    with pytest.raises(ConfigError, match=r"policy 'b' of dqn has no setting 'clip_param'"):
        PPOConfig().multi_agent(policies={"b": {"algo": "dqn", "clip_param": 0.1}})
    with pytest.raises(ConfigError, match=r"algorithm_settings\['dqn'\] of dqn has no setting"):
        PPOConfig().multi_agent(algorithm_settings={"dqn": {"num_sgd_iter": 3}})
    # A policy whose agents' spaces its algorithm cannot learn: named, with the ones that can.
    config = (
        PPOConfig()
        .environment(Mimic)
        .multi_agent(
            policies={"a": {}, "b": {"algo": "sac"}},
            policy_mapping_fn=lambda agent_id, episode, **kw: agent_id,
        )
    )
    with pytest.raises(UnsupportedSpaceError, match=r"^policy 'b': sac learns .* ppo, dqn$"):
        config.build()
