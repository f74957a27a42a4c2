"""RLlib's builder calls run unchanged, or stop with the fix: an RLlib script needs its imports.

``framework``, ``api_stack``, ``rollouts``, ``resources(num_gpus=...)``, ``evaluation(...)``,
``environment(disable_env_checking=...)``, ``multi_agent(policies_to_train=...)`` and RLlib's
``policy_mapping_fn(agent_id, episode, worker, **kwargs)``; wrong arguments of any builder are a
ConfigError naming its settings (and RLlib's renamed ones), never a bare TypeError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from algorithm_toys import OBS1, Mimic

from rlserve import DQNConfig, PPOConfig, SACConfig
from rlserve.algorithm.algorithm import Algorithm
from rlserve.errors import ConfigError
from rlserve.server.mapping_function import as_two_argument


def test_rllibs_setup_calls_are_taken() -> None:
    config = (
        PPOConfig()
        .framework("torch", eager_tracing=True)
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .environment("CartPole-v1", disable_env_checking=True)
        .rollouts(num_rollout_workers=0, num_envs_per_worker=3, rollout_fragment_length=50)
        .resources(num_gpus=0)
        .evaluation(evaluation_interval=2, evaluation_duration=4, evaluation_num_env_runners=1)
    )
    assert (config.num_env_runners, config.num_envs_per_env_runner) == (0, 3)
    assert config.rollout_fragment_length == 50
    assert config.algo_settings().device == "cpu"
    assert (config.evaluation_interval, config.evaluation_duration) == (2, 4)
    assert DQNConfig().resources(num_gpus=1).algo_settings().device == "cuda"
    assert PPOConfig().rollouts(num_workers=0).num_env_runners == 0
    assert PPOConfig().evaluation(evaluation_interval=0).evaluation_interval is None  # RLlib's off
    numpy_ints = PPOConfig().debugging(seed=np.int64(3)).training(min_env_steps_per_iteration=4e3)
    assert (numpy_ints.seed, numpy_ints.min_env_steps_per_iteration) == (3, 4000)


MISTAKES: dict[str, tuple[Any, str]] = {
    "another framework": (
        lambda: PPOConfig().framework("tf2"),
        r"framework\('tf2'\): rlserve learns with PyTorch only",
    ),
    "an RLlib name renamed": (
        lambda: PPOConfig().env_runners(num_rollout_workers=2),  # type: ignore[call-arg]
        r"env_runners\(\): no setting 'num_rollout_workers'; in rlserve it is num_env_runners",
    ),
    "a misspelt setting": (
        lambda: SACConfig().debugging(sed=1),  # type: ignore[call-arg]
        r"debugging\(\): no setting 'sed'; did you mean seed\? \(it takes: seed\)",
    ),
    "a positional setting": (
        lambda: PPOConfig().training(0.1),  # type: ignore[call-arg]
        r"training\(\): pass its settings by name",
    ),
    "a string of policies": (
        lambda: PPOConfig().multi_agent(policies="main"),
        r"pass the policy ids as a list or set",
    ),
    "a mapping that is no mapping": (
        lambda: PPOConfig().multi_agent(policy_mapping=5),
        r"policy_mapping=5\): pass \{agent id or pattern: policy id\}",
    ),
    "a policy to train that is not declared": (
        lambda: PPOConfig().multi_agent(policies=["a"], policies_to_train=["c"]),
        r"policies_to_train=\.\.\.\) names \['c'\]",
    ),
    "policies to train as a function": (
        lambda: PPOConfig().multi_agent(policies_to_train=lambda pid, batch: True),
        r"pass the ids of the policies that learn as a list",
    ),
    "a seed that is not a number": (
        lambda: PPOConfig().debugging(seed="x"),  # type: ignore[arg-type]
        r"seed must be a whole number, 0 or more, got 'x'",
    ),
    "an empty iteration": (
        lambda: PPOConfig().training(min_env_steps_per_iteration=0),
        r"min_env_steps_per_iteration must be a whole number of env steps, 1 or more",
    ),
    "no checkpoint kept": (
        lambda: PPOConfig().reporting(keep_checkpoints=0),
        r"keep_checkpoints must be a whole number, 1 or more, got 0",
    ),
    "a fractional evaluation": (
        lambda: PPOConfig().evaluation(evaluation_duration=2.5),  # type: ignore[arg-type]
        r"evaluation_duration must be a whole number of episodes",
    ),
    "evaluation in steps": (
        lambda: PPOConfig().evaluation(evaluation_duration_unit="timesteps"),
        r"rlserve evaluates whole episodes; pass 'episodes'",
    ),
    "negative GPUs": (lambda: PPOConfig().resources(num_gpus=-1), r"num_gpus must be 0 or more"),
    "a rollouts() setting": (
        lambda: PPOConfig().rollouts(num_rollout_worker=1),
        r"^rollouts\(\): no setting 'num_rollout_worker'",
    ),
    "GPUs for env runners": (
        lambda: PPOConfig().env_runners(num_gpus_per_worker=1),  # type: ignore[call-arg]
        r"in rlserve it is nothing: its env runners act with a numpy copy",
    ),
    "evaluation without an environment": (
        lambda: (
            PPOConfig()
            .environment(observation_space=OBS1, action_space=gym.spaces.Discrete(2))
            .serving(port=0)
            .evaluation(evaluation_interval=1)
            .build()
        ),
        r"without an environment has nothing to evaluate on",
    ),
    "a policy to train of an Algorithm without policies": (
        lambda: PPOConfig().environment("CartPole-v1").multi_agent(policies_to_train=["x"]).build(),
        r"names \['x'\], which are not policies of this Algorithm \(\['default'\]\)",
    ),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_a_mistake_in_a_builder_call_names_the_fix(case: str) -> None:
    call, message = MISTAKES[case]
    with pytest.raises(ConfigError, match=message):
        call()


def rllib_mapping(agent_id: str, episode: Any, worker: Any, **kwargs: Any) -> str:
    """RLlib's older API stack's form: ``worker`` without a default."""
    assert worker is None and episode is None
    return agent_id


def test_rllibs_mapping_function_forms_are_called_as_rlserve_calls_them() -> None:
    assert as_two_argument(rllib_mapping)("a", None) == "a"
    assert as_two_argument(lambda agent_id, episode, **kw: kw["worker"])("a", None) is None
    plain = lambda agent_id, episode: agent_id  # noqa: E731
    assert as_two_argument(plain) is plain


@pytest.mark.timeout(120)
def test_a_policy_left_out_of_policies_to_train_acts_but_never_learns(tmp_path: Path) -> None:
    config = (
        PPOConfig()
        .environment(Mimic)
        .training(
            train_batch_size=128,
            minibatch_size=64,
            num_epochs=2,
            model={"fcnet_hiddens": [8]},
            min_env_steps_per_iteration=256,
        )
        .multi_agent(
            policies={"a": {}, "b": {}},
            policy_mapping_fn=rllib_mapping,
            policies_to_train=["a"],
        )
        .evaluation(evaluation_interval=2, evaluation_duration=2)
        .resources(num_gpus=0)
        .debugging(seed=3)
    )
    with config.build() as algo:
        first = algo.train()
        second = algo.train()
        assert algo.learners["a"].counters()["updates"] > 0
        assert algo.learners["b"].counters()["updates"] == 0
        folder = algo.save(tmp_path / "checkpoint")
    assert "evaluation" not in first  # every second iteration
    assert second["evaluation"]["env_runners"]["num_episodes"] == 2
    with Algorithm.from_checkpoint(folder, trust_code=True) as again:  # config keeps both
        assert again.config.policies_to_train == {"a"}
        assert again.config.evaluation_interval == 2
        assert [pid for pid, spec in again.specs.items() if spec.frozen] == ["b"]
