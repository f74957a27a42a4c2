"""From an :class:`~rlserve.algorithm.AlgorithmConfig` to the source it samples and its policies."""

from __future__ import annotations

from typing import Any

from rlserve.algorithm.config import AlgorithmConfig
from rlserve.cluster import use_ray
from rlserve.cluster.envs import ray_env_group
from rlserve.env.base import SINGLE_AGENT, EnvSource
from rlserve.env.convert import to_source
from rlserve.errors import ConfigError, RLServeError
from rlserve.experience.agent_values import PolicyTable
from rlserve.learners.registry import algorithm
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.spaces import describe
from rlserve.server.mapping_function import as_two_argument
from rlserve.server.policies import PolicySpec


def make_source(
    config: AlgorithmConfig, seed: int, evaluation: bool = False, worker_index: int = 0
) -> EnvSource:
    """The environments of one runner (one copy in process for evaluation).

    ``worker_index`` is the runner's number in the copies' :class:`~rlserve.env.EnvContext`
    (0: the Algorithm's own process, 1..N: env-runner processes, as in RLlib). With
    ``remote_worker_envs`` the copies run in sub-processes, or in Ray actors when Ray is the
    backend (:mod:`rlserve.cluster.envs`), here or inside a Ray env runner.
    """
    options: dict[str, Any] = {}
    remote = config.remote_worker_envs and not evaluation
    if remote:
        options["step_timeout"] = config.step_timeout_s
        options["envs_per_process"] = config.envs_per_process
        if use_ray(config.env_runner_backend):
            options["supervise"] = ray_env_group(
                config.num_cpus_per_remote_env, config.custom_resources_per_remote_env
            )
    return to_source(
        config.env,
        config.env_config,
        num_envs=1 if evaluation else config.num_envs_per_env_runner,
        remote=remote,
        seed=seed,
        worker_index=worker_index,
        **options,
    )


def source_policies(
    config: AlgorithmConfig, source: EnvSource
) -> tuple[dict[str, PolicySpec], PolicyMapping | None]:
    """The policies to train (with the spaces of the agents they act for) and the mapping.

    A single-agent source has the one policy ``default``. A multi-agent source without
    ``multi_agent(policies=...)`` shares ``default`` among all its agents; with it, each
    agent's policy comes from ``policy_mapping`` rules or ``policy_mapping_fn`` (asked once per
    agent id the source declares). Each policy's spaces are checked against its algorithm.

    Raises:
        ConfigError, UnsupportedSpaceError: A policy has no agent, agents of different spaces,
            or spaces its algorithm cannot learn (the message names the policy and the
            algorithms that can).
    """
    agents = list(source.observation_spaces)
    declared = config.policies or {DEFAULT_POLICY_ID: {}}
    config.check_policies_to_train(declared)
    if not source.multi_agent:
        if len(declared) != 1:
            raise ConfigError(
                "a single-agent environment trains one policy; drop multi_agent(policies=...)"
            )
        pid = next(iter(declared))
        agent_of = {SINGLE_AGENT: pid}
        rules: list[tuple[str, str]] = []
    else:
        rules = list(config.policy_mapping)
        if config.policy_mapping_fn is not None:
            mapping_fn = as_two_argument(config.policy_mapping_fn)
            for agent_id in agents:
                policy_id = mapping_fn(agent_id, None)
                if policy_id not in declared:
                    raise ConfigError(
                        f"policy_mapping_fn maps the agent '{agent_id}' to '{policy_id}', which "
                        f"multi_agent(policies=...) does not declare ({sorted(declared)})"
                    )
                rules.append((agent_id, str(policy_id)))
        mapping = PolicyMapping(rules, declared)
        agent_of = {agent_id: mapping.resolve(agent_id) for agent_id in agents}
    specs: dict[str, PolicySpec] = {}
    for pid, overrides in declared.items():
        users = [a for a, p in agent_of.items() if p == pid]
        if not users:
            raise ConfigError(
                f"no agent of the environment maps to the policy '{pid}' (agents: {agents})"
            )
        obs_space = source.observation_spaces[users[0]]
        act_space = source.action_spaces[users[0]]
        for other in users[1:]:
            if (
                source.observation_spaces[other] != obs_space
                or source.action_spaces[other] != act_space
            ):
                raise ConfigError(
                    f"the agents '{users[0]}' and '{other}' both map to the policy '{pid}' but "
                    "have different spaces; give them separate policies"
                )
        spec = PolicySpec(
            pid,
            obs_space,
            act_space,
            dict(overrides),
            frozen=not config.trains(pid),
            algo=config.policy_algorithms.get(pid),
        )
        try:
            algorithm(spec.algorithm_of(config.algo_name)).check(obs_space, act_space)
        except RLServeError as exc:
            if spec.plain:
                raise
            raise type(exc)(f"policy '{pid}': {exc}") from None
        specs[pid] = spec
    mapping_out = PolicyMapping(rules, declared) if source.multi_agent else None
    return specs, mapping_out


def policy_table(
    specs: dict[str, PolicySpec],
    mapping: PolicyMapping | None,
    frame_stacks: dict[str, int] | None = None,
) -> PolicyTable:
    """The collector's view of the policies (the form a server's ``welcome`` gives a client)."""
    stacks = {pid: n for pid, n in (frame_stacks or {}).items() if n > 1}
    welcome = {
        "policies": {
            pid: {
                "observation_space": describe(s.observation_space),
                "action_space": describe(s.action_space),
                **({"frame_stack": stacks[pid]} if pid in stacks else {}),
            }
            for pid, s in specs.items()
        },
        "mapping": None if mapping is None else mapping.to_wire(),
        "multi_agent": True,
    }
    return PolicyTable(welcome)
