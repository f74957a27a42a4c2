"""Observation normalisation as a learner keeps it: running statistics, frozen per weights version.

A learner with ``normalize_observations`` owns an :class:`ObservationNormalization`. The running
statistics (:class:`~rlserve.learners.running_stats.RunningMeanStd`, float64) take in the
observations of the experience that arrives; at the start of each update they are *frozen* into
float32 ``mean`` and ``std = sqrt(var + NORM_EPSILON)``, which the update trains with and which
are published with the weights it produces (:meth:`ObservationNormalization.spec`: the model
spec's ``obs_mean``, ``obs_std`` and ``obs_clip``). Between two versions nothing changes, so the
numpy policy (server inference, local clients, hosted runners) and the ONNX export compute
exactly the learner's ``clip((obs - mean) / std, -clip, clip)`` for the version they hold, and a
behaviour log-probability is the learner's log-probability of that version. An update that
applies no step (the version does not advance) puts the previous frozen values back.

A checkpoint holds both: the running statistics and the frozen values of the current version
(:meth:`ObservationNormalization.state`, plain tensors for ``torch.load(weights_only=True)``).
With a legal-move mask (:mod:`rlserve.policy.action_mask`) the statistics are those of the
observation without its mask (the network's input, the model spec's ``input_dim`` values): the
mask is never observed nor normalised. The learner's normalised observations keep their full
width with the mask's values as they came, so the networks slice the mask from them as from raw
ones.

Weights and the inputs they were trained on go together: a learner that loads a checkpoint (to
resume, or to start from another run's weights) takes the checkpoint's normalisation, or none
when it has none, whatever its own settings say (:func:`restore_observation_normalization`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlserve.errors import ConfigError
from rlserve.learners import masking
from rlserve.learners.running_stats import NORM_EPSILON, RunningMeanStd
from rlserve.policy import ModelSpec
from rlserve.policy import action_mask as mask_columns
from rlserve.protocol.limits import DEFAULT_LIMITS
from rlserve.protocol.spaces import flat_dim

logger = logging.getLogger("rlserve.learner")

MAX_NORMALIZED_OBS_DIM = DEFAULT_LIMITS.max_container_len
"""The widest observation a learner normalises: its statistics travel in the model spec as lists
of numbers, which a peer decodes up to ``max_container_len`` long."""


def unbounded_observations(space: gym.Space[Any]) -> bool:
    """Whether ``space`` has a Box part with an infinite bound (Dict and Tuple: any part's).

    The rule of ``normalize_observations`` left unset (PPO): values a space does not bound may
    be of any scale, so they are normalised; bounded Box values and discrete spaces are not.
    """
    if isinstance(space, gym.spaces.Box):
        return bool(np.isinf(space.low).any() or np.isinf(space.high).any())
    if isinstance(space, gym.spaces.Dict):
        return any(unbounded_observations(part) for part in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return any(unbounded_observations(part) for part in space.spaces)
    return False


def normalizes_observations(
    setting: bool | None, space: gym.Space[Any], memory: bool = False
) -> bool:
    """``normalize_observations`` resolved for an observation space.

    Explicit True or False wins; None (auto) is :func:`unbounded_observations` of ``space``, or
    any space for a policy with ``memory`` (an LSTM tells motion from small differences of its
    inputs, which raw bounded values such as CartPole's pole angle in +-0.2 hide), for
    observations no wider than the statistics can travel (:data:`MAX_NORMALIZED_OBS_DIM`), so
    that the default never refuses a space.
    """
    if setting is None:
        wanted = memory or unbounded_observations(space)
        return wanted and flat_dim(space) <= MAX_NORMALIZED_OBS_DIM
    return bool(setting)


class ObservationNormalizer(nn.Module):
    """``clip((obs - mean) / std, -clip, clip)`` with fixed float32 ``mean`` and ``std``.

    The numpy policy's :meth:`~rlserve.policy.NumpyPolicy.normalize` in torch (the same float32
    operations, so the same values), for the learners and the ONNX export. ``mean`` and ``std``
    are buffers that a ``state_dict`` leaves out (a model's checkpoint keys stay as they were).

    Args:
        mean: ``[D]`` values subtracted.
        std: ``[D]`` positive divisors.
        clip: The bound of the normalised values.
        action_mask: The legal-move mask's ``(start, size)`` in the observation, or None: its
            values pass through as they are (``mean`` and ``std`` cover the others).
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        mean: np.ndarray,
        std: np.ndarray,
        clip: float,
        action_mask: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.clip = float(clip)
        self.action_mask = action_mask
        self.register_buffer("mean", torch.as_tensor(np.asarray(mean, np.float32)), False)
        self.register_buffer("std", torch.as_tensor(np.asarray(std, np.float32)), False)

    def set(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Replace the statistics (float32 ``[D]`` each) in place, on the buffers' device."""
        with torch.no_grad():
            self.mean.copy_(torch.as_tensor(np.asarray(mean, np.float32)))
            self.std.copy_(torch.as_tensor(np.asarray(std, np.float32)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Normalised ``[N, D]`` observations (a mask's values as they are)."""
        x = masking.features(obs, self.action_mask)
        x = ((x - self.mean) / self.std).clamp(-self.clip, self.clip)
        if self.action_mask is None:
            return x
        start, size = self.action_mask
        return torch.cat([x[:, :start], obs[:, start : start + size], x[:, start:]], dim=1)


def with_observation_normalization(
    spec: ModelSpec, mean: np.ndarray, std: np.ndarray, clip: float
) -> ModelSpec:
    """``spec`` with the observation normalisation fields (float32 values as floats)."""
    return dataclasses.replace(
        spec,
        obs_mean=tuple(float(v) for v in np.asarray(mean, np.float32)),
        obs_std=tuple(float(v) for v in np.asarray(std, np.float32)),
        obs_clip=float(clip),
    )


class ObservationNormalization:
    """A learner's observation statistics: running (float64) and frozen (float32, published).

    The learner normalises with :meth:`numpy` (the numpy policy's float32 operations, in the same
    order, so the same values) and publishes the frozen values with :meth:`spec`.

    Args:
        obs_dim: Width of a flattened observation.
        clip: ``obs_clip``: the bound of the normalised values (positive).
        action_mask: The legal-move mask's ``(start, size)`` in the observation, or None; the
            statistics leave it out (see the module doc).

    Raises:
        ConfigError: ``clip`` is not positive, or ``obs_dim`` is beyond what the model spec can
            carry to a client (:data:`MAX_NORMALIZED_OBS_DIM`).
    """

    def __init__(
        self, obs_dim: int, clip: float, action_mask: tuple[int, int] | None = None
    ) -> None:
        if not (np.isfinite(clip) and clip > 0):
            raise ConfigError(f"obs_clip must be a finite positive number, got {clip}")
        if obs_dim > MAX_NORMALIZED_OBS_DIM:
            raise ConfigError(
                f"observations of {obs_dim} values are too wide to normalise: the statistics "
                f"travel as lists of at most {MAX_NORMALIZED_OBS_DIM} numbers; turn "
                "normalize_observations off"
            )
        self.clip = float(clip)
        self.action_mask = action_mask
        width = obs_dim - (0 if action_mask is None else action_mask[1])
        self.stats = RunningMeanStd((width,))
        self.mean, self.std = self._frozen_values()
        self._previous: tuple[np.ndarray, np.ndarray] | None = None

    def _frozen_values(self) -> tuple[np.ndarray, np.ndarray]:
        mean = self.stats.mean.astype(np.float32)
        std = self.stats.std(NORM_EPSILON).astype(np.float32)
        return mean, std

    def observe(self, obs: np.ndarray) -> None:
        """Take ``[N, D]`` observations into the running statistics (not yet used)."""
        self.stats.update(mask_columns.features(obs, self.action_mask))

    def freeze(self) -> None:
        """Normalise with the running statistics from now on (at the start of an update).

        :meth:`revert` undoes it.
        """
        self._previous = (self.mean, self.std)
        self.mean, self.std = self._frozen_values()

    def revert(self) -> None:
        """Put back the values of before the last :meth:`freeze`.

        For an update that applied no step: the published version keeps its statistics.
        """
        if self._previous is not None:
            self.mean, self.std = self._previous
            self._previous = None

    def numpy(self, obs: np.ndarray) -> np.ndarray:
        """``[N, D]`` observations normalised with the frozen values, a new float32 array.

        A mask's values are copied as they are.
        """
        x = np.subtract(mask_columns.features(obs, self.action_mask), self.mean, dtype=np.float32)
        np.divide(x, self.std, out=x)
        x = np.clip(x, -np.float32(self.clip), np.float32(self.clip), out=x)
        if self.action_mask is None:
            return x
        start, size = self.action_mask
        mask = np.asarray(obs[:, start : start + size], dtype=np.float32)
        return np.concatenate([x[:, :start], mask, x[:, start:]], axis=1)

    def module(self) -> ObservationNormalizer:
        """The frozen values as a torch module (CPU)."""
        return ObservationNormalizer(self.mean, self.std, self.clip, self.action_mask)

    def spec(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` with the frozen statistics, to publish with the weights."""
        return with_observation_normalization(spec, self.mean, self.std, self.clip)

    def state(self) -> dict[str, torch.Tensor]:
        """Running statistics (float64), frozen values (float32) and clip as CPU tensors."""
        running = {k: torch.from_numpy(np.array(v)) for k, v in self.stats.state().items()}
        return {
            **running,
            "frozen_mean": torch.from_numpy(self.mean.copy()),
            "frozen_std": torch.from_numpy(self.std.copy()),
            "clip": torch.tensor(self.clip, dtype=torch.float64),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back :meth:`state` output (its clip included).

        Raises:
            ValueError: The arrays are missing, misshapen, not finite, or a divisor or the clip
                is not positive.
        """
        try:
            running = {k: _numpy(state[k]) for k in ("count", "mean", "var")}
            mean = _numpy(state["frozen_mean"]).astype(np.float32)
            std = _numpy(state["frozen_std"]).astype(np.float32)
            clip = float(_numpy(state["clip"]).reshape(()))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"observation normalisation state is malformed: {exc!r}") from exc
        self.stats.load_state(running)
        shape = self.stats.shape
        if mean.shape != shape or std.shape != shape:
            raise ValueError(
                f"observation normalisation of shape {mean.shape}; expected {shape} (saved for "
                "another observation space?)"
            )
        if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
            raise ValueError("observation normalisation holds a non-finite value or std <= 0")
        if not (np.isfinite(clip) and clip > 0):
            raise ValueError(f"observation normalisation clip {clip} is not positive")
        self.mean, self.std, self.clip = mean, std, clip
        self._previous = None


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def restore_observation_normalization(
    current: ObservationNormalization | None,
    saved: dict[str, Any] | None,
    obs_dim: int,
    where: str,
    action_mask: tuple[int, int] | None = None,
) -> ObservationNormalization | None:
    """The normalisation that goes with weights loaded from a checkpoint: the checkpoint's.

    Weights are trained on the inputs they were given: a checkpoint whose policy normalised
    observations brings its statistics (running and frozen, and its clip), one whose policy did
    not brings none, whatever this learner's ``normalize_observations`` says. A difference is
    logged as a warning.

    Args:
        current: This learner's normalisation (None: its settings do not normalise).
        saved: The checkpoint's ``obs_normalization`` entry (None: it has none).
        obs_dim: Width of a flattened observation.
        where: The checkpoint, for the warning.
        action_mask: The model's legal-move mask, left out of the statistics.

    Raises:
        ValueError: The saved statistics are malformed or of another width.
    """
    if saved is None:
        if current is not None:
            logger.warning(
                "%s was trained on raw observations: its policy keeps reading them "
                "(normalize_observations is ignored for it)",
                where,
            )
        return None
    restored = current
    if restored is None:
        logger.warning(
            "%s was trained on normalised observations: its policy keeps normalising them "
            "with its statistics (normalize_observations off is ignored for it)",
            where,
        )
        clip = float(_numpy(saved["clip"]).reshape(()))
        restored = ObservationNormalization(obs_dim, clip, action_mask)
    restored.load_state(saved)
    return restored


def load_normalizer(
    saved: dict[str, Any] | None, action_mask: tuple[int, int] | None = None
) -> ObservationNormalizer | None:
    """The frozen normaliser of a checkpoint's ``obs_normalization`` entry (None without one).

    ``action_mask``: the model's legal-move mask, whose values the normaliser passes through.

    Raises:
        ValueError: The entry is malformed.
    """
    if saved is None:
        return None
    mean = _numpy(saved["frozen_mean"])
    width = int(mean.shape[0]) + (0 if action_mask is None else action_mask[1])
    normalization = ObservationNormalization(width, float(_numpy(saved["clip"])), action_mask)
    normalization.load_state(saved)
    return normalization.module()
