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

__all__ = [
    "ALL_AGENTS",
    "SINGLE_AGENT",
    "EnvId",
    "EnvSource",
    "Poll",
    "StepBatch",
    "VectorEnvSource",
]
