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
from rlserve.env.make import EnvContext, EnvSpec, env_creator, make_env
from rlserve.env.subprocess import ProcessVectorSource
from rlserve.env.vector import InProcessVectorSource

__all__ = [
    "ALL_AGENTS",
    "SINGLE_AGENT",
    "EnvContext",
    "EnvId",
    "EnvSource",
    "EnvSpec",
    "InProcessVectorSource",
    "Poll",
    "ProcessVectorSource",
    "StepBatch",
    "VectorEnvSource",
    "env_creator",
    "make_env",
    "to_source",
]
