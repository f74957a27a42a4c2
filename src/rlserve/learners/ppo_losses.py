"""PPO's losses, its minibatches and the metrics of an update, for :mod:`rlserve.learners.ppo`.

The losses are the clipped surrogate (:func:`clipped_policy_loss`), the value loss
(:func:`value_loss`) and the per-minibatch advantage normalisation
(:func:`normalise_advantages`). An epoch's minibatches are a fresh permutation split into equal
parts (:func:`minibatch_indices`); the learner gathers each column once per epoch in that order
and cuts it into contiguous parts (:func:`epoch_minibatches`), which are exactly the rows the
indices name. :class:`UpdateStats` keeps each applied minibatch's metrics as tensors and reads
them once, at the end of the update: a CPU learner's time per minibatch goes to the Python
around each small tensor operation, not to the operations themselves.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import numpy as np
import torch
from torch.nn import functional

from rlserve.learners.ppo_batch import LOG_RATIO_LIMIT

# Advantages spread less than this are only centred: dividing by a ~0 deviation would blow up.
ADVANTAGE_STD_FLOOR = 1e-6


def clipped_policy_loss(
    logp: torch.Tensor,
    proximal_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_coef: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate objective, as a loss to minimise, optionally importance weighted.

    Returns:
        ``(loss, ratio)``: ``mean(w * max(-A * r, -A * clip(r, 1 - c, 1 + c)))`` with
        ``r = exp(logp - proximal_logp)`` (``w`` = 1 without ``weights``), and ``r`` itself.
        The log-ratio is clamped to ``[-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]`` first, so an absurd
        reference log-probability (say -1e30) gives a large finite ratio with no gradient
        instead of infinity. Classic PPO passes the behaviour log-probabilities as
        ``proximal_logp``; decoupled PPO the policy's at the start of the update and
        :func:`~rlserve.learners.ppo_batch.importance_weights` as ``weights``.
    """
    ratio = (logp - proximal_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp()
    # max(-A r, -A clip(r)) = -min(A r, A clip(r)): the negation is exact, and done once.
    terms = torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    if weights is not None:
        terms = terms * weights
    return terms.mean().neg(), ratio


def normalise_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """Centre advantages and scale them to unit deviation, never dividing by a ~0 deviation.

    A deviation below ``ADVANTAGE_STD_FLOOR`` (all advantages nearly equal) only centres them.
    """
    std, mean = torch.std_mean(advantages)
    return (advantages - mean) / std.clamp_min(ADVANTAGE_STD_FLOOR)


def value_loss(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """Half the mean squared error between value estimates and returns."""
    return 0.5 * functional.mse_loss(values, returns)


def minibatch_sizes(size: int, minibatch_size: int) -> list[int]:
    """The sizes of an epoch's minibatches (see :func:`minibatch_indices`), largest first."""
    parts = max(1, math.ceil(size / minibatch_size))
    small, larger = divmod(size, parts)
    return [small + 1] * larger + [small] * (parts - larger)


def minibatch_indices(
    size: int, minibatch_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, ...]:
    """One epoch's minibatches: a fresh permutation of ``range(size)`` split into equal parts.

    ``ceil(size / minibatch_size)`` parts whose sizes differ by one at most, none larger than
    ``minibatch_size`` (and so none smaller than half of it, but in a batch smaller than that),
    and every step in one: no small remainder gets a full optimiser step of its own (or decides
    ``target_kl``), and an epoch makes as many steps as minibatches of ``minibatch_size`` would.
    """
    order = torch.randperm(size, generator=generator)
    return torch.split(order, minibatch_sizes(size, minibatch_size))


def epoch_minibatches(
    columns: Mapping[str, torch.Tensor], minibatch_size: int, generator: torch.Generator
) -> Iterator[dict[str, torch.Tensor]]:
    """One epoch's minibatches of ``columns``: the rows :func:`minibatch_indices` would pick.

    Each column is gathered once in the epoch's order and split into contiguous views, instead
    of gathered once per minibatch; the generator is drawn from exactly as
    :func:`minibatch_indices` draws from it.
    """
    names = list(columns)
    size = int(columns[names[0]].shape[0])
    sizes = minibatch_sizes(size, minibatch_size)
    order = torch.randperm(size, generator=generator).to(columns[names[0]].device)
    parts = [columns[name][order].split(sizes) for name in names]
    for pieces in zip(*parts, strict=True):
        yield dict(zip(names, pieces, strict=True))


class UpdateStats:
    """The metrics of an update's applied minibatches, kept as tensors until :meth:`means`.

    Args:
        clip_coef: The ratio clip, for ``clip_frac``.
    """

    def __init__(self, clip_coef: float) -> None:
        self.clip_coef = clip_coef
        self._losses: list[torch.Tensor] = []
        self._ratios: list[torch.Tensor] = []
        self._bc: list[torch.Tensor] = []

    @property
    def applied(self) -> int:
        """The minibatches recorded (each one applied optimiser step)."""
        return len(self._losses)

    def add(
        self,
        policy_loss: torch.Tensor,
        v_loss: torch.Tensor,
        entropy: torch.Tensor,
        ratio: torch.Tensor | None,
        bc_loss: torch.Tensor | None,
    ) -> None:
        """Record one applied minibatch: its losses, mean entropy, ratios (if any) and BC loss."""
        with torch.no_grad():
            self._losses.append(torch.stack((policy_loss, v_loss, entropy)))
            if ratio is not None:
                self._ratios.append(ratio.detach())
            if bc_loss is not None:
                self._bc.append(bc_loss.detach())

    def last_approx_kl(self) -> float | None:
        """The approximate KL of the last recorded minibatch with ratios; None without one."""
        if not self._ratios:
            return None
        ratio = self._ratios[-1]
        with torch.no_grad():
            return float(((ratio - 1) - ratio.log()).mean())

    def means(self) -> dict[str, float]:
        """Each metric's mean over the minibatches that have it, read in one go.

        ``policy_loss``, ``value_loss``, ``entropy``; ``approx_kl`` and ``clip_frac`` (the mean
        of ``(r - 1) - log r`` and the share of ``|r - 1| > clip_coef``, per minibatch) when a
        minibatch had ratios; ``bc_loss`` when one had a behaviour-cloning term.
        """
        if not self._losses:
            return {}
        with torch.no_grad():
            parts = [torch.stack(self._losses).flatten()]
            if self._ratios:
                ratios = torch.cat(self._ratios)
                shifted = ratios - 1
                clipped = (shifted.abs() > self.clip_coef).to(ratios.dtype)
                terms = torch.stack((shifted - ratios.log(), clipped), 1)
                lengths = [int(r.shape[0]) for r in self._ratios]
                segment = torch.repeat_interleave(
                    torch.arange(len(lengths), device=ratios.device),
                    torch.tensor(lengths, device=ratios.device),
                )
                sums = terms.new_zeros((len(lengths), 2)).index_add_(0, segment, terms)
                parts.append((sums / terms.new_tensor(lengths)[:, None]).flatten())
            if self._bc:
                parts.append(torch.stack(self._bc))
            values = torch.cat(parts).tolist()
        count = len(self._losses)
        losses = np.asarray(values[: 3 * count]).reshape(count, 3)
        means = {
            "policy_loss": float(np.mean(losses[:, 0])),
            "value_loss": float(np.mean(losses[:, 1])),
            "entropy": float(np.mean(losses[:, 2])),
        }
        rest = values[3 * count :]
        if self._ratios:
            ratio_stats = np.asarray(rest[: 2 * len(self._ratios)]).reshape(-1, 2)
            means["approx_kl"] = float(np.mean(ratio_stats[:, 0]))
            means["clip_frac"] = float(np.mean(ratio_stats[:, 1]))
            rest = rest[2 * len(self._ratios) :]
        if self._bc:
            means["bc_loss"] = float(np.mean(rest))
        return means
