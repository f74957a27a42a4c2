"""Which observations are images, and the encoder a learner's settings give them.

A ``Box`` of rank 3 is an image, channels-last ``(H, W, C)`` or channels-first ``(C, H, W)``:
channels-first when its first side is its smallest (Stable-Baselines3's rule). Every image of
the observation the network reads (the space itself, the parts of a Dict or Tuple at any depth,
the observation beside a legal-move mask) gets its own conv stack; the other parts pass to the
MLP as they are (:class:`~rlserve.policy.image_encoder.ObservationEncoder`). Needs numpy and
gymnasium only, never torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import ConfigError
from rlserve.policy.action_mask import MASK_KEY, OBSERVATION_KEYS
from rlserve.policy.image_encoder import EncoderLayer, ImageEncoder, ObservationEncoder

ENCODER_CHOICES = ("auto", "nature", "small", "mlp")
"""The settings' ``encoder`` values: ``auto`` (a conv stack for each image, sized by it),
``nature``, ``small`` (those stacks) or ``mlp`` (the flattened images into the MLP)."""

NATURE_FILTERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""The Nature-DQN stack (Mnih et al. 2015), ``(filters, kernel, stride)`` each; then a linear
layer of :data:`NATURE_DENSE` units."""

NATURE_DENSE = 512
"""The width of the linear layer after the Nature stack."""

SMALL_FILTERS = ((16, 2, 1), (32, 2, 1), (64, 2, 1))
"""The small-grid stack (MiniGrid's 7x7x3 view, MinAtar's 10x10xC): no linear layer after it."""

NATURE_MIN_SIDE = 36
"""Images whose smaller side is at least this get the Nature stack under ``auto``."""

AUTO_MIN_SIDE = 4
"""Under ``auto``, images whose smaller side is below this (a 3x3 board) stay with the MLP: the
small stack's three 2x2 convolutions need 4."""

UINT8_DIVISOR = 255.0
"""A uint8 image's values are divided by this inside the model."""


def is_image_space(space: spaces.Space[Any]) -> bool:
    """Whether ``space`` is an image: a Box of rank 3."""
    return isinstance(space, spaces.Box) and len(space.shape) == 3


def channels_first(shape: tuple[int, ...]) -> bool:
    """Whether an image of ``shape`` is channels-first: its first side is its smallest."""
    return int(np.argmin(shape)) == 0


def network_input(observation_space: spaces.Space[Any]) -> spaces.Space[Any]:
    """The part of the observation the network reads: all of it, or the one beside a mask."""
    if isinstance(observation_space, spaces.Dict) and MASK_KEY in observation_space.spaces:
        for key in OBSERVATION_KEYS:
            if key in observation_space.spaces:
                return observation_space.spaces[key]
    return observation_space


def image_leaves(space: spaces.Space[Any]) -> list[tuple[int, spaces.Box]]:
    """Every image in ``space``, with where its values start in the flattened ``space``.

    Follows ``gymnasium.spaces.flatten``'s order (a Dict's and a Tuple's parts in order).
    """
    found: list[tuple[int, spaces.Box]] = []

    def walk(part: spaces.Space[Any], position: int) -> int:
        if is_image_space(part):
            assert isinstance(part, spaces.Box)
            found.append((position, part))
        elif isinstance(part, spaces.Dict | spaces.Tuple):
            children = part.spaces.values() if isinstance(part, spaces.Dict) else part.spaces
            for child in children:
                position = walk(child, position)
            return position
        return position + int(spaces.flatdim(part))

    walk(space, 0)
    return found


def check_encoder_settings(encoder: str, conv_filters: Any) -> tuple[tuple[int, int, int], ...]:
    """Validate the settings ``encoder`` and ``conv_filters``; return the filters as tuples.

    Raises:
        ConfigError: An unknown ``encoder`` or ``conv_filters`` not of the RLlib form
            ``[[filters, kernel, stride], ...]`` of positive integers.
    """
    if encoder not in ENCODER_CHOICES:
        raise ConfigError(f"encoder must be one of {', '.join(ENCODER_CHOICES)}, got '{encoder}'")
    if conv_filters is None:
        return ()
    filters = []
    for entry in conv_filters:
        values = tuple(entry) if isinstance(entry, list | tuple) else ()
        if len(values) != 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values
        ):
            raise ConfigError(
                f"conv_filters must be [[filters, kernel, stride], ...] of positive integers "
                f"(RLlib's form), got {list(conv_filters)!r}; e.g. [[16, 2, 1], [32, 2, 1]]"
            )
        filters.append((values[0], values[1], values[2]))
    if not filters:
        raise ConfigError(
            "conv_filters is empty; leave it unset for the automatic stack, or set "
            'encoder = "mlp" for no convolution'
        )
    return tuple(filters)


def choose_encoder(
    observation_space: spaces.Space[Any], encoder: str = "auto", conv_filters: Any = None
) -> ObservationEncoder | None:
    """The encoder a policy over ``observation_space`` gets with these settings (None: MLP).

    ``auto`` picks, per image, :data:`NATURE_FILTERS` and a 512 linear layer when its smaller
    side is at least :data:`NATURE_MIN_SIDE`, :data:`SMALL_FILTERS` when it is at least
    :data:`AUTO_MIN_SIDE`, and no conv stack below (its values go to the MLP as they are);
    ``conv_filters`` replaces the convolutions of every image (and drops the linear layer).
    Image ``k``'s layer ``i`` is named ``encoder.{k}.{i}`` (its ReLUs and the flattening count
    as layers, as in ``torch.nn.Sequential``).

    Raises:
        ConfigError: Bad settings, or filters that shrink an image to nothing (naming the
            image's shape, the filters and the fix); ``encoder`` other than ``auto``/``mlp``
            or ``conv_filters`` for a space without an image.
    """
    filters = check_encoder_settings(encoder, conv_filters)
    if encoder == "mlp":
        return None
    inner = network_input(observation_space)
    leaves = image_leaves(inner)
    if not leaves:
        if encoder != "auto" or filters:
            raise ConfigError(
                f"encoder '{encoder}' and conv_filters need an image observation (a Box of "
                f"rank 3), not {observation_space}; leave them unset"
            )
        return None
    images: list[ImageEncoder] = []
    for start, box in leaves:
        image = _image_encoder(box, start, encoder, filters, f"encoder.{len(images)}")
        if image is not None:
            images.append(image)
    if not images:
        return None
    return ObservationEncoder(int(spaces.flatdim(inner)), tuple(images))


def _image_encoder(
    box: spaces.Box,
    start: int,
    encoder: str,
    filters: tuple[tuple[int, int, int], ...],
    prefix: str,
) -> ImageEncoder | None:
    shape = (int(box.shape[0]), int(box.shape[1]), int(box.shape[2]))
    first = channels_first(shape)
    h, w = (shape[1], shape[2]) if first else (shape[0], shape[1])
    dense: tuple[int, ...] = ()
    if not filters:
        if encoder == "auto" and min(h, w) < AUTO_MIN_SIDE:
            return None
        nature = encoder == "nature" or (encoder == "auto" and min(h, w) >= NATURE_MIN_SIDE)
        filters = NATURE_FILTERS if nature else SMALL_FILTERS
        dense = (NATURE_DENSE,) if nature else ()
    layers = []
    index = 0
    for size, kernel, stride in filters:
        layers.append(EncoderLayer(f"{prefix}.{index}", "conv", size, (kernel,) * 2, (stride,) * 2))
        index += 2  # the conv, its ReLU
    index += 1  # the flattening
    for size in dense:
        layers.append(EncoderLayer(f"{prefix}.{index}", "linear", size))
        index += 2
    divisor = UINT8_DIVISOR if box.dtype == np.uint8 else 1.0
    try:
        return ImageEncoder(shape, first, divisor, tuple(layers), start)
    except ConfigError as exc:
        if "shrink" not in str(exc):
            raise
        raise ConfigError(
            f"conv_filters {[list(f) for f in filters]} shrink the {shape} image to nothing; "
            "use fewer layers or smaller kernels and strides (e.g. [[16, 2, 1], [32, 2, 1]])"
        ) from None


def settings_encoder(
    settings: Any, observation_space: spaces.Space[Any]
) -> ObservationEncoder | None:
    """The encoder a learner's ``settings`` give a policy over ``observation_space``.

    Settings without ``encoder`` mean ``mlp``. An image encoder reads raw pixels, so
    ``normalize_observations`` left automatic stays off with one.

    Raises:
        ConfigError: As :func:`choose_encoder`, or ``normalize_observations`` set on with an
            image encoder (naming the fix).
    """
    encoder = choose_encoder(
        observation_space,
        getattr(settings, "encoder", "mlp"),
        getattr(settings, "conv_filters", None),
    )
    if encoder is not None and getattr(settings, "normalize_observations", None):
        shapes = ", ".join(str(image.shape) for image in encoder.images)
        raise ConfigError(
            f"normalize_observations does not apply to image observations ({shapes}: the conv "
            "encoder reads raw pixels, uint8 divided by 255); turn normalize_observations "
            'off, or set encoder = "mlp"'
        )
    return encoder
