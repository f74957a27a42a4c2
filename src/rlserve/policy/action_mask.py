"""Legal-move masks: an observation that says which actions are legal (RLlib's convention).

An observation space ``Dict`` with exactly the keys ``action_mask`` and ``observations``
(RLlib's action-mask convention; PettingZoo classic's ``observation``/``action_mask`` also)
masks the policy's choices: ``action_mask`` is a ``MultiBinary(n)`` or ``Box(0, 1, (n,))`` with
one value per logit of the action distribution (``Discrete(n)``: ``n``; ``MultiDiscrete(nvec)``:
``sum(nvec)``, each sub-action's values in order). A value above 0.5 marks the choice legal; 0
illegal.

Observations travel flattened (``gymnasium.spaces.flatten``), so the mask is a slice of the
flattened observation: ``(start, size)``, the model spec's ``action_mask``
(:func:`action_mask_slice`). The network reads the flattened observation without that slice
(:func:`features`), normalised when the policy normalises observations (the mask never is);
the logits (or action values) of illegal choices are set to :data:`MASKED_LOGIT`, a large
negative finite number, so softmax, log-probabilities and entropies stay finite and an illegal
choice has probability 0. An observation with no legal choice (for some sub-action) cannot be
acted on: :func:`check_legal` says why.

Needs numpy only, never torch: the client uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import SpaceError, UnsupportedSpaceError

MASK_KEY = "action_mask"
"""The observation key of the mask."""

OBSERVATION_KEYS = ("observations", "observation")
"""The key of the real observation beside the mask: RLlib's, then PettingZoo classic's."""

MASKED_LOGIT = float(np.finfo(np.float32).min) / 2
"""The logit (or action value) an illegal choice gets: below any a network computes, finite so
that ``0 * log p`` stays 0 and a float32 softmax of it is exactly 0."""

LEGAL_THRESHOLD = 0.5
"""A mask value above this marks its choice legal."""


def mask_logit_count(action_space: spaces.Space[Any]) -> int:
    """The number of logits a mask covers in ``action_space`` (Discrete or MultiDiscrete).

    Raises:
        UnsupportedSpaceError: The action space has no choices to mask (a Box, MultiBinary,
            Dict or Tuple), naming the spaces that do.
    """
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        return int(action_space.nvec.sum())
    raise UnsupportedSpaceError(
        f"an '{MASK_KEY}' observation masks the choices of a Discrete or one-dimensional "
        f"MultiDiscrete action space, not {action_space}; use one of those, or drop "
        f"'{MASK_KEY}' from the observation space"
    )


def action_mask_slice(
    observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
) -> tuple[int, int] | None:
    """The mask's ``(start, size)`` in the flattened observation, or None without a mask.

    Raises:
        UnsupportedSpaceError: The observation space has an ``action_mask`` key but does not
            follow the convention (other keys, a mask that is not MultiBinary/Box(0, 1) of one
            dimension, or of another length than the action distribution's logits), or the
            action space cannot be masked. The message names the value and the fix.
    """
    if not isinstance(observation_space, spaces.Dict):
        return None
    keys = set(observation_space.spaces)
    if MASK_KEY not in keys:
        return None
    others = keys - {MASK_KEY}
    if len(others) != 1 or not others <= set(OBSERVATION_KEYS):
        raise UnsupportedSpaceError(
            f"an observation space with '{MASK_KEY}' must be a Dict of exactly '{MASK_KEY}' and "
            f"'observations' (or PettingZoo's 'observation'); got the keys {sorted(keys)}: put "
            "everything else under 'observations'"
        )
    mask = observation_space.spaces[MASK_KEY]
    one_dim = len(mask.shape or ()) == 1
    binary = isinstance(mask, spaces.MultiBinary) and one_dim
    unit_box = (
        isinstance(mask, spaces.Box)
        and one_dim
        and bool(np.all(mask.low >= 0))
        and bool(np.all(mask.high <= 1))
    )
    if not (binary or unit_box):
        raise UnsupportedSpaceError(
            f"'{MASK_KEY}' must be MultiBinary(n) or Box(0, 1, (n,)), got {mask}; use "
            "MultiBinary(n) with 1 for each legal choice"
        )
    size = int(mask.shape[0])  # type: ignore[index]
    expected = mask_logit_count(action_space)
    if size != expected:
        raise UnsupportedSpaceError(
            f"'{MASK_KEY}' has {size} values but the action space {action_space} has "
            f"{expected} choices to mask; give the mask one value per choice (MultiDiscrete: "
            "sum(nvec), each sub-action's in order)"
        )
    start = 0
    for key, part in observation_space.spaces.items():
        if key == MASK_KEY:
            return start, size
        start += int(spaces.flatdim(part))
    raise AssertionError("unreachable: the mask key is in the Dict")


def features(obs: np.ndarray, mask: tuple[int, int] | None) -> np.ndarray:
    """``[N, D]`` flattened observations without the mask's columns (``obs`` itself without one)."""
    if mask is None:
        return obs
    start, size = mask
    if start == 0:
        return obs[:, size:]
    if start + size == obs.shape[1]:
        return obs[:, :start]
    return np.concatenate([obs[:, :start], obs[:, start + size :]], axis=1)


def legal(obs: np.ndarray, mask: tuple[int, int]) -> np.ndarray:
    """``[N, size]`` bool: which choices the mask of each observation marks legal."""
    start, size = mask
    return np.greater(obs[:, start : start + size], LEGAL_THRESHOLD)


def part_sizes(distribution_parts: tuple[Any, ...]) -> tuple[int, ...]:
    """The sizes of the categorical parts a mask covers, in order (each part's ``size``)."""
    return tuple(int(part.size) for part in distribution_parts)


def check_legal(allowed: np.ndarray, sizes: tuple[int, ...], where: str = "observation") -> str:
    """Why the masks ``allowed`` (``[N, sum(sizes)]`` bool) cannot be acted on, or ``""``.

    Each row needs at least one legal choice in every part (sub-action).
    """
    begin = 0
    for index, size in enumerate(sizes):
        block = allowed[:, begin : begin + size]
        begin += size
        none = ~block.any(axis=1)
        if none.any():
            row = int(np.argmax(none))
            part = "" if len(sizes) == 1 else f" for sub-action {index}"
            at = "" if allowed.shape[0] == 1 else f" (row {row})"
            return (
                f"{where}{at} has an '{MASK_KEY}' with no legal action{part}; mark at least one "
                "legal action with 1, or end the episode instead of asking for an action"
            )
    return ""


def require_legal(allowed: np.ndarray, sizes: tuple[int, ...], where: str = "observation") -> None:
    """:func:`check_legal` as an exception.

    Raises:
        SpaceError: Some row has no legal choice (in some sub-action).
    """
    problem = check_legal(allowed, sizes, where)
    if problem:
        raise SpaceError(problem)


def mask_logits(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``logits`` (``[N, size]``) with illegal choices set to :data:`MASKED_LOGIT`, in place."""
    np.putmask(logits, ~allowed, np.asarray(MASKED_LOGIT, dtype=logits.dtype))
    return logits


def illegal_action_problem(
    obs: np.ndarray, actions: np.ndarray, mask: tuple[int, int], sizes: tuple[int, ...]
) -> str:
    """Why some of ``actions`` were illegal at their ``obs``, or ``""`` when all were legal.

    Args:
        obs: ``[T, obs_dim]`` the observations the actions were taken at.
        actions: ``[T]`` choice indices, or ``[T, len(sizes)]`` one column per sub-action.
        mask: The mask's ``(start, size)``.
        sizes: The sub-actions' numbers of choices.
    """
    allowed = legal(obs, mask)
    columns = actions.reshape(actions.shape[0], -1).astype(np.int64)
    rows = np.arange(obs.shape[0])
    begin = 0
    for column, size in enumerate(sizes):
        bad = ~allowed[rows, begin + columns[:, column]]
        if bad.any():
            step = int(np.argmax(bad))
            return (
                f"step {step} took action {int(columns[step, column])}, which its observation's "
                f"'{MASK_KEY}' marks illegal; act only on legal choices (the policy's own "
                "actions always are)"
            )
        begin += size
    return ""


def mask_sizes(action_space: spaces.Space[Any]) -> tuple[int, ...]:
    """The numbers of choices of the sub-actions a mask covers (Discrete: one; MultiDiscrete)."""
    if isinstance(action_space, spaces.Discrete):
        return (int(action_space.n),)
    assert isinstance(action_space, spaces.MultiDiscrete)
    return tuple(int(n) for n in np.asarray(action_space.nvec).ravel())


@dataclass(frozen=True, slots=True)
class LegalMoves:
    """A policy's legal-move mask, to refuse observations with no legal move before acting.

    Attributes:
        mask: The mask's ``(start, size)`` in the flattened observation.
        sizes: The sub-actions' numbers of choices.
    """

    mask: tuple[int, int]
    sizes: tuple[int, ...]

    @classmethod
    def of(
        cls, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> LegalMoves | None:
        """The mask of a policy acting in these spaces, or None without one.

        Raises:
            UnsupportedSpaceError: As :func:`action_mask_slice`.
        """
        mask = action_mask_slice(observation_space, action_space)
        return None if mask is None else cls(mask, mask_sizes(action_space))

    def check(self, obs: np.ndarray, where: str) -> None:
        """Refuse ``[N, obs_dim]`` flattened observations of which one has no legal move.

        Raises:
            SpaceError: Naming the row and the fix.
        """
        require_legal(legal(obs, self.mask), self.sizes, where)

    def check_actions(self, obs: np.ndarray, actions: np.ndarray, where: str) -> None:
        """Refuse logged ``actions`` (choice indices, ``[N]`` or ``[N, parts]``) illegal at ``obs``.

        Raises:
            SpaceError: Naming the first illegal one and the fix.
        """
        problem = illegal_action_problem(obs, np.asarray(actions), self.mask, self.sizes)
        if problem:
            raise SpaceError(f"{where}: {problem}")
