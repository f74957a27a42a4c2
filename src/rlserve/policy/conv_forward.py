"""The image encoders' forward pass in numpy (:mod:`rlserve.policy.image_encoder`).

Each convolution is one matrix product: the input's ``kh x kw`` windows (a strided view, no copy
until the product) against the filters reshaped to ``[in_channels * kh * kw, filters]``. Feature
maps are kept channels-last between layers (the product's natural layout) and flattened in
torch's channel, row, column order at the end, so the arrays are those of a torch ``Conv2d`` /
``Linear`` stack and the result matches it to float32 rounding.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rlserve.errors import ConfigError
from rlserve.policy.blas_threads import one_blas_thread
from rlserve.policy.image_encoder import ImageEncoder, ObservationEncoder


class ConvForward:
    """An :class:`ImageEncoder` with its weights, ready to run.

    Args:
        encoder: The description.
        weights: Named float32 arrays: ``name.weight`` and ``name.bias`` of every layer.

    Raises:
        ConfigError: A weight is missing or has the wrong shape.
    """

    def __init__(self, encoder: ImageEncoder, weights: dict[str, np.ndarray]):
        self.encoder = encoder
        self._divisor = np.float32(encoder.divisor)
        self._convs: list[tuple[np.ndarray, np.ndarray, int, int, int, int]] = []
        self._linear: list[tuple[np.ndarray, np.ndarray]] = []
        channels = encoder.hwc[2]
        width = 0
        for layer in encoder.layers:
            w, b = _arrays(weights, layer.name)
            if layer.kind == "conv":
                kh, kw = layer.kernel
                expected: tuple[int, ...] = (layer.size, channels, kh, kw)
                if w.shape != expected or b.shape != (layer.size,):
                    raise ConfigError(
                        f"encoder layer '{layer.name}' has weight {w.shape} and bias {b.shape}; "
                        f"expected {list(expected)} and [{layer.size}]"
                    )
                # [filters, C, kh, kw] -> [C * kh * kw, filters], the windows' order.
                matrix = np.ascontiguousarray(w.reshape(layer.size, -1).T)
                self._convs.append((matrix, b, kh, kw, *layer.stride))
                channels = layer.size
            else:
                if not width:
                    c, h, w_ = encoder.feature_maps()[-1]
                    width = c * h * w_
                if w.shape != (layer.size, width) or b.shape != (layer.size,):
                    raise ConfigError(
                        f"encoder layer '{layer.name}' has weight {w.shape} and bias {b.shape}; "
                        f"expected [{layer.size}, {width}] and [{layer.size}]"
                    )
                self._linear.append((np.ascontiguousarray(w.T), b))
                width = layer.size

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``[N, input_dim]`` flattened images -> ``[N, output_dim]`` float32 features."""
        encoder = self.encoder
        rows = x.shape[0]
        image = np.asarray(x, dtype=np.float32).reshape(rows, *encoder.shape)
        if encoder.channels_first:
            image = image.transpose(0, 2, 3, 1)  # NCHW -> NHWC
        if self._divisor != 1:
            image = image / self._divisor
        for matrix, bias, kh, kw, sh, sw in self._convs:
            windows = sliding_window_view(image, (kh, kw), axis=(1, 2))[:, ::sh, ::sw]
            _, oh, ow = windows.shape[:3]
            # [N, oh, ow, C, kh, kw] -> one row per output position.
            out = windows.reshape(rows * oh * ow, -1) @ matrix
            out += bias
            np.maximum(out, 0.0, out=out)
            image = out.reshape(rows, oh, ow, -1)
        features = image.transpose(0, 3, 1, 2).reshape(rows, -1)  # torch's C, H, W order
        for w, b in self._linear:
            features = features @ w
            features += b
            np.maximum(features, 0.0, out=features)
        return np.ascontiguousarray(features, dtype=np.float32)


class ObservationForward:
    """An :class:`ObservationEncoder` with its weights: each image encoded, the rest as is.

    Raises:
        ConfigError: A weight is missing or has the wrong shape.
    """

    def __init__(self, encoder: ObservationEncoder, weights: dict[str, np.ndarray]):
        self.encoder = encoder
        self._images = [(image, ConvForward(image, weights)) for image in encoder.images]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``[N, input_dim]`` inputs -> ``[N, output_dim]`` float32 features."""
        with one_blas_thread():
            return self._encode(x)

    def _encode(self, x: np.ndarray) -> np.ndarray:
        if len(self._images) == 1 and self.encoder.input_dim == self.encoder.images[0].input_dim:
            return self._images[0][1](x)
        pieces = []
        position = 0
        for image, forward in self._images:
            if image.start > position:
                pieces.append(np.asarray(x[:, position : image.start], dtype=np.float32))
            position = image.start + image.input_dim
            pieces.append(forward(x[:, image.start : position]))
        if position < x.shape[1]:
            pieces.append(np.asarray(x[:, position:], dtype=np.float32))
        return np.concatenate(pieces, axis=1)


def _arrays(weights: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        w = np.asarray(weights[f"{name}.weight"], dtype=np.float32)
        b = np.asarray(weights[f"{name}.bias"], dtype=np.float32)
    except KeyError as exc:
        raise ConfigError(f"weights are missing {exc} for the encoder layer '{name}'") from exc
    return w, b
