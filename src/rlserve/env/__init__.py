"""Hosted environments: every environment type becomes one :class:`EnvSource` (poll/send)."""

from rlserve.env.base import (
    ALL_AGENTS,
    SINGLE_AGENT,
    EnvId,
    EnvSource,
    Poll,
    StepBatch,
    VectorEnvSource,
)
from rlserve.env.external import (
    ExternalEnv,
    ExternalEnvSource,
    ExternalMultiAgentEnv,
    ExternalPoll,
)
from rlserve.env.multi_agent import MultiAgentEnv, MultiAgentSource
from rlserve.env.pettingzoo import ParallelPettingZooEnv, PettingZooEnv, from_pettingzoo

__all__ = [
    "ALL_AGENTS",
    "SINGLE_AGENT",
    "EnvId",
    "EnvSource",
    "ExternalEnv",
    "ExternalEnvSource",
    "ExternalMultiAgentEnv",
    "ExternalPoll",
    "MultiAgentEnv",
    "MultiAgentSource",
    "ParallelPettingZooEnv",
    "PettingZooEnv",
    "Poll",
    "StepBatch",
    "VectorEnvSource",
    "from_pettingzoo",
]
