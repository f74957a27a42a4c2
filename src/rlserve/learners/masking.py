"""Legal-move masks in torch: the network's input without the mask, and masked outputs.

The torch side of :mod:`rlserve.policy.action_mask` (same slice, same threshold, same masked
value), so a learner's log-probabilities, entropies and greedy choices are the numpy policy's.
"""

from __future__ import annotations

import torch

from rlserve.policy.action_mask import LEGAL_THRESHOLD, MASKED_LOGIT


def features(obs: torch.Tensor, mask: tuple[int, int] | None) -> torch.Tensor:
    """``[N, D]`` observations without the mask's columns (``obs`` itself without a mask)."""
    if mask is None:
        return obs
    start, size = mask
    if start == 0:
        return obs[:, size:]
    return torch.cat([obs[:, :start], obs[:, start + size :]], dim=1)


def legal(obs: torch.Tensor, mask: tuple[int, int]) -> torch.Tensor:
    """``[N, size]`` bool: the choices each observation's mask marks legal."""
    start, size = mask
    return obs[:, start : start + size] > LEGAL_THRESHOLD


def masked(out: torch.Tensor, obs: torch.Tensor, mask: tuple[int, int] | None) -> torch.Tensor:
    """``out`` with the outputs of choices illegal at ``obs`` set to ``MASKED_LOGIT``."""
    if mask is None:
        return out
    return torch.where(legal(obs, mask), out, torch.full_like(out, MASKED_LOGIT))
