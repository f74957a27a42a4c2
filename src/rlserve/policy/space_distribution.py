"""Which distribution a policy acts with in an action space, and the spaces it cannot learn.

:func:`action_distribution` turns a Gymnasium action space into an
:class:`~rlserve.policy.distribution.ActionDistribution`; the value-based learners take
:func:`epsilon_greedy`, SAC :func:`squashed_gaussian_distribution`, and PPO's normalised Box
actions :func:`normalized_box_actions`.

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

Needs numpy and gymnasium only, never torch: the client uses it too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import SpaceError, UnsupportedSpaceError
from rlserve.policy.action_mask import action_mask_slice
from rlserve.policy.distribution import ActionDistribution, ActionPart

MAX_ACTION_HALF_RANGE = 1e6
"""A Box value whose half range ``(high - low) / 2`` is larger than this is not normalised by
:func:`normalized_box_actions` (a bound such as float32's largest value stands for "unbounded":
scaling by it would overflow the samples)."""


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
            nothing), the action space has no distribution (:func:`action_distribution`), or a
            legal-move mask does not fit (:func:`~rlserve.policy.action_mask.action_mask_slice`).
    """
    check_observations(observation_space)
    distribution = action_distribution(action_space)
    action_mask_slice(observation_space, action_space)
    return distribution


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
