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
from rlserve.env.convert import to_source
from rlserve.env.external import ExternalEnv, ExternalMultiAgentEnv
from rlserve.env.external_source import ExternalEnvSource, ExternalPoll
from rlserve.env.frame_stack import FrameStack, FrameStacker
from rlserve.env.make import EnvContext, EnvSpec, env_creator, make_env
from rlserve.env.multi_agent import MultiAgentEnv, MultiAgentSource
from rlserve.env.pettingzoo import ParallelPettingZooEnv, PettingZooEnv, from_pettingzoo
from rlserve.env.stateless_cartpole import StatelessCartPole
from rlserve.env.subprocess import ProcessVectorSource
from rlserve.env.subprocess_multi import ProcessMultiAgentSource
from rlserve.env.vector import InProcessVectorSource
from rlserve.env.versus import VersusOpponent, uniform_legal

__all__ = [
    "ALL_AGENTS",
    "SINGLE_AGENT",
    "EnvContext",
    "EnvId",
    "EnvSource",
    "EnvSpec",
    "ExternalEnv",
    "ExternalEnvSource",
    "ExternalMultiAgentEnv",
    "ExternalPoll",
    "FrameStack",
    "FrameStacker",
    "InProcessVectorSource",
    "MultiAgentEnv",
    "MultiAgentSource",
    "ParallelPettingZooEnv",
    "PettingZooEnv",
    "Poll",
    "ProcessMultiAgentSource",
    "ProcessVectorSource",
    "StatelessCartPole",
    "StepBatch",
    "VectorEnvSource",
    "VersusOpponent",
    "env_creator",
    "from_pettingzoo",
    "make_env",
    "to_source",
    "uniform_legal",
]
