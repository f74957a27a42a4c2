"""Image observations: detection, the convolutional encoder's description, and its choice.

A ``Box`` observation of rank 3 is an image, channels-last ``(H, W, C)`` or channels-first
``(C, H, W)``: channels-first when its first dimension is its smallest (Stable-Baselines3's
rule). A policy over an image reads it through an :class:`ImageEncoder`, a stack of valid
(unpadded) convolutions, each followed by ReLU, then the flattening of the last feature map
(channel, row, column order, as torch's ``Flatten`` of ``NCHW``) and optional linear layers, each
followed by ReLU; the actor's linear layers (the ``hidden`` MLP and its head) come after. A
``uint8`` image is divided by 255 inside the model; the wire carries the uint8 values as they are.

The encoder travels in the model spec (``docs/protocol.md``, section 7.9, ``encoder``); its
numpy forward pass is :mod:`rlserve.policy.conv_forward`. Needs numpy and gymnasium only, never
torch: the client uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.policy.action_mask import MASK_KEY, OBSERVATION_KEYS

ENCODER_CHOICES = ("auto", "nature", "small", "mlp")
"""The settings' ``encoder`` values: ``auto`` (a conv stack for an image, sized by it; an MLP
otherwise), ``nature``, ``small`` (those stacks) or ``mlp`` (the flattened image into the MLP)."""

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


@dataclass(frozen=True, slots=True)
class EncoderLayer:
    """One encoder layer: a convolution (``kind`` ``conv``) or a linear layer (``linear``).

    Attributes:
        name: Its arrays are ``name.weight`` (conv: ``[filters, in_channels, kh, kw]``; linear:
            ``[size, in]``) and ``name.bias``.
        kind: ``conv`` or ``linear``.
        size: Filters of a convolution, units of a linear layer.
        kernel: ``(kh, kw)`` of a convolution; ``(0, 0)`` for a linear layer.
        stride: ``(sh, sw)`` of a convolution; ``(0, 0)`` for a linear layer.
    """

    name: str
    kind: str
    size: int
    kernel: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (0, 0)

    def to_wire(self) -> dict[str, Any]:
        """The layer as a plain map (a linear layer has no kernel or stride)."""
        data: dict[str, Any] = {"name": self.name, "kind": self.kind, "size": self.size}
        if self.kind == "conv":
            data["kernel"] = list(self.kernel)
            data["stride"] = list(self.stride)
        return data

    @classmethod
    def from_wire(cls, raw: Any) -> EncoderLayer:
        """Rebuild a layer from :meth:`to_wire` output (raises KeyError/TypeError/ValueError)."""
        if not isinstance(raw, dict):
            raise TypeError(f"an encoder layer must be a map, got {raw!r}")
        kind = str(raw["kind"])
        if kind == "conv":
            kernel, stride = _pair(raw["kernel"]), _pair(raw["stride"])
        elif kind == "linear":
            kernel = stride = (0, 0)
        else:
            raise ValueError(f"unknown encoder layer kind {kind!r}; known: conv, linear")
        return cls(str(raw["name"]), kind, _whole(raw["size"]), kernel, stride)


@dataclass(frozen=True, slots=True)
class ImageEncoder:
    """The convolutional encoder of an image observation: what a spec says about it.

    Attributes:
        shape: The image's shape as the space gives it: ``(H, W, C)``, or ``(C, H, W)`` when
            ``channels_first``.
        channels_first: The space's layout.
        divisor: The image's values are divided by this first (255 for uint8, else 1).
        layers: The convolutions then the linear layers, each followed by ReLU.

    The encoder reads the first layer's input (the flattened observation without its mask,
    ``ModelSpec.input_dim`` values, all of them the image's in row-major order of ``shape``).
    """

    shape: tuple[int, int, int]
    channels_first: bool
    divisor: float
    layers: tuple[EncoderLayer, ...]

    def __post_init__(self) -> None:
        if len(self.shape) != 3 or min(self.shape) < 1:
            raise ConfigError(f"an image encoder needs a shape of 3 positive sides, {self.shape}")
        if not (np.isfinite(self.divisor) and self.divisor > 0):
            raise ConfigError(f"image divisor must be finite and positive, got {self.divisor}")
        seen_linear = False
        for layer in self.layers:
            if layer.size < 1:
                raise ConfigError(f"encoder layer '{layer.name}' has size {layer.size}")
            if layer.kind == "conv":
                if seen_linear:
                    raise ConfigError("encoder convolutions must come before its linear layers")
                if min(layer.kernel) < 1 or min(layer.stride) < 1:
                    raise ConfigError(
                        f"encoder layer '{layer.name}': kernel {layer.kernel} and stride "
                        f"{layer.stride} must be positive"
                    )
            seen_linear = seen_linear or layer.kind == "linear"
        self.feature_maps()  # refuses a stack that shrinks the image to nothing

    @property
    def hwc(self) -> tuple[int, int, int]:
        """``(height, width, channels)``, whatever the layout."""
        if self.channels_first:
            return self.shape[1], self.shape[2], self.shape[0]
        return self.shape

    @property
    def input_dim(self) -> int:
        """The image's number of values."""
        return int(np.prod(self.shape))

    def feature_maps(self) -> list[tuple[int, int, int]]:
        """``(channels, height, width)`` after the input and after each convolution.

        Raises:
            ConfigError: A convolution's kernel is larger than its input.
        """
        h, w, c = self.hwc
        maps = [(c, h, w)]
        for layer in self.layers:
            if layer.kind != "conv":
                break
            (kh, kw), (sh, sw) = layer.kernel, layer.stride
            if kh > h or kw > w:
                raise ConfigError(
                    f"conv_filters shrink the {self.shape} image to nothing: layer "
                    f"'{layer.name}' ({layer.size} filters, kernel {kh}x{kw}, stride {sh}) gets a "
                    f"{h}x{w} input; use fewer layers, smaller kernels or strides, or a larger "
                    "image"
                )
            h, w, c = (h - kh) // sh + 1, (w - kw) // sw + 1, layer.size
            maps.append((c, h, w))
        return maps

    @property
    def output_dim(self) -> int:
        """The width of the encoder's output (the actor's first linear layer's input)."""
        linear = [layer for layer in self.layers if layer.kind == "linear"]
        if linear:
            return linear[-1].size
        c, h, w = self.feature_maps()[-1]
        return c * h * w

    def to_wire(self) -> dict[str, Any]:
        """The encoder as a plain map (``docs/protocol.md``, section 7.9)."""
        return {
            "kind": "conv",
            "shape": list(self.shape),
            "channels_first": self.channels_first,
            "divisor": float(self.divisor),
            "activation": "relu",
            "layers": [layer.to_wire() for layer in self.layers],
        }

    @classmethod
    def from_wire(cls, raw: Any) -> ImageEncoder:
        """Rebuild an encoder from :meth:`to_wire` output.

        Raises:
            ConfigError: An unknown kind or activation, a malformed field, or layers that do
                not fit the image.
        """
        try:
            if not isinstance(raw, dict):
                raise TypeError(f"encoder must be a map, got {raw!r}")
            if raw.get("kind") != "conv" or raw.get("activation", "relu") != "relu":
                raise ConfigError(
                    f"model spec: unknown encoder kind {raw.get('kind')!r} or activation "
                    f"{raw.get('activation')!r}; this client knows conv with relu: update it"
                )
            shape = tuple(_whole(v) for v in raw["shape"])
            if len(shape) != 3:
                raise ValueError(f"encoder shape must have 3 sides, got {raw['shape']!r}")
            channels_first = raw["channels_first"]
            if not isinstance(channels_first, bool):
                raise TypeError(f"channels_first must be true or false, got {channels_first!r}")
            divisor = raw["divisor"]
            if isinstance(divisor, bool) or not isinstance(divisor, int | float):
                raise TypeError(f"divisor must be a number, got {divisor!r}")
            layers = tuple(EncoderLayer.from_wire(layer) for layer in raw["layers"])
            return cls((shape[0], shape[1], shape[2]), channels_first, float(divisor), layers)
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"malformed model spec encoder: {exc!r}") from exc


def is_image_space(space: spaces.Space[Any]) -> bool:
    """Whether ``space`` is an image: a Box of rank 3."""
    return isinstance(space, spaces.Box) and len(space.shape) == 3


def channels_first(shape: tuple[int, ...]) -> bool:
    """Whether an image of ``shape`` is channels-first: its first side is its smallest."""
    return int(np.argmin(shape)) == 0


def image_part(observation_space: spaces.Space[Any]) -> spaces.Box | None:
    """The image the network reads, or None when it reads no image.

    The space itself when it is an image, or the observation beside a legal-move mask
    (:mod:`rlserve.policy.action_mask`) when that is one.

    Raises:
        UnsupportedSpaceError: A Dict or Tuple mixes an image with other parts (not yet
            supported), naming the workarounds.
    """
    if is_image_space(observation_space):
        assert isinstance(observation_space, spaces.Box)
        return observation_space
    if isinstance(observation_space, spaces.Dict) and MASK_KEY in observation_space.spaces:
        for key in OBSERVATION_KEYS:
            inner = observation_space.spaces.get(key)
            if inner is not None and is_image_space(inner):
                assert isinstance(inner, spaces.Box)
                return inner
    if _holds_image(observation_space):
        raise UnsupportedSpaceError(
            f"an observation space that mixes an image with other parts is not yet supported "
            f'for a conv encoder ({observation_space}); set encoder = "mlp" to train an MLP '
            "over the flattened observation, or send the image alone as a Box (H, W, C) and "
            "the vector parts as extra image channels"
        )
    return None


def _holds_image(space: spaces.Space[Any]) -> bool:
    if is_image_space(space):
        return True
    if isinstance(space, spaces.Dict):
        return any(_holds_image(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return any(_holds_image(s) for s in space.spaces)
    return False


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
    observation_space: spaces.Space[Any],
    encoder: str = "auto",
    conv_filters: Any = None,
    prefix: str = "encoder",
) -> ImageEncoder | None:
    """The encoder a policy over ``observation_space`` gets with these settings (None: MLP).

    ``auto`` picks :data:`NATURE_FILTERS` and a 512 linear layer for an image whose smaller side
    is at least :data:`NATURE_MIN_SIDE`, :data:`SMALL_FILTERS` for one of at least
    :data:`AUTO_MIN_SIDE`, and no encoder (the MLP) below; ``conv_filters``
    replaces the convolutions (and drops the linear layer). Layer ``i`` of the torch encoder is
    named ``{prefix}.{i}`` (its ReLUs and the flattening count as layers, as in
    ``torch.nn.Sequential``).

    Raises:
        ConfigError: Bad settings, or filters that shrink the image to nothing (naming the
            image's shape, the filters and the fix); ``encoder`` other than ``auto``/``mlp``
            for a space without an image.
        UnsupportedSpaceError: A Dict/Tuple mixing an image with other parts (unless ``mlp``).
    """
    filters = check_encoder_settings(encoder, conv_filters)
    if encoder == "mlp":
        return None
    image = image_part(observation_space)
    if image is None:
        if encoder != "auto" or filters:
            raise ConfigError(
                f"encoder '{encoder}' and conv_filters need an image observation (a Box of "
                f"rank 3), not {observation_space}; leave them unset"
            )
        return None
    shape = (int(image.shape[0]), int(image.shape[1]), int(image.shape[2]))
    first = channels_first(shape)
    h, w = (shape[1], shape[2]) if first else (shape[0], shape[1])
    dense: tuple[int, ...] = ()
    if encoder == "auto" and not filters and min(h, w) < AUTO_MIN_SIDE:
        return None
    if not filters:
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
    divisor = UINT8_DIVISOR if image.dtype == np.uint8 else 1.0
    try:
        return ImageEncoder(shape, first, divisor, tuple(layers))
    except ConfigError as exc:
        if "shrink" not in str(exc):
            raise
        raise ConfigError(
            f"conv_filters {[list(f) for f in filters]} shrink the {shape} image to nothing; "
            "use fewer layers or smaller kernels and strides (e.g. [[16, 2, 1], [32, 2, 1]])"
        ) from None


def _pair(raw: Any) -> tuple[int, int]:
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        raise TypeError(f"expected a pair of whole numbers, got {raw!r}")
    return _whole(raw[0]), _whole(raw[1])


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"expected a whole number, got {value!r}")
    return int(value)


def settings_encoder(settings: Any, observation_space: spaces.Space[Any]) -> ImageEncoder | None:
    """The encoder a learner's ``settings`` give a policy over ``observation_space``.

    Settings without ``encoder`` (SAC's) mean ``mlp``. An image encoder reads raw pixels, so
    ``normalize_observations`` left automatic stays off with one.

    Raises:
        ConfigError: As :func:`choose_encoder`, or ``normalize_observations`` set on with an
            image encoder (naming the fix).
        UnsupportedSpaceError: As :func:`choose_encoder`.
    """
    encoder = choose_encoder(
        observation_space,
        getattr(settings, "encoder", "mlp"),
        getattr(settings, "conv_filters", None),
    )
    if encoder is not None and getattr(settings, "normalize_observations", None):
        raise ConfigError(
            f"normalize_observations does not apply to the {encoder.shape} image observation "
            "(its conv encoder reads raw pixels, uint8 divided by 255); turn "
            'normalize_observations off, or set encoder = "mlp"'
        )
    return encoder
