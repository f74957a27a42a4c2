"""The action distribution: its parts, its flat action layout, its sampling and log-probability.

An :class:`ActionDistribution` is made of independent parts (:class:`ActionPart`);
:mod:`rlserve.policy.space_distribution` says which one a policy acts with in an action space.
The torch model, the numpy policy (server and client), the model spec in the weights message,
the fragment checker, the episode recording and the ONNX export all take it from here.

Every part reads ``size`` consecutive outputs of the actor (``params``): a categorical part's
logits, a Bernoulli part's logits, a Gaussian part's means (its standard deviations come from
the array ``log_std``, one per Gaussian value, in part order). The log-probability of an action
is the sum over parts.

A ``squashed_gaussian`` part (SAC's) reads ``2 * size`` outputs (see
:mod:`rlserve.policy.gaussian`); an ``epsilon_greedy`` distribution's one categorical part reads
action values, not logits (see :mod:`rlserve.policy.greedy`).

A Gaussian part may act in *normalised* units (PPO's ``normalize_actions``,
:func:`~rlserve.policy.space_distribution.normalized_box_actions`): the distribution's ``scale`` and
``bias`` give, per action column, the affine map from the unit the network works in to the space's
units, ``value = bias + scale * u`` (``scale = (high - low) / 2``, ``bias = (high + low) / 2`` for a
Box value with finite bounds, so ``[-1, 1]`` covers the Box; 1 and 0 elsewhere). The network's means
and ``log_std`` are then in normalised units: a sample is ``u = mean + exp(log_std) * e`` and its
column holds ``bias + scale * u`` (in the space's units, unclipped); the log-probability is the
density of ``u`` (not of the scaled value: the two differ by the constant ``sum(log(scale))``), and
the log-probability of a column value ``a`` is that of ``u = (a - bias) / scale``. Without ``scale``
(empty) every Gaussian value is in the space's units, as before normalised actions existed.

An action travels inside rlserve (fragments, ``report_samples``, the learner) in one of two
layouts. A ``categorical`` distribution uses ``[T]`` int64 choice indices (the value minus the
space's ``start``). Every other kind uses ``[T, A]`` float32, ``A`` = :attr:`action_width`: a
categorical part takes one column (its choice index, a whole number), a Bernoulli part one
column per bit (0 or 1), a Gaussian part one column per value (unclipped, as sampled). The
environment's value is ``clip(column + offset, low, high)`` per column, reshaped to the space's
form by :func:`rlserve.policy.action_layout.actions_to_space`.

Needs numpy only, never torch: the client uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlserve.errors import SpaceError
from rlserve.policy.gaussian import LOG_2PI, squashed_log_prob, squashed_sample
from rlserve.policy.greedy import epsilon_greedy_choices, epsilon_greedy_log_prob

PART_KINDS = ("categorical", "bernoulli", "gaussian", "squashed_gaussian")
"""The kinds of part a distribution is made of."""

DISTRIBUTION_KINDS = (
    "categorical",
    "gaussian",
    "multi_categorical",
    "bernoulli",
    "composite",
    "squashed_gaussian",
    "epsilon_greedy",
)
"""The values of :attr:`ActionDistribution.kind` (and of the model spec's ``distribution``)."""

MAX_ACTION_PARAMS = 65_536
"""Most actor outputs an action space may need (sum of choices, bits and Box values)."""


@dataclass(frozen=True, slots=True)
class ActionPart:
    """One independent factor of an action distribution.

    Attributes:
        kind: ``categorical``, ``bernoulli``, ``gaussian`` or ``squashed_gaussian``.
        size: Choices (categorical), bits (Bernoulli) or values (Gaussian, squashed Gaussian).
    """

    kind: str
    size: int

    @property
    def param_size(self) -> int:
        """Actor outputs the part reads: ``size``, twice that for a squashed Gaussian."""
        return 2 * self.size if self.kind == "squashed_gaussian" else self.size

    @property
    def action_width(self) -> int:
        """Columns the part takes in a ``[T, A]`` action: 1 for a categorical part."""
        return 1 if self.kind == "categorical" else self.size


@dataclass(frozen=True, slots=True)
class ActionDistribution:
    """An action space's distribution and its flat action layout.

    Attributes:
        kind: One of :data:`DISTRIBUTION_KINDS`.
        parts: The independent factors, in actor-output and action-column order.
        offsets: Per action column, added to the column to give the environment's value (the
            ``start`` of a Discrete or MultiDiscrete space; 0 elsewhere).
        low: Per action column, the lower bound the environment's value is clipped to
            (``-inf`` for discrete columns and unbounded Box values).
        high: Per action column, the upper bound, as ``low``.
        epsilon: ``epsilon_greedy`` only: the probability of a uniformly random choice.
        scale: Per action column, the factor from a Gaussian value's normalised units to the
            space's units (see the module doc); empty when no column is normalised. Columns
            that are not Gaussian have 1.
        bias: Per action column, the value added after ``scale``; empty with ``scale``, 0 for
            columns that are not Gaussian.
    """

    kind: str
    parts: tuple[ActionPart, ...]
    offsets: tuple[int, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    epsilon: float = 0.0
    scale: tuple[float, ...] = ()
    bias: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in DISTRIBUTION_KINDS:
            raise SpaceError(
                f"unknown distribution '{self.kind}'; known: {', '.join(DISTRIBUTION_KINDS)}"
            )
        if not self.parts:
            raise SpaceError("an action distribution needs at least one part")
        for part in self.parts:
            if part.kind not in PART_KINDS or part.size < 1:
                raise SpaceError(f"bad action part {part}; kinds are {', '.join(PART_KINDS)}")
        width = self.action_width
        if not len(self.offsets) == len(self.low) == len(self.high) == width:
            raise SpaceError(
                f"offsets, low and high need {width} values each (one per action column); got "
                f"{len(self.offsets)}, {len(self.low)}, {len(self.high)}"
            )
        squashed = [p.kind == "squashed_gaussian" for p in self.parts]
        if any(squashed) and (self.kind != "squashed_gaussian" or len(self.parts) != 1):
            raise SpaceError(
                "a squashed_gaussian part stands alone, in a squashed_gaussian distribution"
            )
        if self.kind == "squashed_gaussian" and not all(squashed):
            raise SpaceError("a squashed_gaussian distribution has one squashed_gaussian part")
        if self.kind == "squashed_gaussian":
            low, high = np.asarray(self.low), np.asarray(self.high)
            if not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
                raise SpaceError(
                    "a squashed Gaussian scales to the Box's bounds: they must be finite with "
                    "low < high"
                )
        if self.kind == "epsilon_greedy" and (
            len(self.parts) != 1 or self.parts[0].kind != "categorical"
        ):
            raise SpaceError("an epsilon_greedy distribution has one categorical part")
        if not 0.0 <= self.epsilon <= 1.0:
            raise SpaceError(f"epsilon must be within [0, 1], got {self.epsilon}")
        self._check_scaling(width)
        if self.param_dim > MAX_ACTION_PARAMS:
            raise SpaceError(
                f"the action space needs {self.param_dim} actor outputs; the limit is "
                f"{MAX_ACTION_PARAMS}"
            )

    def _check_scaling(self, width: int) -> None:
        if not self.scale and not self.bias:
            return
        if len(self.scale) != width or len(self.bias) != width:
            raise SpaceError(
                f"action scale and bias need {width} values each (one per action column); got "
                f"{len(self.scale)} and {len(self.bias)}"
            )
        scale = np.asarray(self.scale, dtype=np.float64)
        bias = np.asarray(self.bias, dtype=np.float64)
        if not (np.isfinite(scale).all() and np.isfinite(bias).all() and (scale > 0).all()):
            raise SpaceError("action scale must be finite and positive, action bias finite")
        for column, (kind, _) in enumerate(self.column_kinds()):
            if kind != "gaussian" and (scale[column] != 1.0 or bias[column] != 0.0):
                raise SpaceError(
                    f"action column {column} is {kind}: only Gaussian columns are scaled (its "
                    "scale must be 1 and its bias 0)"
                )

    @property
    def scaled(self) -> bool:
        """True when Gaussian values act in normalised units (``scale`` is given)."""
        return bool(self.scale)

    def to_normalized(self, actions: np.ndarray) -> np.ndarray:
        """``[N, A]`` column values in the network's units: ``(a - bias) / scale`` (float64).

        Columns that are not scaled come back as they are (as float64).
        """
        values = np.asarray(actions, dtype=np.float64)
        if not self.scale:
            return values
        return (values - np.asarray(self.bias)) / np.asarray(self.scale)

    @property
    def param_dim(self) -> int:
        """Width of the actor's output."""
        return sum(p.param_size for p in self.parts)

    @property
    def action_width(self) -> int:
        """``A`` of the ``[T, A]`` layout (1 for ``categorical``, whose layout is ``[T]``)."""
        return sum(p.action_width for p in self.parts)

    @property
    def gaussian_dim(self) -> int:
        """Number of Gaussian values, the length of ``log_std``."""
        return sum(p.size for p in self.parts if p.kind == "gaussian")

    @property
    def scalar(self) -> bool:
        """True when actions are ``[T]`` int64 choice indices rather than ``[T, A]`` float32."""
        return self.kind in ("categorical", "epsilon_greedy")

    @property
    def discrete(self) -> bool:
        """True when no part is Gaussian (every column holds a whole number)."""
        return all(p.kind in ("categorical", "bernoulli") for p in self.parts)

    def column_kinds(self) -> list[tuple[str, int]]:
        """Per action column, its part's kind and the number of values it may take (0: real)."""
        columns: list[tuple[str, int]] = []
        for part in self.parts:
            if part.kind == "categorical":
                columns.append(("categorical", part.size))
            elif part.kind == "bernoulli":
                columns.extend([("bernoulli", 2)] * part.size)
            else:
                columns.extend([(part.kind, 0)] * part.size)
        return columns

    def check_actions(self, actions: np.ndarray, steps: int) -> str:
        """Why ``actions`` is not a valid ``[steps, A]`` action array, or ``""`` when it is.

        Discrete columns must hold whole choice indices ``0..n-1`` (0 or 1 for a bit); Gaussian
        columns must be finite.
        """
        if actions.shape != (steps, self.action_width):
            return f"actions must have shape ({steps}, {self.action_width}); got {actions.shape}"
        if actions.dtype.kind not in "biuf":
            return f"actions must hold numbers, got {actions.dtype}"
        values = actions.astype(np.float64, copy=False)
        if not np.isfinite(values).all():
            return "actions must be finite"
        column = 0
        for part in self.parts:
            block = values[:, column : column + part.action_width]
            column += part.action_width
            if part.kind in ("gaussian", "squashed_gaussian"):
                continue
            top = part.size - 1 if part.kind == "categorical" else 1
            bad = (block != np.round(block)) | (block < 0) | (block > top)
            if bad.any():
                return (
                    f"actions column {column - part.action_width + int(np.argwhere(bad)[0][1])} "
                    f"holds {block[bad][0]}; a {part.kind} column takes whole numbers 0..{top}"
                )
        return ""

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """``[N, A]`` actions as the environment takes them: offset, then clipped (float64)."""
        env = actions.astype(np.float64) + np.asarray(self.offsets, dtype=np.float64)
        return np.clip(env, self.low, self.high)

    def sample(
        self,
        params: np.ndarray,
        log_std: np.ndarray | None,
        rng: np.random.Generator,
        explore: bool,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sample (or take the mode of) ``[N, A]`` float32 actions and their log-probabilities.

        Args:
            params: ``[N, param_dim]`` actor outputs.
            log_std: ``[gaussian_dim]`` log standard deviations (None when there are none).
            rng: The sampling generator.
            explore: Sample when True; take each part's mode when False.
        """
        if self.kind == "squashed_gaussian":
            return squashed_sample(params, self.low, self.high, rng, explore)
        n = params.shape[0]
        if self.kind == "epsilon_greedy":
            choices = epsilon_greedy_choices(params, self.epsilon, rng, explore)
            actions = choices.astype(np.float32)[:, None]
            return actions, self.log_prob(params, log_std, actions)
        actions = np.empty((n, self.action_width), dtype=np.float32)
        column = param = gauss = 0
        for part in self.parts:
            x = params[:, param : param + part.size].astype(np.float64)
            if part.kind == "categorical":
                if explore:
                    shifted = x - x.max(axis=1, keepdims=True)
                    cdf = np.cumsum(np.exp(shifted), axis=1)
                    u = rng.random(n) * cdf[:, -1]
                    choice = np.minimum((cdf < u[:, None]).sum(axis=1), part.size - 1)
                else:
                    choice = x.argmax(axis=1)
                actions[:, column] = choice
            elif part.kind == "bernoulli":
                bits = rng.random(x.shape) < 1.0 / (1.0 + np.exp(-x)) if explore else x > 0
                actions[:, column : column + part.size] = bits
            else:
                assert log_std is not None
                std = np.exp(log_std[gauss : gauss + part.size].astype(np.float64))
                noise = rng.standard_normal(x.shape) if explore else np.zeros_like(x)
                value = x + std * noise
                if self.scale:
                    cols = slice(column, column + part.size)
                    value = np.asarray(self.bias[cols]) + np.asarray(self.scale[cols]) * value
                actions[:, column : column + part.size] = value
                gauss += part.size
            column += part.action_width
            param += part.size
        return actions, self.log_prob(params, log_std, actions)

    def log_prob(
        self, params: np.ndarray, log_std: np.ndarray | None, actions: np.ndarray
    ) -> np.ndarray:
        """Log-probability (density for Gaussian parts) of ``[N, A]`` actions, ``[N]`` float32."""
        if self.kind == "squashed_gaussian":
            return squashed_log_prob(params, self.low, self.high, actions)
        n = params.shape[0]
        if self.kind == "epsilon_greedy":
            return epsilon_greedy_log_prob(params, self.epsilon, actions.reshape(n))
        total = np.zeros(n, dtype=np.float64)
        column = param = gauss = 0
        values = self.to_normalized(actions)
        for part in self.parts:
            x = params[:, param : param + part.size].astype(np.float64)
            a = values[:, column : column + part.action_width]
            if part.kind == "categorical":
                top = x.max(axis=1, keepdims=True)
                lse = top[:, 0] + np.log(np.exp(x - top).sum(axis=1))
                total += x[np.arange(n), a[:, 0].astype(np.int64)] - lse
            elif part.kind == "bernoulli":
                total += (a * x - np.logaddexp(0.0, x)).sum(axis=1)
            else:
                assert log_std is not None
                ls = log_std[gauss : gauss + part.size].astype(np.float64)
                z = (a - x) / np.exp(ls)
                total += -0.5 * (z**2).sum(axis=1) - ls.sum() - 0.5 * LOG_2PI * part.size
                gauss += part.size
            column += part.action_width
            param += part.size
        return total.astype(np.float32)
