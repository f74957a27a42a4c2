"""Action distributions: the one place that says how a policy acts in an action space.

:func:`action_distribution` turns a Gymnasium action space into an :class:`ActionDistribution`;
the torch model, the numpy policy (server and client), the model spec in the weights message,
the fragment checker, the episode recording and the ONNX export all take it from here.

=====================  ==================  ===================================================
action space           ``kind``            parts (in order)
=====================  ==================  ===================================================
``Discrete(n)``        ``categorical``     one categorical part over ``n`` choices
``Box`` (float)        ``gaussian``        one diagonal Gaussian over ``prod(shape)`` values
``MultiDiscrete``      ``multi_categorical``  one categorical part per element (C order)
``MultiBinary``        ``bernoulli``       one Bernoulli part over ``prod(n)`` bits
``Dict`` / ``Tuple``   ``composite``       the parts of each member, in the space's order
``Box`` (SAC)          ``squashed_gaussian``  one tanh-squashed Gaussian over ``prod(shape)``
                                           values (:func:`squashed_gaussian_distribution`)
``Discrete(n)`` (DQN)  ``epsilon_greedy``  one categorical part over ``n`` choices
=====================  ==================  ===================================================

An ``epsilon_greedy`` distribution (:func:`epsilon_greedy`, the value-based learners') reads its
part's outputs as action values, not logits: it takes the best choice with probability
``1 - epsilon + epsilon / n`` and each other choice with ``epsilon / n`` (a uniformly random
choice with probability ``epsilon``, else the best); its mode is the best choice. ``epsilon``
travels with the weights (the model spec's ``epsilon``), as the learner's schedule moves it.

Every part reads ``size`` consecutive outputs of the actor (``params``): a categorical part's
logits, a Bernoulli part's logits, a Gaussian part's means (its standard deviations come from
the array ``log_std``, one per Gaussian value, in part order). The log-probability of an action
is the sum over parts.

A ``squashed_gaussian`` part (SAC's) reads ``2 * size`` outputs: ``size`` means, then ``size``
log standard deviations (state-dependent, clamped to ``[SQUASHED_LOG_STD_MIN,
SQUASHED_LOG_STD_MAX]``). It samples ``u ~ N(mean, std)``, squashes ``a = tanh(u)`` and scales
to the Box: ``low + (a + 1) / 2 * (high - low)``; its column holds that value, in the space's
units (as the environment takes it), and its log-density is that of the scaled action:
``sum log N(u) - sum log(1 - tanh(u)^2 + SQUASH_EPS) - sum log((high - low) / 2)``. Its mode is
``tanh(mean)``, scaled.

A Gaussian part may act in *normalised* units (PPO's ``normalize_actions``,
:func:`normalized_box_actions`): the distribution's ``scale`` and ``bias`` give, per action
column, the affine map from the unit the network works in to the space's units, ``value = bias +
scale * u`` (``scale = (high - low) / 2``, ``bias = (high + low) / 2`` for a Box value with finite
bounds, so ``[-1, 1]`` covers the Box; 1 and 0 elsewhere). The network's means and ``log_std`` are
then in normalised units: a sample is ``u = mean + exp(log_std) * e`` and its column holds ``bias
+ scale * u`` (in the space's units, unclipped); the log-probability is the density of ``u`` (not
of the scaled value: the two differ by the constant ``sum(log(scale))``), and the log-probability
of a column value ``a`` is that of ``u = (a - bias) / scale``. Without ``scale`` (empty) every
Gaussian value is in the space's units, as before normalised actions existed.

An action travels inside rlserve (fragments, ``report_samples``, the learner) in one of two
layouts. A ``categorical`` distribution uses ``[T]`` int64 choice indices (the value minus the
space's ``start``). Every other kind uses ``[T, A]`` float32, ``A`` = :attr:`action_width`: a
categorical part takes one column (its choice index, a whole number), a Bernoulli part one
column per bit (0 or 1), a Gaussian part one column per value (unclipped, as sampled). The
environment's value is ``clip(column + offset, low, high)`` per column, reshaped to the space's
form by :func:`actions_to_space`.

Needs numpy and gymnasium only, never torch: the client uses it too.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import SpaceError, UnsupportedSpaceError

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

MAX_ACTION_HALF_RANGE = 1e6
"""A Box value whose half range ``(high - low) / 2`` is larger than this is not normalised by
:func:`normalized_box_actions` (a bound such as float32's largest value stands for "unbounded":
scaling by it would overflow the samples)."""

MAX_ACTION_PARAMS = 65_536
"""Most actor outputs an action space may need (sum of choices, bits and Box values)."""

LOG_2PI = float(np.log(2.0 * np.pi))

SQUASHED_LOG_STD_MIN = -20.0
"""Lowest log standard deviation of a squashed Gaussian (the actor's output is clamped)."""

SQUASHED_LOG_STD_MAX = 2.0
"""Highest log standard deviation of a squashed Gaussian."""

SQUASH_EPS = 1e-6
"""Added to ``1 - tanh(u)^2`` in a squashed Gaussian's log-density (SAC's convention)."""


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


def _squashed_params(params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Means and clamped log standard deviations (float64) of ``[N, 2A]`` actor outputs."""
    half = params.shape[1] // 2
    mean = params[:, :half].astype(np.float64)
    log_std = np.clip(
        params[:, half:].astype(np.float64), SQUASHED_LOG_STD_MIN, SQUASHED_LOG_STD_MAX
    )
    return mean, log_std


def _squashed_logp(
    noise: np.ndarray, log_std: np.ndarray, squashed: np.ndarray, half_range: np.ndarray
) -> np.ndarray:
    """Log-density of scaled actions given the standard noise, the log-std and ``tanh(u)``."""
    gauss = -0.5 * (noise**2).sum(axis=1) - log_std.sum(axis=1) - 0.5 * LOG_2PI * noise.shape[1]
    jacobian = np.log(1.0 - squashed**2 + SQUASH_EPS).sum(axis=1) + np.log(half_range).sum()
    return gauss - jacobian


def squashed_sample(
    params: np.ndarray,
    low: tuple[float, ...],
    high: tuple[float, ...],
    rng: np.random.Generator,
    explore: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample (or take the mode of) a squashed Gaussian.

    Args:
        params: ``[N, 2A]`` actor outputs: means, then log standard deviations (clamped here).
        low: The Box's lower bounds, one per value.
        high: Its upper bounds.
        rng: The sampling generator.
        explore: Sample when True; take ``tanh(mean)`` when False.

    Returns:
        ``[N, A]`` float32 actions in the space's units and their ``[N]`` float32
        log-densities.
    """
    mean, log_std = _squashed_params(params)
    noise = rng.standard_normal(mean.shape) if explore else np.zeros_like(mean)
    squashed = np.tanh(mean + np.exp(log_std) * noise)
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    half_range = (hi - lo) / 2.0
    actions = np.clip(lo + (squashed + 1.0) * half_range, lo, hi)
    logp = _squashed_logp(noise, log_std, squashed, half_range)
    return actions.astype(np.float32), logp.astype(np.float32)


def squashed_log_prob(
    params: np.ndarray, low: tuple[float, ...], high: tuple[float, ...], actions: np.ndarray
) -> np.ndarray:
    """Log-density of ``[N, A]`` actions (in the space's units) under a squashed Gaussian.

    Actions are clipped into the Box and their squashed value to ``+-(1 - SQUASH_EPS)`` first,
    so a value on a bound has a finite (very low) density.
    """
    mean, log_std = _squashed_params(params)
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    half_range = (hi - lo) / 2.0
    x = np.clip(actions.astype(np.float64), lo, hi)
    squashed = np.clip((x - lo) / half_range - 1.0, -1.0 + SQUASH_EPS, 1.0 - SQUASH_EPS)
    noise = (np.arctanh(squashed) - mean) / np.exp(log_std)
    return _squashed_logp(noise, log_std, squashed, half_range).astype(np.float32)


def epsilon_greedy_choices(
    values: np.ndarray, epsilon: float, rng: np.random.Generator, explore: bool
) -> np.ndarray:
    """``[N]`` int64 choices from ``[N, n]`` action values, epsilon-greedily.

    The best choice, or (exploring) with probability ``epsilon`` a uniformly random one.
    Exploring always draws ``2 N`` numbers from ``rng`` (whatever ``epsilon`` is), so a seeded
    generator gives the same stream for every schedule.
    """
    greedy = values.argmax(axis=1).astype(np.int64)
    if not explore:
        return greedy
    rows, choices = values.shape
    explored = rng.random(rows) < epsilon
    random = rng.integers(0, choices, size=rows)
    return np.where(explored, random, greedy)


def epsilon_greedy_log_prob(values: np.ndarray, epsilon: float, choices: np.ndarray) -> np.ndarray:
    """``[N]`` float32 log-probabilities of ``choices`` under epsilon-greedy over ``values``.

    ``log(1 - epsilon + epsilon / n)`` for the best choice (the first of equal best ones),
    ``log(epsilon / n)`` for any other (``-inf`` when ``epsilon`` is 0).
    """
    n = values.shape[1]
    best = values.argmax(axis=1) == np.asarray(choices).astype(np.int64)
    greedy = math.log(1.0 - epsilon + epsilon / n)
    other = math.log(epsilon / n) if epsilon > 0 else -math.inf
    return np.where(best, greedy, other).astype(np.float32)


def epsilon_greedy(space: spaces.Space[Any], epsilon: float = 0.0) -> ActionDistribution:
    """The epsilon-greedy distribution over a Discrete space's choices.

    Raises:
        UnsupportedSpaceError: ``space`` is not Discrete (value-based learners need one set of
            choices to rank).
    """
    if not isinstance(space, spaces.Discrete):
        raise UnsupportedSpaceError(
            f"epsilon-greedy acting needs a Discrete action space, not {space}"
        )
    part = ActionPart("categorical", int(space.n))
    return ActionDistribution(
        "epsilon_greedy", (part,), (int(space.start),), (-math.inf,), (math.inf,), float(epsilon)
    )


def _float_bounds(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(values, dtype=np.float64).ravel()]


def _collect(
    space: spaces.Space[Any],
    parts: list[ActionPart],
    offsets: list[int],
    low: list[float],
    high: list[float],
    where: str,
) -> None:
    if isinstance(space, spaces.Discrete):
        parts.append(ActionPart("categorical", int(space.n)))
        offsets.append(int(space.start))
        low.append(-math.inf)
        high.append(math.inf)
    elif isinstance(space, spaces.MultiDiscrete):
        nvec = space.nvec.ravel()
        if nvec.size == 0:
            raise UnsupportedSpaceError(f"{where}: {space} has no elements to act on")
        parts.extend(ActionPart("categorical", int(n)) for n in nvec)
        offsets.extend(int(s) for s in space.start.ravel())
        low.extend([-math.inf] * nvec.size)
        high.extend([math.inf] * nvec.size)
    elif isinstance(space, spaces.MultiBinary):
        bits = int(np.prod(space.shape))
        if bits == 0:
            raise UnsupportedSpaceError(f"{where}: {space} has no bits to act on")
        parts.append(ActionPart("bernoulli", bits))
        offsets.extend([0] * bits)
        low.extend([-math.inf] * bits)
        high.extend([math.inf] * bits)
    elif isinstance(space, spaces.Box):
        if space.dtype.kind != "f":
            raise UnsupportedSpaceError(
                f"{where}: a Box of dtype {space.dtype} cannot be an action space of PPO (its "
                "Gaussian samples real numbers); use a float32 Box, or MultiDiscrete for "
                "integer actions"
            )
        size = int(np.prod(space.shape))
        if size == 0:
            raise UnsupportedSpaceError(f"{where}: {space} has no values to act on")
        parts.append(ActionPart("gaussian", size))
        offsets.extend([0] * size)
        low.extend(_float_bounds(space.low))
        high.extend(_float_bounds(space.high))
    elif isinstance(space, spaces.Dict):
        if not space.spaces:
            raise UnsupportedSpaceError(f"{where}: an empty Dict has nothing to act on")
        for key, sub in space.spaces.items():
            _collect(sub, parts, offsets, low, high, f"{where}[{key!r}]")
    elif isinstance(space, spaces.Tuple):
        if not space.spaces:
            raise UnsupportedSpaceError(f"{where}: an empty Tuple has nothing to act on")
        for i, sub in enumerate(space.spaces):
            _collect(sub, parts, offsets, low, high, f"{where}[{i}]")
    else:
        raise UnsupportedSpaceError(
            f"{where}: PPO cannot act in {type(space).__name__} spaces; use Discrete, "
            "MultiDiscrete, MultiBinary, a float Box, or a Dict/Tuple of those"
        )


def action_distribution(space: spaces.Space[Any]) -> ActionDistribution:
    """The distribution a policy acting in ``space`` samples from.

    Raises:
        UnsupportedSpaceError: The space cannot be acted in (an integer Box, an empty space, an
            unknown space type), with the reason.
    """
    parts: list[ActionPart] = []
    offsets: list[int] = []
    low: list[float] = []
    high: list[float] = []
    _collect(space, parts, offsets, low, high, "action space")
    if isinstance(space, spaces.Discrete):
        kind = "categorical"
    elif isinstance(space, spaces.Box):
        kind = "gaussian"
    elif isinstance(space, spaces.MultiDiscrete):
        kind = "multi_categorical"
    elif isinstance(space, spaces.MultiBinary):
        kind = "bernoulli"
    else:
        kind = "composite"
    try:
        return ActionDistribution(kind, tuple(parts), tuple(offsets), tuple(low), tuple(high))
    except SpaceError as exc:
        raise UnsupportedSpaceError(f"action space {space}: {exc}") from exc


def normalized_box_actions(distribution: ActionDistribution) -> ActionDistribution:
    """``distribution`` with its Gaussian values acting in units of their Box's bounds.

    Each Gaussian column with finite bounds ``low < high`` whose half range is at most
    :data:`MAX_ACTION_HALF_RANGE` gets ``scale = (high - low) / 2`` and ``bias = (high + low) / 2``
    (rounded to float32, the precision every implementation computes in), so the network's
    ``[-1, 1]`` covers the Box and a standard deviation of 1 explores all of it; every other
    column keeps 1 and 0. When no column changes (no Gaussian part, or only ``[-1, 1]`` and
    unbounded values) ``distribution`` comes back as it is, without ``scale``.
    """
    if distribution.kind == "squashed_gaussian" or distribution.scale:
        return distribution
    scale: list[float] = []
    bias: list[float] = []
    columns = distribution.column_kinds()
    for (kind, _), low, high in zip(columns, distribution.low, distribution.high, strict=True):
        half = float(np.float32((high - low) / 2.0)) if math.isfinite(high - low) else math.inf
        centre = float(np.float32((high + low) / 2.0)) if math.isfinite(half) else 0.0
        if kind == "gaussian" and 0.0 < half <= MAX_ACTION_HALF_RANGE:
            scale.append(half)
            bias.append(centre)
        else:
            scale.append(1.0)
            bias.append(0.0)
    if all(v == 1.0 for v in scale) and all(v == 0.0 for v in bias):
        return distribution
    return dataclasses.replace(distribution, scale=tuple(scale), bias=tuple(bias))


def squashed_gaussian_distribution(space: spaces.Space[Any]) -> ActionDistribution:
    """The tanh-squashed Gaussian (SAC's distribution) over a float Box with finite bounds.

    Raises:
        UnsupportedSpaceError: ``space`` is not a float Box, or a bound is infinite or not above
            the other; the message names the fix.
    """
    if not isinstance(space, spaces.Box) or space.dtype.kind != "f":
        raise UnsupportedSpaceError(
            f"SAC acts in float Box action spaces only, got {space}; use PPO (any action space) "
            "or DQN (Discrete actions)"
        )
    low = _float_bounds(space.low)
    high = _float_bounds(space.high)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise UnsupportedSpaceError(
            f"SAC scales its actions to the Box's bounds, and {space} has an infinite bound; "
            "give the action space finite low and high (e.g. Box(-1, 1)), or use PPO"
        )
    if not all(lo < hi for lo, hi in zip(low, high, strict=True)):
        raise UnsupportedSpaceError(
            f"SAC needs low < high for every action value of {space}; widen the bounds"
        )
    size = len(low)
    if size == 0:
        raise UnsupportedSpaceError(f"action space {space} has no values to act on")
    part = ActionPart("squashed_gaussian", size)
    try:
        return ActionDistribution(
            "squashed_gaussian", (part,), (0,) * size, tuple(low), tuple(high)
        )
    except SpaceError as exc:
        raise UnsupportedSpaceError(f"action space {space}: {exc}") from exc


def check_learnable(
    observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
) -> ActionDistribution:
    """Refuse, with the reason, spaces a policy cannot be trained in; return the distribution.

    Called before a server listens, so a bad space stops the command instead of the learner.

    Raises:
        UnsupportedSpaceError: The observation space cannot be flattened (or flattens to
            nothing), or the action space has no distribution (:func:`action_distribution`).
    """
    check_observations(observation_space)
    return action_distribution(action_space)


def check_observations(observation_space: spaces.Space[Any]) -> int:
    """Refuse, with the reason, an observation space a network cannot read; return its width.

    Raises:
        UnsupportedSpaceError: The space cannot be flattened, or flattens to nothing.
    """
    try:
        obs_dim = int(spaces.flatdim(observation_space))
    except (ValueError, NotImplementedError, TypeError) as exc:
        raise UnsupportedSpaceError(
            f"observation space {observation_space} cannot be flattened for a network ({exc}); "
            "use Box, Discrete, MultiDiscrete, MultiBinary, or a Dict/Tuple of those"
        ) from exc
    if obs_dim < 1:
        raise UnsupportedSpaceError(
            f"observation space {observation_space} flattens to no values; give the policy "
            "something to observe"
        )
    return obs_dim


def encode_action(space: spaces.Space[Any], value: Any) -> Any:
    """An action in the space's form (checked) as the learner stores it.

    Returns:
        The choice index (``int``) for a Discrete space; otherwise the ``[A]`` float32 row of
        the flat layout (values minus offsets, Gaussian values as given).
    """
    if isinstance(space, spaces.Discrete):
        return int(value) - int(space.start)
    return np.concatenate(_encode_parts(space, value)).astype(np.float32)


def _encode_parts(space: spaces.Space[Any], value: Any) -> list[np.ndarray]:
    if isinstance(space, spaces.Discrete):
        return [np.array([int(value) - int(space.start)], dtype=np.float64)]
    if isinstance(space, spaces.MultiDiscrete):
        return [(np.asarray(value, dtype=np.int64) - space.start).ravel().astype(np.float64)]
    if isinstance(space, spaces.MultiBinary | spaces.Box):
        return [np.asarray(value, dtype=np.float64).ravel()]
    if isinstance(space, spaces.Dict):
        return [row for key, sub in space.spaces.items() for row in _encode_parts(sub, value[key])]
    if isinstance(space, spaces.Tuple):
        pairs = zip(space.spaces, value, strict=True)
        return [row for sub, v in pairs for row in _encode_parts(sub, v)]
    raise UnsupportedSpaceError(f"{type(space).__name__} actions are not supported")


def actions_to_space(space: spaces.Space[Any], env: np.ndarray) -> Any:
    """Environment-form flat actions in the space's own form, batched.

    Args:
        space: The action space.
        env: ``[N, A]`` actions from :meth:`ActionDistribution.to_env`.

    Returns:
        For Box, MultiDiscrete and MultiBinary an array ``[N, *shape]`` of the space's dtype; for
        Discrete ``[N]`` int64; for Dict and Tuple a list of ``N`` maps or tuples.
    """
    if isinstance(space, spaces.Discrete):
        return np.rint(env.reshape(-1)).astype(np.int64)
    if isinstance(space, spaces.Dict | spaces.Tuple):
        return [_row_to_space(space, row)[0] for row in env]
    return _block(space, env)


def _block(space: spaces.Space[Any], env: np.ndarray) -> np.ndarray:
    n = env.shape[0]
    if isinstance(space, spaces.Box):
        return env.reshape(n, *space.shape).astype(space.dtype)
    assert isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary)
    return np.rint(env).reshape(n, *space.shape).astype(space.dtype)


def _row_to_space(space: spaces.Space[Any], row: np.ndarray) -> tuple[Any, int]:
    """One action from the start of ``row``, and how many columns it used."""
    if isinstance(space, spaces.Discrete):
        return int(np.rint(row[0])), 1
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        width = int(np.prod(space.shape))
        return _block(space, row[None, :width])[0], width
    used = 0
    if isinstance(space, spaces.Dict):
        out: dict[str, Any] = {}
        for key, sub in space.spaces.items():
            out[key], width = _row_to_space(sub, row[used:])
            used += width
        return out, used
    assert isinstance(space, spaces.Tuple)
    items = []
    for sub in space.spaces:
        item, width = _row_to_space(sub, row[used:])
        items.append(item)
        used += width
    return tuple(items), used


def action_from_wire(space: spaces.Space[Any], value: Any) -> Any:
    """An action as decoded from msgpack in the space's form: a Tuple's list becomes a tuple."""
    if isinstance(space, spaces.Tuple) and isinstance(value, list | tuple):
        return tuple(action_from_wire(s, v) for s, v in zip(space.spaces, value, strict=False))
    if isinstance(space, spaces.Dict) and isinstance(value, dict):
        known = space.spaces
        return {k: action_from_wire(known[k], v) if k in known else v for k, v in value.items()}
    return value
