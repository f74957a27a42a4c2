"""The image encoders' forward pass in onnxruntime, when it is installed; numpy otherwise.

:class:`~rlserve.policy.conv_forward.ObservationForward` (numpy) runs the Nature stack at about
2,700 frames/s on one core; onnxruntime runs the same network at about 6,700
(docs/benchmarks.md, "Image throughput"). :func:`observation_forward` builds the encoder as an
ONNX graph with the ``onnx`` package's helper API, from the spec and the weights alone (no
torch: the client never imports it), and runs it in an onnxruntime session on the calling
thread (one intra-op and one inter-op thread, for the reason of
:mod:`rlserve.policy.blas_threads`). The graph reads the same ``[N, input_dim]`` values and
returns the same ``[N, output_dim]`` float32 features as the numpy pass: each image sliced out,
laid out ``NCHW``, divided, convolved, flattened in torch's order and through its linear layers;
the other values passed through in their place.

Without ``onnx`` and ``onnxruntime`` (the client's optional extra ``rlserve[images]``), or when
the session cannot be built, the numpy pass runs instead and the reason is logged once per
process. ``RLSERVE_CONV_BACKEND`` picks the backend: ``auto`` (the default), ``numpy`` (to
debug or compare) or ``onnxruntime`` (an error when it cannot be used).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

import numpy as np

from rlserve.errors import ConfigError
from rlserve.policy.conv_forward import ObservationForward
from rlserve.policy.image_encoder import ImageEncoder, ObservationEncoder

BACKEND_ENV = "RLSERVE_CONV_BACKEND"
"""The environment variable that picks the conv backend: ``auto``, ``numpy`` or ``onnxruntime``."""

BACKENDS = ("auto", "numpy", "onnxruntime")
"""The values :data:`BACKEND_ENV` accepts."""

_OPSET = 17
_IR_VERSION = 8  # opset 17's; onnxruntime 1.18 and later read it

logger = logging.getLogger("rlserve.policy")
_reported: set[str] = set()


class EncoderForward(Protocol):
    """What a policy calls: ``[N, input_dim]`` inputs -> ``[N, output_dim]`` float32 features."""

    encoder: ObservationEncoder

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The encoded inputs."""
        ...


class OnnxObservationForward:
    """An :class:`ObservationEncoder` with its weights, run by an onnxruntime session.

    Args:
        encoder: The description.
        weights: Named float32 arrays, checked as :class:`ObservationForward` checks them.

    Raises:
        ConfigError: A weight is missing or has the wrong shape.
        ImportError: ``onnx`` or ``onnxruntime`` is not installed.
        Exception: onnxruntime could not build the session (its own error).
    """

    def __init__(self, encoder: ObservationEncoder, weights: dict[str, np.ndarray]):
        ObservationForward(encoder, weights)  # the numpy pass's checks and error messages
        import onnxruntime as ort

        self.encoder = encoder
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        model = encoder_model(encoder, weights)
        self._session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        self._run = self._session.run

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``[N, input_dim]`` inputs -> ``[N, output_dim]`` float32 features."""
        features = np.ascontiguousarray(x, dtype=np.float32)
        out: np.ndarray = self._run(["features"], {"x": features})[0]
        return out


def encoder_model(encoder: ObservationEncoder, weights: dict[str, np.ndarray]) -> Any:
    """The encoder as an ``onnx.ModelProto``: input ``x`` ``[N, input_dim]``, output ``features``.

    The weights must already be checked (:class:`ObservationForward`).
    """
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[Any] = []
    constants: list[Any] = []

    def constant(name: str, value: np.ndarray) -> str:
        constants.append(numpy_helper.from_array(value, name))
        return name

    def take(columns: tuple[int, int], name: str) -> str:
        start, end = columns
        starts = constant(f"{name}.starts", np.array([start], dtype=np.int64))
        ends = constant(f"{name}.ends", np.array([end], dtype=np.int64))
        axes = constant(f"{name}.axes", np.array([1], dtype=np.int64))
        nodes.append(helper.make_node("Slice", ["x", starts, ends, axes], [name]))
        return name

    pieces: list[str] = []
    position = 0
    for index, image in enumerate(encoder.images):
        if image.start > position:
            pieces.append(take((position, image.start), f"rest{index}"))
        position = image.start + image.input_dim
        pieces.append(_image_nodes(image, index, take, constant, nodes, weights))
    if position < encoder.input_dim:
        pieces.append(take((position, encoder.input_dim), "rest_end"))
    nodes.append(helper.make_node("Concat", pieces, ["features"], axis=1))
    graph = helper.make_graph(
        nodes,
        "rlserve_encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", encoder.input_dim])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", encoder.output_dim])],
        constants,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR_VERSION
    )


def _image_nodes(
    image: ImageEncoder,
    index: int,
    take: Any,
    constant: Any,
    nodes: list[Any],
    weights: dict[str, np.ndarray],
) -> str:
    """Append one image's nodes; returns the name of its ``[N, output_dim]`` features."""
    from onnx import helper

    prefix = f"image{index}"
    flat = take((image.start, image.start + image.input_dim), f"{prefix}.flat")
    shape = constant(f"{prefix}.shape", np.array([-1, *image.shape], dtype=np.int64))
    current = f"{prefix}.in"
    nodes.append(helper.make_node("Reshape", [flat, shape], [current]))
    if not image.channels_first:
        nodes.append(
            helper.make_node("Transpose", [current], [f"{prefix}.nchw"], perm=[0, 3, 1, 2])
        )
        current = f"{prefix}.nchw"
    if image.divisor != 1:
        divisor = constant(f"{prefix}.divisor", np.array(image.divisor, dtype=np.float32))
        nodes.append(helper.make_node("Div", [current, divisor], [f"{prefix}.scaled"]))
        current = f"{prefix}.scaled"
    flattened = False
    for layer in image.layers:
        w = constant(
            f"{layer.name}.weight", np.asarray(weights[f"{layer.name}.weight"], np.float32)
        )
        b = constant(f"{layer.name}.bias", np.asarray(weights[f"{layer.name}.bias"], np.float32))
        if layer.kind == "conv":
            nodes.append(
                helper.make_node(
                    "Conv",
                    [current, w, b],
                    [f"{layer.name}.out"],
                    kernel_shape=list(layer.kernel),
                    strides=list(layer.stride),
                )
            )
        else:
            if not flattened:
                nodes.append(
                    helper.make_node("Flatten", [current], [f"{prefix}.flat_maps"], axis=1)
                )
                current, flattened = f"{prefix}.flat_maps", True
            nodes.append(helper.make_node("Gemm", [current, w, b], [f"{layer.name}.out"], transB=1))
        nodes.append(helper.make_node("Relu", [f"{layer.name}.out"], [f"{layer.name}.relu"]))
        current = f"{layer.name}.relu"
    if not flattened:
        nodes.append(helper.make_node("Flatten", [current], [f"{prefix}.features"], axis=1))
        current = f"{prefix}.features"
    return current


def observation_forward(
    encoder: ObservationEncoder, weights: dict[str, np.ndarray]
) -> EncoderForward:
    """The fastest forward pass of ``encoder`` available here (see the module's docstring).

    Raises:
        ConfigError: A weight is missing or has the wrong shape; an unknown
            ``RLSERVE_CONV_BACKEND``; or ``RLSERVE_CONV_BACKEND=onnxruntime`` where onnxruntime
            cannot run the encoder.
    """
    backend = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if backend not in BACKENDS:
        raise ConfigError(
            f"{BACKEND_ENV}={backend!r} is not a conv backend; use one of {', '.join(BACKENDS)}"
        )
    if backend == "numpy":
        return ObservationForward(encoder, weights)
    try:
        return OnnxObservationForward(encoder, weights)
    except ConfigError:
        raise
    except ImportError as exc:
        reason = (
            f"onnxruntime or onnx is not installed ({exc}); install them with "
            "pip install -e '.[images]' in the checkout (or add [images] to the wheel) for "
            "about 2.5x the frames per second"
        )
        level = logging.INFO
    except Exception as exc:  # onnxruntime's own errors have no common base class
        reason = f"onnxruntime could not build the encoder's session: {exc!r}"
        level = logging.WARNING
    if backend == "onnxruntime":
        raise ConfigError(
            f"{BACKEND_ENV}=onnxruntime, but {reason}; or unset {BACKEND_ENV} to fall back to numpy"
        )
    if reason not in _reported:
        _reported.add(reason)
        logger.log(level, "the conv encoder runs in numpy: %s", reason)
    return ObservationForward(encoder, weights)
