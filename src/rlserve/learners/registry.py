"""Every learning algorithm rlserve has, by name: the one place the other parts choose from.

The server's learner process, the Algorithm API, ``rlserve serve/train --algo``, the demo and
the export look an algorithm up here: its settings dataclass (torch-free: the serving process
and ``--help`` read it), its learner class (imported only when one is built, so torch stays out
of the serving process), whether it learns off-policy, and which action spaces it can learn.
The action distribution a learner publishes travels in its :class:`~rlserve.policy.ModelSpec`
(``distribution``), which the numpy policy and the ONNX export read; the learner chooses it
from the action space and its algorithm.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from rlserve.errors import ConfigError, RLServeError, UnsupportedSpaceError
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.sac_config import SACSettings, check_sac_spaces
from rlserve.policy.frame_stacking import stacked_space
from rlserve.policy.space_distribution import check_learnable

if TYPE_CHECKING:
    from rlserve.learners.base import Learner

DEFAULT_ALGORITHM = "ppo"
"""The algorithm of a run that names none (every run before ``--algo`` existed)."""


@dataclass(frozen=True)
class AlgorithmEntry:
    """One algorithm: its name, settings, learner and what it can learn.

    Attributes:
        name: Its name (``--algo NAME``, the config table ``[NAME]``).
        settings: Its settings dataclass (torch-free; every field an ``option`` with help).
        learner: ``module:Class`` of its :class:`~rlserve.learners.base.Learner`, built as
            ``Class(observation_space, action_space, settings)``.
        off_policy: It learns from replayed experience (any behaviour policy's); on-policy
            algorithms weight stale or logged steps instead.
        summary: One line for ``--help`` and errors.
        check_spaces: Raises :class:`~rlserve.errors.UnsupportedSpaceError` (or
            :class:`ConfigError`) for spaces it cannot learn; :meth:`check` adds the
            algorithms that can.
        update_metrics: Names (``learner/<name>`` without the prefix) of the statistics of
            one update it reports: NaN until its first update; with several policies the
            server's total is the newest update's.
        counter_metrics: Names of the counters it reports: 0 until its first update; with
            several policies the server's total is their sum.
    """

    name: str
    settings: type[Any]
    learner: str
    off_policy: bool
    summary: str
    check_spaces: Callable[[gym.Space[Any], gym.Space[Any]], Any]
    update_metrics: tuple[str, ...] = ()
    counter_metrics: tuple[str, ...] = ()

    def fits(self, observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> bool:
        """Whether it can learn these spaces."""
        try:
            self.check_spaces(observation_space, action_space)
        except RLServeError:
            return False
        return True

    def check(self, observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> Any:
        """Refuse spaces it cannot learn, naming the algorithms that can (the fix).

        Returns:
            What ``check_spaces`` returns (the action distribution).

        Raises:
            UnsupportedSpaceError: It cannot learn these spaces.
        """
        try:
            return self.check_spaces(observation_space, action_space)
        except UnsupportedSpaceError as exc:
            others = [
                e.name
                for e in ALGORITHMS.values()
                if e is not self and e.fits(observation_space, action_space)
            ]
            if others:
                hint = f"the algorithms that learn these spaces: {', '.join(others)}"
            else:
                hint = "no algorithm of rlserve learns these spaces"
            raise UnsupportedSpaceError(f"{exc}; {hint}") from None

    def learner_class(self) -> type[Learner]:
        """Import and return the learner class (this imports torch)."""
        module_name, _, class_name = self.learner.partition(":")
        cls: type[Learner] = getattr(importlib.import_module(module_name), class_name)
        return cls

    def make_learner(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any], settings: Any
    ) -> Learner:
        """A fresh learner for these spaces (one frame's, stacked by ``settings.frame_stack``).

        Raises:
            ConfigError: ``settings`` is not its settings dataclass.
            UnsupportedSpaceError: The algorithm cannot learn these spaces.
        """
        if not isinstance(settings, self.settings):
            raise ConfigError(
                f"{self.name} takes {self.settings.__name__}, got {type(settings).__name__}"
            )
        frames = getattr(settings, "frame_stack", 1)
        if frames > 1:
            # The policy reads the last frames stacked; its clients send single frames.
            observation_space = stacked_space(observation_space, frames)
        self.check(observation_space, action_space)
        cls: Any = self.learner_class()  # concrete learners take (spaces, settings)
        learner: Learner = cls(observation_space, action_space, settings)
        return learner


ALGORITHMS: dict[str, AlgorithmEntry] = {}
"""The registered algorithms by name, in registration order."""


def register(entry: AlgorithmEntry) -> AlgorithmEntry:
    """Add an algorithm (its name must be new) and return it."""
    if entry.name in ALGORITHMS:
        raise ValueError(f"an algorithm named '{entry.name}' is registered already")
    ALGORITHMS[entry.name] = entry
    return entry


def algorithm(name: str | None) -> AlgorithmEntry:
    """The algorithm called ``name`` (None: :data:`DEFAULT_ALGORITHM`).

    Raises:
        ConfigError: No algorithm has that name; the message lists those that exist.
    """
    entry = ALGORITHMS.get(name or DEFAULT_ALGORITHM)
    if entry is None:
        known = ", ".join(f"{e.name} ({e.summary})" for e in ALGORITHMS.values())
        raise ConfigError(f"unknown algorithm '{name}'; choose one of: {known}")
    return entry


def algorithm_of_settings(settings: Any) -> AlgorithmEntry:
    """The algorithm whose settings dataclass ``settings`` is an instance of.

    Raises:
        ConfigError: No registered algorithm has that settings class.
    """
    for entry in ALGORITHMS.values():
        if type(settings) is entry.settings:
            return entry
    raise ConfigError(f"{type(settings).__name__} is the settings of no registered algorithm")


def run_algorithm(tables: dict[str, Any]) -> AlgorithmEntry:
    """The algorithm of a run folder's ``config.toml`` tables.

    ``[algorithm] name``; PPO when absent, as in every run folder before other algorithms
    existed. Its settings are the table named after it (``[ppo]``, ``[dqn]``).

    Raises:
        ConfigError: The run names an unknown algorithm, or the table has another key than
            ``name``.
    """
    table = tables.get("algorithm") or {}
    if not isinstance(table, dict):
        raise ConfigError("'algorithm' must be a table: [algorithm] with name = 'ppo' under it")
    unknown = sorted(set(table) - {"name"})
    if unknown:
        raise ConfigError(
            f"[algorithm] has the key(s) {', '.join(unknown)}; its only key is name, one of "
            f"{', '.join(ALGORITHMS)} (e.g. name = 'dqn')"
        )
    name = table.get("name")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"[algorithm] name must be a string, one of {', '.join(ALGORITHMS)}")
    return algorithm(name)


register(
    AlgorithmEntry(
        name="ppo",
        settings=PPOSettings,
        learner="rlserve.learners.ppo:PPOLearner",
        off_policy=False,
        summary="proximal policy optimisation; any action space",
        check_spaces=check_learnable,
        update_metrics=(
            "policy_loss",
            "value_loss",
            "entropy",
            "approx_kl",
            "clip_frac",
            "bc_loss",
            "behaviour_kl",
            "importance_weight_mean",
            "lag_0",
            "lag_1",
            "lag_2",
            "lag_3plus",
            "explained_variance",
        ),
        counter_metrics=(
            "steps_dropped_stale",
            "steps_dropped_cap",
            "steps_logged",
            "minibatches_skipped_nonfinite",
        ),
    )
)


def check_discrete(observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> Any:
    """:func:`check_learnable`, and refuse every action space but ``Discrete``.

    Raises:
        UnsupportedSpaceError: The spaces cannot be learned, or the actions are not Discrete.
    """
    distribution = check_learnable(observation_space, action_space)
    if not isinstance(action_space, gym.spaces.Discrete):
        raise UnsupportedSpaceError(f"dqn learns Discrete action spaces only, not {action_space}")
    return distribution


register(
    AlgorithmEntry(
        name="dqn",
        settings=DQNSettings,
        learner="rlserve.learners.dqn:DQNLearner",
        off_policy=True,
        summary="deep Q-learning (double-Q, n-step, dueling, replay); Discrete actions",
        check_spaces=check_discrete,
        update_metrics=("q_loss", "q_mean", "epsilon", "lr"),
        counter_metrics=(
            "replay_size",
            "gradient_steps",
            "env_steps_ingested",
            "gradient_steps_skipped_nonfinite",
        ),
    )
)

register(
    AlgorithmEntry(
        name="sac",
        settings=SACSettings,
        learner="rlserve.learners.sac:SACLearner",
        off_policy=True,
        summary="soft actor-critic; bounded float Box actions",
        check_spaces=check_sac_spaces,
        update_metrics=("critic_loss", "actor_loss", "alpha_loss", "alpha", "entropy", "q_mean"),
        counter_metrics=("replay_size", "gradient_steps", "gradient_steps_skipped_nonfinite"),
    )
)
