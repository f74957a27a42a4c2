"""Frame stacking's layout: an observation made of the last ``n`` frames, for the conv encoder.

A policy without memory sees motion when each observation holds the last few frames (the
Nature-DQN recipe: 4 frames of 84x84). Gymnasium's ``FrameStackObservation`` adds a new first
axis, so a stacked ``(H, W, C)`` image becomes a rank-4 ``(n, H, W, C)`` Box, which rlserve's
encoder does not read as an image. Here the frames are concatenated along the channel axis
instead, oldest first, so the result is an image again and gets a conv stack:

* channels-last ``(H, W, C)`` becomes ``(H, W, n*C)`` (frame ``k``'s channels at
  ``[k*C, (k+1)*C)``), channels-first ``(C, H, W)`` becomes ``(n*C, H, W)``;
* a grayscale ``(H, W)`` frame becomes ``(n, H, W)``, channels-first (Atari's 4x84x84);
* any other Box (a vector) gets a new first axis, ``(n, *shape)``, which the MLP reads flattened.

An image layout is told by its smallest side (``rlserve.policy.encoder_choice``), so a stack
whose channels outnumber the image's sides would be misread; :func:`stacked_space` refuses it.
At the start of an episode the stack is filled with copies of the first frame.

The one rule for every place frames are stacked: :class:`~rlserve.env.FrameStack` wraps a hosted
``gymnasium.Env``; :class:`FrameStacker` stacks one episode's frames (an external simulator's
client that sends the stack itself); :func:`flat_order` gives the same layout on the flattened
rows the episode table records, for the ``frame_stack`` setting
(:mod:`rlserve.experience.frame_stacks`). Needs numpy and gymnasium only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import ConfigError
from rlserve.policy.encoder_choice import channels_first, is_image_space

__all__ = ["MAX_FRAME_STACK", "FrameStacker", "check_frame_stack", "flat_order", "stacked_space"]

MAX_FRAME_STACK = 64
"""The most frames one observation may stack (more is a mistake, not a policy)."""


def _axis(space: spaces.Box) -> int | None:
    """The axis frames are concatenated along (an image's channels), or None for a new axis."""
    if is_image_space(space):
        return 0 if channels_first(tuple(int(s) for s in space.shape)) else 2
    return None


def check_frame_stack(n: Any) -> int:
    """``n`` as a number of frames per observation (1: no stacking).

    Raises:
        ConfigError: Not a whole number from 1 to :data:`MAX_FRAME_STACK`.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FRAME_STACK:
        raise ConfigError(
            f"frame_stack must be a whole number from 1 (off) to {MAX_FRAME_STACK}, got {n!r}; "
            "e.g. 4"
        )
    return n


def stacked_space(space: spaces.Space[Any], n: int) -> spaces.Box:
    """The observation space of ``n`` stacked frames of ``space`` (a Box).

    Raises:
        ConfigError: ``n`` is not a whole number from 1 to :data:`MAX_FRAME_STACK`, ``space``
            is not a Box, or the stacked image's channels would outnumber its sides (it would
            be read in another layout).
    """
    check_frame_stack(n)
    if not isinstance(space, spaces.Box):
        raise ConfigError(
            f"frame stacking needs a Box observation space, got {space}; stack the Box part "
            "yourself (e.g. a Dict's image) or leave frame stacking off"
        )
    shape = tuple(int(s) for s in space.shape)
    if len(shape) == 2:
        low, high = np.broadcast_to(space.low, shape), np.broadcast_to(space.high, shape)
        low, high = np.stack([low] * n), np.stack([high] * n)
    else:
        axis = _axis(space)
        if axis is None:
            low, high = np.stack([space.low] * n), np.stack([space.high] * n)
        else:
            low = np.concatenate([space.low] * n, axis=axis)
            high = np.concatenate([space.high] * n, axis=axis)
    out = spaces.Box(low, high, dtype=space.dtype)
    if (len(shape) == 2 or _axis(space) is not None) and _axis(out) != _axis_of(shape):
        sides = shape if len(shape) == 2 else [s for i, s in enumerate(shape) if i != _axis(space)]
        raise ConfigError(
            f"stacking {n} frames of {shape} gives {out.shape}, whose {out.shape[_axis_of(shape)]}"
            f" channels outnumber the image's smaller side {min(sides)}, so the encoder would "
            f"read it in another layout; stack at most {_most(shape)} frames"
        )
    return out


def _axis_of(shape: tuple[int, ...]) -> int:
    """The stacked image's channel axis for frames of ``shape``."""
    if len(shape) == 2:
        return 0
    return 0 if channels_first(shape) else 2


def _most(shape: tuple[int, ...]) -> int:
    """The most frames of ``shape`` whose stack keeps its layout."""
    if len(shape) == 2:
        return min(shape)
    if channels_first(shape):
        return max(1, min(shape[1], shape[2]) // shape[0])
    return max(1, (min(shape[0], shape[1]) - 1) // shape[2])


class FrameStacker:
    """The last ``n`` frames of one episode as one stacked observation (see the module).

    Args:
        space: One frame's Box.
        n: Frames per observation.

    Raises:
        ConfigError: As :func:`stacked_space`.
    """

    def __init__(self, space: spaces.Space[Any], n: int) -> None:
        self.space = stacked_space(space, n)
        assert isinstance(space, spaces.Box)
        self._n = n
        shape = tuple(int(s) for s in space.shape)
        self._axis = 0 if len(shape) == 2 else _axis(space)
        self._frames: list[np.ndarray] = []

    def reset(self, frame: Any) -> np.ndarray:
        """Start an episode: the stack of ``n`` copies of its first ``frame``."""
        first = np.asarray(frame, dtype=self.space.dtype)
        self._frames = [first] * self._n
        return self._stacked()

    def push(self, frame: Any) -> np.ndarray:
        """The stack after the episode's next ``frame`` (the oldest one dropped)."""
        if not self._frames:
            raise RuntimeError("FrameStacker.push before reset; call reset(first_frame) first")
        self._frames = [*self._frames[1:], np.asarray(frame, dtype=self.space.dtype)]
        return self._stacked()

    def _stacked(self) -> np.ndarray:
        return _stack(self._frames, self._axis)


def _stack(frames: list[np.ndarray], axis: int | None) -> np.ndarray:
    """The frames (oldest first) as one observation: along ``axis``, or a new first axis."""
    if axis is None or frames[0].ndim == 2:
        return np.stack(frames)
    return np.concatenate(frames, axis=axis)


def flat_order(space: spaces.Space[Any], n: int) -> np.ndarray | None:
    """Where each value of the flattened stack comes from in the frames' concatenation.

    ``stack.reshape(-1) == concatenate([f.reshape(-1) for f in frames])[order]`` (oldest frame
    first), or None where the two are the same (channels-first images, grayscale frames,
    vectors), so a caller stacking flattened rows copies no more than it must.

    Raises:
        ConfigError: As :func:`stacked_space`.
    """
    stacked_space(space, n)
    assert isinstance(space, spaces.Box)
    shape = tuple(int(s) for s in space.shape)
    size = int(np.prod(shape))
    # Stack frames that hold their own positions in the concatenation: the stack is the order.
    frames = [np.arange(k * size, (k + 1) * size).reshape(shape) for k in range(n)]
    order = _stack(frames, 0 if len(shape) == 2 else _axis(space)).reshape(-1)
    if np.array_equal(order, np.arange(order.size)):
        return None
    return order
