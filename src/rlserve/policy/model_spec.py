"""The model spec: the wire form of an actor network, and the distribution it parameterises.

The learner trains a torch model; it publishes the model's description (:class:`ModelSpec`) and
its weights as named float32 arrays, and :class:`~rlserve.policy.numpy_policy.NumpyPolicy`
rebuilds the actor from the two. The spec travels in the weights message
(``docs/protocol.md``): :meth:`ModelSpec.to_wire` and :meth:`ModelSpec.from_wire` are its
only form there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from rlserve.errors import ConfigError, SpaceError
from rlserve.policy.distribution import DISTRIBUTION_KINDS, ActionDistribution, ActionPart
from rlserve.policy.image_encoder import ObservationEncoder
from rlserve.policy.memory import LSTMMemory

ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    # In place: the forward pass owns every intermediate array.
    "tanh": lambda x: np.tanh(x, out=x),
    "relu": lambda x: np.maximum(x, 0.0, out=x),
}
"""The activations a spec may name, each as the numpy forward pass applies it."""

MASKABLE_DISTRIBUTIONS = ("categorical", "multi_categorical", "epsilon_greedy")
"""The distributions whose choices a legal-move mask (``action_mask``) can mask."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What a client needs to rebuild the actor from named arrays.

    Attributes:
        obs_dim: Length of the flattened observation (with its mask, if any).
        actor_layers: Names of the actor's linear layers in order; layer ``name`` has the arrays
            ``name.weight`` (``[out, in]``) and ``name.bias``.
        activation: Activation between layers (``tanh`` or ``relu``); none after the last.
        distribution: ``categorical`` (logits over ``action_dim`` choices), ``gaussian``
            (mean of ``action_dim`` values; std from the array ``log_std``),
            ``epsilon_greedy`` (action values of ``action_dim`` choices; see ``epsilon``) or
            one of the multi-part kinds (``action_parts``).
        action_dim: Number of logits, or of action dimensions.
        action_low: Lower bounds to clip Gaussian actions to before sending (may be empty).
        action_high: Upper bounds, as ``action_low``.
        action_start: First value of a Discrete action space: choice ``i`` is sent as
            ``action_start + i``.
        action_parts: The distribution's parts as ``(kind, size)`` pairs, for the
            distributions other than ``categorical`` and ``gaussian`` (whose single part
            ``action_dim`` implies); see :mod:`rlserve.policy.distribution`.
        action_offsets: Per action column, the value added to give the environment's value
            (the ``start`` of Discrete and MultiDiscrete members), with ``action_parts``.
        epsilon: ``epsilon_greedy`` only: the probability that an exploring policy takes a
            uniformly random choice (the learner's schedule, shipped with each version). On the
            wire only for ``epsilon_greedy``; absent means 0.
        obs_mean: Observation normalisation (the learner's running statistics, frozen for this
            weights version): per flattened observation element, the value subtracted before
            the first layer. Empty (absent on the wire) when the policy reads raw observations.
        obs_std: Per element, the divisor after the subtraction (positive); with ``obs_mean``.
        obs_clip: With ``obs_mean``: the normalised observation is clipped to
            ``[-obs_clip, obs_clip]``. The first layer reads
            ``clip((obs - obs_mean) / obs_std, -obs_clip, obs_clip)``, in float32.
        action_scale: Per action column, the factor from the Gaussian's normalised units to the
            space's units (see :mod:`rlserve.policy.distribution`); empty (absent on the wire)
            when Gaussian values are in the space's units.
        action_bias: Per action column, the value added after ``action_scale``.
        action_mask: ``(start, size)`` of the legal-move mask in the flattened observation
            (:mod:`rlserve.policy.action_mask`), or None (absent on the wire) without one. The
            first layer then reads the other ``obs_dim - size`` values (:attr:`input_dim`;
            ``obs_mean`` and ``obs_std`` have as many), and the actor's outputs of illegal
            choices are masked; ``size`` equals ``action_dim``. Only ``categorical``,
            ``multi_categorical`` and ``epsilon_greedy`` policies have one.
        encoder: The convolutional encoders of the observation's images
            (:mod:`rlserve.policy.image_encoder`), or None (absent on the wire) for an MLP over
            the flattened observation. It reads the first layer's input (``input_dim`` values)
            and the first of ``actor_layers`` reads its output. Never with observation
            normalisation.
        memory: The LSTM between the encoded observation and ``actor_layers``
            (:mod:`rlserve.policy.memory`), or None (absent on the wire) for a policy without
            recurrent state. It reads :attr:`encoded_dim` values (its ``input_dim``) and the
            first of ``actor_layers`` reads its ``h`` (``cell_size`` values).
    """

    obs_dim: int
    actor_layers: tuple[str, ...]
    activation: str
    distribution: str
    action_dim: int
    action_low: tuple[float, ...] = field(default=())
    action_high: tuple[float, ...] = field(default=())
    action_start: int = 0
    action_parts: tuple[tuple[str, int], ...] = field(default=())
    action_offsets: tuple[int, ...] = field(default=())
    epsilon: float = 0.0
    obs_mean: tuple[float, ...] = field(default=())
    obs_std: tuple[float, ...] = field(default=())
    obs_clip: float | None = None
    action_scale: tuple[float, ...] = field(default=())
    action_bias: tuple[float, ...] = field(default=())
    action_mask: tuple[int, int] | None = None
    encoder: ObservationEncoder | None = None
    memory: LSTMMemory | None = None

    def __post_init__(self) -> None:
        self._check_mask()
        if self.memory is not None and self.memory.input_dim != self.encoded_dim:
            raise ConfigError(
                f"model spec: the LSTM reads {self.memory.input_dim} values; the encoded "
                f"observation has {self.encoded_dim}"
            )
        if self.encoder is not None:
            if self.encoder.input_dim != self.input_dim:
                raise ConfigError(
                    f"model spec: the encoder reads {self.encoder.input_dim} values; the first "
                    f"layer's input has {self.input_dim}"
                )
            if self.obs_mean or self.obs_std or self.obs_clip is not None:
                raise ConfigError(
                    "model spec: an image encoder reads raw pixels; it has no obs_mean, obs_std "
                    "or obs_clip (train with normalize_observations off)"
                )
        if not (self.obs_mean or self.obs_std or self.obs_clip is not None):
            return
        width = self.input_dim
        if len(self.obs_mean) != width or len(self.obs_std) != width:
            need = "obs_dim" if self.action_mask is None else "input_dim (obs_dim less the mask)"
            raise ConfigError(
                f"model spec: obs_mean and obs_std need {need} = {width} values each; got "
                f"{len(self.obs_mean)} and {len(self.obs_std)}"
            )
        if self.obs_clip is None or not (math.isfinite(self.obs_clip) and self.obs_clip > 0):
            raise ConfigError(
                f"model spec: obs_clip must be a finite positive number with obs_mean, got "
                f"{self.obs_clip}"
            )
        mean = np.asarray(self.obs_mean, dtype=np.float64)
        std = np.asarray(self.obs_std, dtype=np.float64)
        if not np.isfinite(mean).all():
            raise ConfigError("model spec: obs_mean holds a value that is not finite")
        if not (np.isfinite(std).all() and (std > 0).all()):
            raise ConfigError("model spec: obs_std must hold finite positive values")

    def _check_mask(self) -> None:
        if self.action_mask is None:
            return
        start, size = self.action_mask
        if self.distribution not in MASKABLE_DISTRIBUTIONS:
            raise ConfigError(
                f"model spec: a {self.distribution} policy cannot have an action_mask; only "
                f"{', '.join(MASKABLE_DISTRIBUTIONS)} ones"
            )
        if size != self.action_dim or start < 0 or start + size > self.obs_dim:
            raise ConfigError(
                f"model spec: action_mask {self.action_mask} must be (start, action_dim = "
                f"{self.action_dim}) within the obs_dim = {self.obs_dim} observation values"
            )

    @property
    def input_dim(self) -> int:
        """Width of the first layer's input: ``obs_dim`` less the mask's values."""
        return self.obs_dim - (0 if self.action_mask is None else self.action_mask[1])

    @property
    def encoded_dim(self) -> int:
        """Width of the encoded observation: the encoder's output, or :attr:`input_dim`."""
        return self.input_dim if self.encoder is None else self.encoder.output_dim

    @property
    def state_size(self) -> int:
        """Width of the recurrent state: ``2 * memory.cell_size``, 0 without memory."""
        return 0 if self.memory is None else self.memory.state_size

    @property
    def normalizes_observations(self) -> bool:
        """True when the first layer reads normalised observations (``obs_mean`` is given)."""
        return bool(self.obs_mean)

    @classmethod
    def for_distribution(
        cls,
        obs_dim: int,
        actor_layers: tuple[str, ...],
        activation: str,
        distribution: ActionDistribution,
        action_mask: tuple[int, int] | None = None,
        encoder: ObservationEncoder | None = None,
        cell_size: int = 0,
    ) -> ModelSpec:
        """The spec of an actor that parameterises ``distribution``.

        Masked by ``action_mask``, reading images through ``encoder``, when given; with an
        LSTM of ``cell_size`` cells (:attr:`memory`) when that is positive.
        """
        dim = distribution.param_dim
        base = cls(
            obs_dim,
            actor_layers,
            activation,
            distribution.kind,
            dim,
            action_scale=distribution.scale,
            action_bias=distribution.bias,
            action_mask=action_mask,
            encoder=encoder,
        )
        if cell_size:
            base = replace(base, memory=LSTMMemory(cell_size, base.encoded_dim))
        if distribution.kind == "categorical":
            return replace(base, action_start=distribution.offsets[0])
        if distribution.kind == "epsilon_greedy":
            return replace(base, action_start=distribution.offsets[0], epsilon=distribution.epsilon)
        if distribution.kind == "gaussian":
            return replace(base, action_low=distribution.low, action_high=distribution.high)
        return replace(
            base,
            action_low=distribution.low,
            action_high=distribution.high,
            action_parts=tuple((p.kind, p.size) for p in distribution.parts),
            action_offsets=distribution.offsets,
        )

    def action_distribution(self) -> ActionDistribution:
        """The distribution this spec describes.

        Raises:
            ConfigError: The action fields do not describe a valid distribution.
        """
        try:
            if self.distribution in ("categorical", "epsilon_greedy"):
                if self.action_scale or self.action_bias:
                    raise ConfigError(
                        f"model spec: a {self.distribution} policy has no action_scale or "
                        "action_bias"
                    )
                part = ActionPart("categorical", self.action_dim)
                inf = (math.inf,)
                return ActionDistribution(
                    self.distribution,
                    (part,),
                    (self.action_start,),
                    (-math.inf,),
                    inf,
                    self.epsilon if self.distribution == "epsilon_greedy" else 0.0,
                )
            if self.distribution == "gaussian":
                dim = self.action_dim
                return ActionDistribution(
                    "gaussian",
                    (ActionPart("gaussian", dim),),
                    (0,) * dim,
                    self.action_low or (-math.inf,) * dim,
                    self.action_high or (math.inf,) * dim,
                    scale=self.action_scale,
                    bias=self.action_bias,
                )
            distribution = ActionDistribution(
                self.distribution,
                tuple(ActionPart(kind, size) for kind, size in self.action_parts),
                self.action_offsets,
                self.action_low,
                self.action_high,
                scale=self.action_scale,
                bias=self.action_bias,
            )
        except SpaceError as exc:
            raise ConfigError(f"model spec: {exc}") from exc
        if distribution.param_dim != self.action_dim:
            raise ConfigError(
                f"model spec: the action parts need {distribution.param_dim} actor outputs; "
                f"action_dim is {self.action_dim}"
            )
        return distribution

    def to_wire(self) -> dict[str, Any]:
        """Return the spec as a plain map."""
        data = asdict(self)
        data["actor_layers"] = list(self.actor_layers)
        if self.distribution in ("categorical", "gaussian", "epsilon_greedy"):
            del data["action_parts"], data["action_offsets"]
        else:
            data["action_parts"] = [{"kind": k, "size": n} for k, n in self.action_parts]
            data["action_offsets"] = list(self.action_offsets)
        if self.distribution != "epsilon_greedy":
            del data["epsilon"]  # the wire form of the other kinds is as it always was
        # Normalisation fields only when in use: a spec without them is as it always was.
        if self.obs_mean:
            data["obs_mean"] = [float(v) for v in self.obs_mean]
            data["obs_std"] = [float(v) for v in self.obs_std]
            data["obs_clip"] = float(data["obs_clip"])
        else:
            del data["obs_mean"], data["obs_std"], data["obs_clip"]
        if self.action_scale:
            data["action_scale"] = [float(v) for v in self.action_scale]
            data["action_bias"] = [float(v) for v in self.action_bias]
        else:
            del data["action_scale"], data["action_bias"]
        if self.action_mask is None:
            del data["action_mask"]  # absent: no mask, as a spec from before masks
        else:
            data["action_mask"] = {"start": self.action_mask[0], "size": self.action_mask[1]}
        if self.encoder is None:
            del data["encoder"]  # absent: an MLP over the flattened observation, as always
        else:
            data["encoder"] = self.encoder.to_wire()
        if self.memory is None:
            del data["memory"]  # absent: no recurrent state, as a spec from before memory
        else:
            data["memory"] = self.memory.to_wire()
        # JSON has no infinity: an unbounded side is written as null, as in space descriptions.
        data["action_low"] = [v if math.isfinite(v) else None for v in self.action_low]
        data["action_high"] = [v if math.isfinite(v) else None for v in self.action_high]
        return data

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> ModelSpec:
        """Rebuild a spec from :meth:`to_wire` output.

        Absent normalisation fields (``obs_mean``, ``obs_std``, ``obs_clip``, ``action_scale``,
        ``action_bias``), an absent ``action_mask``, ``encoder`` and ``memory`` mean none, as in
        a spec from before they existed.

        Raises:
            ConfigError: Unknown activation or distribution, missing fields, or normalisation
                fields of the wrong length, not finite, or a divisor or scale that is not
                positive.
        """
        try:
            spec = cls(
                obs_dim=int(raw["obs_dim"]),
                actor_layers=tuple(str(n) for n in raw["actor_layers"]),
                activation=str(raw["activation"]),
                distribution=str(raw["distribution"]),
                action_dim=int(raw["action_dim"]),
                action_low=tuple(
                    -math.inf if v is None else float(v) for v in raw.get("action_low", ())
                ),
                action_high=tuple(
                    math.inf if v is None else float(v) for v in raw.get("action_high", ())
                ),
                action_start=int(raw.get("action_start", 0)),
                action_parts=tuple(
                    (str(p["kind"]), int(p["size"])) for p in raw.get("action_parts", ())
                ),
                action_offsets=tuple(int(v) for v in raw.get("action_offsets", ())),
                epsilon=float(raw.get("epsilon", 0.0)),
                obs_mean=_floats(raw.get("obs_mean", ())),
                obs_std=_floats(raw.get("obs_std", ())),
                obs_clip=None if raw.get("obs_clip") is None else float(raw["obs_clip"]),
                action_scale=_floats(raw.get("action_scale", ())),
                action_bias=_floats(raw.get("action_bias", ())),
                action_mask=_mask(raw.get("action_mask")),
                encoder=None
                if raw.get("encoder") is None
                else ObservationEncoder.from_wire(raw["encoder"]),
            )
            if raw.get("memory") is not None:
                # The LSTM's input width is implied by the fields above.
                spec = replace(spec, memory=LSTMMemory.from_wire(raw["memory"], spec.encoded_dim))
        except ConfigError:
            raise  # a field of the right type with a wrong value: the message says which
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"malformed model spec: {exc!r}") from exc
        if spec.activation not in ACTIVATIONS:
            raise ConfigError(f"unknown activation '{spec.activation}'; use tanh or relu")
        if spec.distribution not in DISTRIBUTION_KINDS:
            raise ConfigError(
                f"unknown distribution '{spec.distribution}'; known: "
                f"{', '.join(DISTRIBUTION_KINDS)}"
            )
        spec.action_distribution()  # refuses inconsistent action fields
        return spec


def _mask(raw: Any) -> tuple[int, int] | None:
    """The wire's ``action_mask`` map as ``(start, size)``; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError(f"action_mask must be a map of start and size, got {raw!r}")
    values = (raw["start"], raw["size"])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(f"action_mask start and size must be whole numbers, got {raw!r}")
    return int(values[0]), int(values[1])


def _floats(values: Any) -> tuple[float, ...]:
    """A wire list of numbers as floats; anything else (a string, a map, a boolean) is refused."""
    if not isinstance(values, list | tuple):
        raise TypeError(f"expected a list of numbers, got {type(values).__name__}")
    for v in values:
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.number):
            raise TypeError(f"expected a list of numbers, found {v!r}")
    return tuple(float(v) for v in values)
