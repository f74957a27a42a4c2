"""Image observations: the description of the convolutional encoders a model spec carries.

A ``Box`` of rank 3 is an image, channels-last ``(H, W, C)`` or channels-first ``(C, H, W)``
(:mod:`rlserve.policy.encoder_choice` detects it and picks the layers). A policy over images
reads the first layer's input through an :class:`ObservationEncoder`: each image's values (a
slice of that input) are replaced by the output of its :class:`ImageEncoder`, a stack of valid
(unpadded) convolutions, each followed by ReLU, then the flattening of the last feature map
(channel, row, column order, as torch's ``Flatten`` of ``NCHW``) and optional linear layers, each
followed by ReLU; the other values (vector parts of a Dict or Tuple) pass as they are, in their
order (SB3's ``CombinedExtractor``). The actor's linear layers (the ``hidden`` MLP and its head)
come after. A ``uint8`` image is divided by 255 inside the model; the wire carries the uint8
values as they are.

The encoder travels in the model spec (``docs/protocol.md``, section 7.9, ``encoder``); its
numpy forward pass is :mod:`rlserve.policy.conv_forward`. Needs numpy and gymnasium only, never
torch: the client uses it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.errors import ConfigError


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
        start: Where the image's values (row-major in ``shape``) begin in the first layer's
            input (the flattened observation without its mask).
    """

    shape: tuple[int, int, int]
    channels_first: bool
    divisor: float
    layers: tuple[EncoderLayer, ...]
    start: int = 0

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ConfigError(f"an image's start must be 0 or more, got {self.start}")
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
        return math.prod(int(side) for side in self.shape)  # exact: np.prod wraps in int64

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
        """The image's encoder as a plain map (``docs/protocol.md``, section 7.9)."""
        return {
            "kind": "conv",
            "start": self.start,
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
            start = _whole(raw["start"])
            return cls(
                (shape[0], shape[1], shape[2]), channels_first, float(divisor), layers, start
            )
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"malformed model spec encoder: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class ObservationEncoder:
    """The first layer's input with each image's values replaced by their encoding.

    Attributes:
        input_dim: The width of the input (``ModelSpec.input_dim``).
        images: The images' encoders, by ``start``; their slices do not overlap. The values
            outside them pass through unchanged, in their order.
    """

    input_dim: int
    images: tuple[ImageEncoder, ...]

    def __post_init__(self) -> None:
        if not self.images:
            raise ConfigError("model spec: an encoder needs at least one image")
        end = 0
        for image in self.images:
            if image.start < end:
                raise ConfigError(
                    f"model spec: encoder images must be in order and not overlap; one starts "
                    f"at {image.start}, before {end}"
                )
            end = image.start + image.input_dim
        if end > self.input_dim:
            raise ConfigError(
                f"model spec: an encoder image ends at {end}, past the input's {self.input_dim} "
                "values"
            )

    @property
    def output_dim(self) -> int:
        """The width of the encoded input (the first of the actor's linear layers reads it)."""
        encoded = sum(image.output_dim - image.input_dim for image in self.images)
        return self.input_dim + encoded

    def to_wire(self) -> dict[str, Any]:
        """The encoder as a plain map (``docs/protocol.md``, section 7.9)."""
        return {"input_dim": self.input_dim, "images": [i.to_wire() for i in self.images]}

    @classmethod
    def from_wire(cls, raw: Any) -> ObservationEncoder:
        """Rebuild an encoder from :meth:`to_wire` output.

        Raises:
            ConfigError: A malformed field, an unknown kind, or images that do not fit.
        """
        try:
            if not isinstance(raw, dict) or not isinstance(raw["images"], list):
                raise TypeError(f"encoder must be a map with a list of images, got {raw!r}")
            images = tuple(ImageEncoder.from_wire(image) for image in raw["images"])
            return cls(_whole(raw["input_dim"]), images)
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"malformed model spec encoder: {exc!r}") from exc


def _pair(raw: Any) -> tuple[int, int]:
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        raise TypeError(f"expected a pair of whole numbers, got {raw!r}")
    return _whole(raw[0]), _whole(raw[1])


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"expected a whole number, got {value!r}")
    return int(value)
