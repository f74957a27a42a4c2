"""RLlib's builder calls that rlserve has one answer for, so that an RLlib script runs as it is.

``framework("torch")`` (rlserve learns with PyTorch), ``api_stack(...)`` (RLlib's switch between
its old and new code paths; rlserve has one), and ``rollouts(...)``, RLlib's older name of
``env_runners(...)`` with its older setting names. Anything that would change what is trained
is refused with the fix, never dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from rlserve.algorithm.builder_arguments import builder
from rlserve.errors import ConfigError

logger = logging.getLogger("rlserve.algorithm")

_Config = TypeVar("_Config", bound="RLlibCompatConfig")

FRAMEWORK_TUNING = frozenset(
    {
        "eager_tracing",
        "eager_max_retraces",
        "tf_session_args",
        "local_tf_session_args",
        "torch_compile_learner",
        "torch_compile_learner_what_to_compile",
        "torch_compile_learner_dynamo_backend",
        "torch_compile_learner_dynamo_mode",
        "torch_compile_worker",
        "torch_compile_worker_dynamo_backend",
        "torch_compile_worker_dynamo_mode",
        "torch_ddp_kwargs",
        "torch_skip_nan_gradients",
    }
)
"""``framework()`` options that tune how RLlib's own learners run, not what they learn."""

ROLLOUTS_NAMES = {
    "num_rollout_workers": "num_env_runners",
    "num_workers": "num_env_runners",
    "num_envs_per_worker": "num_envs_per_env_runner",
}
"""``rollouts()`` settings that ``env_runners()`` calls otherwise."""


class RLlibCompatConfig:
    """RLlib's builder calls that change nothing here, or map onto another call."""

    env_runners: Callable[..., Any]  # EnvRunnersConfig's

    @builder
    def framework(self: _Config, framework: str | None = "torch", **options: Any) -> _Config:
        """RLlib's deep-learning framework: rlserve learns with PyTorch, so only ``"torch"``.

        RLlib's tuning options of its own learners (``eager_tracing``, ``torch_compile_*``...)
        are accepted and have no effect here (a warning names them).

        Raises:
            ConfigError: Another framework (``"tf"``, ``"tf2"``, ``"jax"``), or an option that
                is not one of RLlib's.
        """
        if framework not in (None, "torch"):
            raise ConfigError(
                f"framework('{framework}'): rlserve learns with PyTorch only; pass 'torch' or "
                "drop .framework(...)"
            )
        unknown = sorted(set(options) - FRAMEWORK_TUNING)
        if unknown:
            raise ConfigError(f"framework(): no option {', '.join(unknown)}")
        if options:
            logger.warning(
                "framework(%s): RLlib's tuning of its own learners; rlserve's learners ignore it",
                ", ".join(sorted(options)),
            )
        return self

    @builder
    def api_stack(
        self: _Config,
        enable_rl_module_and_learner: bool | None = None,
        enable_env_runner_and_connector_v2: bool | None = None,
    ) -> _Config:
        """RLlib's switch between its old and new code paths; rlserve has one: no effect."""
        return self

    def rollouts(self: _Config, **settings: Any) -> _Config:
        """RLlib's older name of :meth:`env_runners`, with its older setting names.

        ``num_rollout_workers`` (or ``num_workers``) is ``num_env_runners`` and
        ``num_envs_per_worker`` is ``num_envs_per_env_runner``; the other settings keep their
        names.
        """
        renamed = {ROLLOUTS_NAMES.get(name, name): value for name, value in settings.items()}
        try:
            return self.env_runners(**renamed)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("env_runners()", "rollouts()", 1)) from None
