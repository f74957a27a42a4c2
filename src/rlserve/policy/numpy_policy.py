"""A numpy implementation of the actor network and its action distribution.

The learner trains a torch model; it publishes the model's description
(:class:`~rlserve.policy.model_spec.ModelSpec`, also importable from here) and its weights as
named float32 arrays. This module turns those into actions with numpy alone, so the server's
inference loop and a local-inference client share one implementation and never import torch.
``tests/policy/test_numpy_policy.py`` checks it against the torch model.
"""

from __future__ import annotations

import math

import numpy as np

from rlserve.errors import ConfigError
from rlserve.policy.action_mask import features, legal, mask_logits, part_sizes, require_legal
from rlserve.policy.conv_onnx import EncoderForward, observation_forward
from rlserve.policy.gaussian import LOG_2PI
from rlserve.policy.greedy import (
    epsilon_greedy_choices,
    epsilon_greedy_log_prob,
    epsilon_greedy_one,
)
from rlserve.policy.matmul import SERIAL_MATMUL_WORK, serial_matmul
from rlserve.policy.memory import LSTMForward, check_state
from rlserve.policy.model_spec import ACTIVATIONS, ModelSpec
from rlserve.policy.policy_output import PolicyOutput

__all__ = ["SERIAL_MATMUL_WORK", "ModelSpec", "NumpyPolicy", "PolicyOutput"]

_maximum, _subtract, _exp, _add, _less, _where, _log, _tanh = (
    np.maximum,
    np.subtract,
    np.exp,
    np.add,
    np.less,
    np.where,
    np.log,
    np.tanh,
)

_TILED_ROWS = 64
"""Batches up to this many rows (no more than the layers' one-thread bound) take the small-batch
forward pass, its biases tiled once per batch size."""

_SMALL_CHOICE = 16
"""Up to this many choices, a single categorical decision is sampled with plain floats."""


class NumpyPolicy:
    """The actor network evaluated with numpy.

    Args:
        spec: The architecture.
        weights: Named float32 arrays (every ``layer.weight``/``layer.bias``, ``log_std`` for
            a gaussian policy, and the LSTM's ``memory.*`` for a policy with memory).
        version: The weights version, carried into every sample it produces.
        seed: Seed of the sampling random generator.

    Raises:
        ConfigError: A weight is missing or has the wrong shape.
    """

    def __init__(
        self, spec: ModelSpec, weights: dict[str, np.ndarray], version: int, seed: int = 0
    ):
        self.spec = spec
        self.version = version
        self._rng = np.random.default_rng(seed)
        self._act = ACTIVATIONS[spec.activation]
        self._tanh = spec.activation == "tanh"
        self._layers: list[tuple[np.ndarray, np.ndarray]] = []
        in_dim = spec.input_dim
        self._encoder: EncoderForward | None = None
        if spec.encoder is not None:
            self._encoder = observation_forward(spec.encoder, weights)
            in_dim = spec.encoder.output_dim
            # An instance attribute: the MLP path's forward stays free of a per-call test.
            self.forward = self._image_forward  # type: ignore[method-assign]
        self._memory: LSTMForward | None = None
        self.state_size = spec.state_size
        """Width of the recurrent state (``2 * cell_size``); 0 for a policy without memory."""
        if spec.memory is not None:
            self._memory = LSTMForward(spec.memory, weights)
            in_dim = spec.memory.cell_size
            # Instance attributes, as above: the paths without memory stay as they were.
            self.forward = self._stateless_forward  # type: ignore[method-assign]
            self.compute_actions = self._recurrent_compute_actions  # type: ignore[method-assign]
        for name in spec.actor_layers:
            try:
                w = np.asarray(weights[f"{name}.weight"], dtype=np.float32)
                b = np.asarray(weights[f"{name}.bias"], dtype=np.float32)
            except KeyError as exc:
                raise ConfigError(f"weights are missing {exc} for the layer '{name}'") from exc
            if w.ndim != 2 or w.shape[1] != in_dim or b.shape != (w.shape[0],):
                raise ConfigError(
                    f"layer '{name}' has weight {w.shape} and bias {b.shape}; expected "
                    f"[out, {in_dim}] and [out]"
                )
            # Stored transposed so the forward pass is x @ w without a copy per call.
            self._layers.append((np.ascontiguousarray(w.T), b))
            in_dim = w.shape[0]
        if in_dim != spec.action_dim:
            raise ConfigError(f"actor output is {in_dim} wide; action_dim is {spec.action_dim}")
        self.distribution = spec.action_distribution()
        self._mask = spec.action_mask
        self._mask_sizes = part_sizes(self.distribution.parts)
        self._log_std: np.ndarray | None = None
        gaussian_dim = self.distribution.gaussian_dim
        if gaussian_dim:
            if "log_std" not in weights:
                raise ConfigError(f"a {spec.distribution} policy needs the array 'log_std'")
            self._log_std = np.asarray(weights["log_std"], dtype=np.float32)
            if self._log_std.shape != (gaussian_dim,):
                raise ConfigError(
                    f"log_std has shape {self._log_std.shape}; expected ({gaussian_dim},)"
                )
        self._low = np.asarray(spec.action_low, dtype=np.float32)
        self._high = np.asarray(spec.action_high, dtype=np.float32)
        self._obs_mean: np.ndarray | None = None
        self._obs_std = np.zeros(0, dtype=np.float32)
        self._obs_clip = np.float32(0.0)
        if spec.normalizes_observations:
            self._obs_mean = np.asarray(spec.obs_mean, dtype=np.float32)
            self._obs_std = np.asarray(spec.obs_std, dtype=np.float32)
            self._obs_clip = np.float32(spec.obs_clip)
        self._scale: np.ndarray | None = None
        self._bias = np.zeros(0, dtype=np.float32)
        if spec.action_scale:
            self._scale = np.asarray(spec.action_scale, dtype=np.float32)
            self._bias = np.asarray(spec.action_bias, dtype=np.float32)
        self._serial_rows = min(
            (
                SERIAL_MATMUL_WORK // (w.shape[0] * w.shape[1])
                for w, _ in self._layers
                if 2 * w.shape[0] * w.shape[1] <= SERIAL_MATMUL_WORK
            ),
            default=1 << 62,
        )
        self._rows: dict[int, np.ndarray] = {}
        self._tiled: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        """Small batch sizes' layers: each weight with its bias tiled to the batch."""

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """``[N, obs_dim]`` observations as the first layer reads them, as a new float32 array.

        Without the mask's values, when the spec has one (``[N, input_dim]``); then
        ``clip((obs - obs_mean) / obs_std, -obs_clip, obs_clip)`` when the spec normalises
        observations; a float32 copy otherwise.
        """
        obs = features(obs, self._mask)
        if self._obs_mean is None:
            return np.array(obs, dtype=np.float32)
        x = np.subtract(obs, self._obs_mean, dtype=np.float32)
        np.divide(x, self._obs_std, out=x)
        # np.clip's values, through two ufunc calls: np.clip goes through three Python-level
        # wrappers first, which cost about twice the arithmetic at this size (every flush).
        np.minimum(x, self._obs_clip, out=x)
        return np.maximum(x, -self._obs_clip, out=x)

    def forward(self, obs: np.ndarray) -> np.ndarray:
        """Return the actor's raw output (logits or means) for ``[N, obs_dim]`` observations.

        ``obs`` are the raw flattened observations: the mask's values are left out and a
        spec's observation normalisation is applied here, before the first layer. The output is
        a new array (never ``obs``), not masked: the caller may change it in place.
        """
        if self._obs_mean is not None:
            x = self.normalize(obs)
        else:
            x = features(obs, self._mask)
            x = x if self._layers else x.copy()
        last = len(self._layers) - 1
        rows = x.shape[0]
        if rows <= _TILED_ROWS and rows <= self._serial_rows and last >= 0:
            # A small batch: the BLAS call as it is, and biases tiled to the batch (a broadcast
            # add costs more than the add itself at this size).
            layers = self._tiled.get(rows)
            if layers is None:
                layers = self._tiled[rows] = [(w, np.tile(b, (rows, 1))) for w, b in self._layers]
            # Hidden layers then the output layer, without a per-layer test or a lambda call.
            tanh = self._tanh
            for w, b in layers[:last]:
                x = x.dot(w)
                x += b
                if tanh:
                    _tanh(x, out=x)
                else:
                    x = self._act(x)
            w, b = layers[last]
            x = x.dot(w)
            x += b
            return x
        for i, (w, b) in enumerate(self._layers):
            x = serial_matmul(x, w)
            x += b
            if i != last:
                x = self._act(x)
        return x

    def _image_forward(self, obs: np.ndarray) -> np.ndarray:
        """:meth:`forward` of a spec with an image encoder: the encoder, then the linear layers."""
        assert self._encoder is not None
        return self._linear(self._encoder(features(obs, self._mask)))

    def _linear(self, x: np.ndarray) -> np.ndarray:
        """The actor's linear layers over ``x`` (a new array, which the layers may change)."""
        last = len(self._layers) - 1
        for i, (w, b) in enumerate(self._layers):
            x = serial_matmul(x, w)
            x += b
            if i != last:
                x = self._act(x)
        return x

    def compute_actions(
        self, obs: np.ndarray, explore: bool = True, state: np.ndarray | None = None
    ) -> PolicyOutput:
        """Sample (or, without exploration, pick the most likely) actions for a batch.

        With a legal-move mask (the spec's ``action_mask``) only legal choices are taken, and
        their probabilities are those of the masked distribution.

        Args:
            obs: ``[N, obs_dim]`` float32 flattened observations.
            explore: Sample from the distribution when True; take its mode when False.
            state: With memory (``state_size > 0``): ``[N, state_size]`` float32, each row's
                recurrent state (:meth:`initial_state` at an episode's start, then the
                previous output's ``state``); never changed. Ignored without memory.

        Raises:
            SpaceError: An observation's mask marks no choice legal (in some sub-action), or,
                with memory, ``state`` is missing or of the wrong shape.
        """
        out = self.forward(obs)
        if self._mask is None:
            return self._compute(obs, out, explore)
        return self._masked_actions(obs, out, explore, None)

    def _recurrent_compute_actions(
        self, obs: np.ndarray, explore: bool = True, state: np.ndarray | None = None
    ) -> PolicyOutput:
        """:meth:`compute_actions` of a policy with memory."""
        out, next_state = self.recurrent_forward(obs, state)
        if self._mask is None:
            result = self._compute(obs, out, explore)
        else:
            result = self._masked_actions(obs, out, explore, state)
        result.state = next_state
        return result

    def _masked_actions(
        self, obs: np.ndarray, out: np.ndarray, explore: bool, state: np.ndarray | None
    ) -> PolicyOutput:
        """:meth:`compute_actions` with a legal-move mask, from the actor's output ``out``."""
        out = self._masked(obs, out)
        if self.spec.distribution == "epsilon_greedy":
            actions = epsilon_greedy_choices(out, self.spec.epsilon, self._rng, explore, True)
            logp = epsilon_greedy_log_prob(out, self.spec.epsilon, actions, True)
            return PolicyOutput(actions, logp)
        result = self._compute(obs, out.copy(), explore)
        return self._legal_only(obs, out, result, state)

    def initial_state(self, rows: int) -> np.ndarray:
        """``[rows, state_size]`` float32 zeros: the recurrent state at an episode's start."""
        return np.zeros((rows, self.state_size), dtype=np.float32)

    def recurrent_forward(
        self, obs: np.ndarray, state: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The actor's raw output and the next recurrent state, for a policy with memory.

        ``obs`` is encoded as :meth:`forward` would (mask left out, normalised or through the
        image encoder), stepped through the LSTM from ``state`` (``[N, state_size]``, not
        changed), and the actor's linear layers read the new ``h``. Both results are new
        arrays; the first may be changed in place.

        Raises:
            SpaceError: ``state`` is missing or of the wrong shape.
            ConfigError: The policy has no memory.
        """
        if self._memory is None:
            raise ConfigError("this policy has no memory: call forward(obs), without a state")
        state = check_state(state, obs.shape[0], self.state_size)
        next_state = self._memory(self._encoded(obs), state)
        x = next_state[:, : self.state_size // 2]  # h
        if not self._layers:
            return x.copy(), next_state  # the caller may change the output in place
        return self._linear(x), next_state

    def _encoded(self, obs: np.ndarray) -> np.ndarray:
        """``[N, obs_dim]`` observations as the LSTM reads them (``[N, encoded_dim]``)."""
        if self._encoder is not None:
            return self._encoder(features(obs, self._mask))
        if self._obs_mean is not None:
            return self.normalize(obs)
        return np.asarray(features(obs, self._mask), dtype=np.float32)

    def _stateless_forward(self, obs: np.ndarray) -> np.ndarray:
        """:meth:`forward` of a policy with memory: refused, it needs the state."""
        raise ConfigError(
            "this policy has memory: its output depends on the recurrent state; call "
            "recurrent_forward(obs, state) or compute_actions(obs, explore, state)"
        )

    def _compute(self, obs: np.ndarray, out: np.ndarray, explore: bool) -> PolicyOutput:
        """:meth:`compute_actions` from the actor's output ``out`` (changed in place)."""
        if self.spec.distribution == "epsilon_greedy":
            return self._epsilon_greedy(out, explore)
        if self.spec.distribution == "categorical":
            if obs.shape[0] == 1 and out.shape[1] <= _SMALL_CHOICE:
                return self._sample_one(out[0].tolist(), explore)
            if explore and out.shape[1] == 2:
                return self._sample_two(out)
            # The ufuncs' own reductions: ndarray.max/.sum add a Python layer per call, which
            # is a good part of a small batch's time. ``out`` is ours: shifted in place.
            rows = obs.shape[0]
            shifted = np.subtract(out, np.maximum.reduce(out, axis=1, keepdims=True), out=out)
            weights = np.exp(shifted)
            total = np.add.reduce(weights, axis=1)
            if explore:
                u = self._rng.random(rows)
                u *= total
                # The action is how many running sums stay below u, at most K - 1: the last
                # sum (the total) need not be compared, as the sums never decrease.
                if out.shape[1] == 2:
                    actions = np.less(weights[:, 0], u).astype(np.int64)
                else:
                    below = np.less(np.cumsum(weights[:, :-1], axis=1), u[:, None])
                    actions = np.add.reduce(below, axis=1, dtype=np.int64)
            else:
                actions = shifted.argmax(axis=1)
            logp = shifted[self._row_index(rows), actions]
            logp -= np.log(total)
            return PolicyOutput(actions, logp.astype(np.float32, copy=False))
        if self.spec.distribution != "gaussian":
            actions, logp = self.distribution.sample(out, self._log_std, self._rng, explore)
            return PolicyOutput(actions, logp)
        assert self._log_std is not None
        std = np.exp(self._log_std)
        if explore:
            noise = self._rng.standard_normal(out.shape).astype(np.float32)
            actions = out + std * noise
        else:
            noise = np.zeros_like(out)
            actions = out
        if self._scale is not None:
            # Normalised units to the space's: the density stays that of the normalised value.
            actions = actions * self._scale + self._bias
        logp = -0.5 * (noise**2).sum(axis=1) - self._log_std.sum() - 0.5 * LOG_2PI * out.shape[1]
        return PolicyOutput(actions.astype(np.float32), logp.astype(np.float32))

    def _legal_only(
        self,
        obs: np.ndarray,
        masked: np.ndarray,
        result: PolicyOutput,
        state: np.ndarray | None = None,
    ) -> PolicyOutput:
        """``result`` with any choice of probability 0 replaced by its part's mode.

        A sampler rounding at the edge of its last interval (``u * total == total``, about one
        draw in 2**53) could land on an illegal choice: never sent.
        """
        assert self._mask is not None
        allowed = legal(obs, self._mask)
        actions = result.actions
        columns = actions[:, None] if actions.ndim == 1 else actions
        rows = self._row_index(obs.shape[0])
        begin = 0
        replaced = False
        for column, size in enumerate(self._mask_sizes):
            block = allowed[:, begin : begin + size]
            chosen = columns[:, column].astype(np.int64)
            bad = ~block[rows, chosen]
            if bad.any():
                mode = masked[:, begin : begin + size].argmax(axis=1)
                columns[bad, column] = mode[bad]
                replaced = True
            begin += size
        if replaced:
            result.logp = self.log_prob(obs, result.actions, state)
        return result

    def _masked(self, obs: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` with the outputs of choices illegal at ``obs`` masked (in place)."""
        assert self._mask is not None
        allowed = legal(obs, self._mask)
        require_legal(allowed, self._mask_sizes)
        return mask_logits(out, allowed)

    def _sample_two(self, out: np.ndarray) -> PolicyOutput:
        """Sample one of two choices per row of logits ``out`` (changed in place).

        The general path's arithmetic, the same values in the same order (so the same bits),
        on the two columns: fewer numpy calls, no reduction over an axis and no fancy indexing.
        """
        top = _maximum(out[:, 0], out[:, 1])
        shifted = _subtract(out, top[:, None], out=out)
        weights = _exp(shifted)
        kept = weights[:, 0]
        total = _add(kept, weights[:, 1])
        u = self._rng.random(out.shape[0])
        u *= total
        second = _less(kept, u)
        logp = _where(second, shifted[:, 1], shifted[:, 0])
        _subtract(logp, _log(total), out=logp)
        return PolicyOutput(second.astype(np.int64), logp)

    def _epsilon_greedy(self, values: np.ndarray, explore: bool) -> PolicyOutput:
        """The best choice by ``values`` or, exploring, a random one with probability epsilon."""
        epsilon = self.spec.epsilon
        if values.shape[0] == 1 and values.shape[1] <= _SMALL_CHOICE:
            # One decision (a local client's common case): plain floats, as _sample_one.
            action, logp = epsilon_greedy_one(values[0].tolist(), epsilon, self._rng, explore)
            return PolicyOutput(
                np.array([action], dtype=np.int64), np.array([logp], dtype=np.float32)
            )
        actions = epsilon_greedy_choices(values, epsilon, self._rng, explore)
        return PolicyOutput(actions, epsilon_greedy_log_prob(values, epsilon, actions))

    def _row_index(self, rows: int) -> np.ndarray:
        """``np.arange(rows)``, made once per (small) batch size."""
        index = self._rows.get(rows)
        if index is None:
            index = np.arange(rows)
            if rows <= _TILED_ROWS:  # the sizes a runner or a client uses again and again
                self._rows[rows] = index
        return index

    def _sample_one(self, logits: list[float], explore: bool) -> PolicyOutput:
        # One decision among few choices (a local client's common case): plain floats are
        # several times faster than a dozen numpy calls on 1-element arrays.
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        total = sum(weights)
        if explore:
            threshold = self._rng.random() * total
            action, running = len(weights) - 1, 0.0
            for i, w in enumerate(weights):
                running += w
                if running > threshold:
                    action = i
                    break
        else:
            action = logits.index(top)
        logp = logits[action] - top - math.log(total)
        return PolicyOutput(np.array([action], dtype=np.int64), np.array([logp], dtype=np.float32))

    def log_prob(
        self, obs: np.ndarray, actions: np.ndarray, state: np.ndarray | None = None
    ) -> np.ndarray:
        """Log-probability of given actions under this policy, ``[N]`` float32.

        With a legal-move mask, under the masked distribution (an illegal action's is about
        :data:`~rlserve.policy.action_mask.MASKED_LOGIT`, or ``-inf`` for epsilon-greedy). With
        memory, ``state`` is each row's recurrent state before its observation, as for
        :meth:`compute_actions` (required); ignored without memory.

        Raises:
            SpaceError: With memory, ``state`` is missing or of the wrong shape.
        """
        memory = self._memory is not None
        out = self.recurrent_forward(obs, state)[0] if memory else self.forward(obs)
        if self._mask is not None:
            out = self._masked(obs, out)
        if self.spec.distribution == "epsilon_greedy":
            masked = self._mask is not None
            return epsilon_greedy_log_prob(out, self.spec.epsilon, actions, masked)
        if self.spec.distribution == "categorical":
            shifted = out - out.max(axis=1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            return log_probs[np.arange(obs.shape[0]), actions.astype(np.int64)].astype(np.float32)
        if self.spec.distribution != "gaussian":
            return self.distribution.log_prob(out, self._log_std, actions)
        assert self._log_std is not None
        values = actions.reshape(out.shape)
        if self._scale is not None:
            values = (values - self._bias) / self._scale
        z = (values - out) / np.exp(self._log_std)
        logp = -0.5 * (z**2).sum(axis=1) - self._log_std.sum() - 0.5 * LOG_2PI * out.shape[1]
        return logp.astype(np.float32)

    def to_env_actions(self, actions: np.ndarray) -> np.ndarray:
        """Flat actions as the environment takes them: offset by ``start``, Box values clipped.

        Categorical and epsilon-greedy: ``[N]`` int64; Gaussian: ``[N, A]`` float32; other
        distributions: ``[N, A]`` float64 (see
        :func:`rlserve.policy.action_layout.actions_to_space` for the space's own form).
        """
        if self.spec.distribution in ("categorical", "epsilon_greedy"):
            return actions + self.spec.action_start if self.spec.action_start else actions
        if self.spec.distribution != "gaussian":
            return self.distribution.to_env(actions)
        if self._low.size:
            return np.clip(actions, self._low, self._high)
        return actions
