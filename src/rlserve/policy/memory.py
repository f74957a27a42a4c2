"""Memory (``use_lstm``): the LSTM a recurrent policy's actor reads, and its numpy step.

A policy with memory carries a recurrent state per episode (and per agent): ``[2N]`` float32,
``concat(h, c)``, zeros at the start of every episode. Each step reads the encoded observation
``x`` (``[F]``: the observation as the first layer would read it without memory, i.e. the image
encoder's output or the flattened observation less its mask, normalised when the policy
normalises) and the state, and gives the next state; the actor's linear layers read its ``h``::

    gates = x @ W_ih.T + h @ W_hh.T + b        W_ih [4N, F], W_hh [4N, N], b [4N]
    i, f, g, o = split(gates, 4)               (PyTorch's gate order)
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h' = sigmoid(o) * tanh(c')

The arrays are ``memory.weight_ih``, ``memory.weight_hh`` and ``memory.bias`` (torch's
``bias_ih_l0 + bias_hh_l0``). The LSTM reads observations only (no previous action or reward),
so an episode's states are a function of its observations alone. The description travels in the
model spec (``docs/protocol.md``, section 7.9, ``memory``). Needs numpy only: the client uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.errors import ConfigError, SpaceError
from rlserve.policy.matmul import serial_matmul

MAX_CELL_SIZE = 4096
"""The largest ``cell_size`` a model spec may name (a 4096-cell LSTM already holds 64 M
weights in ``weight_hh``); a larger one on the wire is refused before any array is made."""

MEMORY_KINDS = ("lstm",)
"""The recurrent layers a model spec may name."""

PPO_ONLY = {
    name: "only PPO trains recurrent (LSTM) policies; use PPO for memory ([ppo] use_lstm = true, "
    "--ppo-use-lstm, or PPOConfig().training(use_lstm=True)), or drop it"
    for name in ("use_lstm", "max_seq_len", "lstm_cell_size")
}
"""The memory settings an algorithm without memory refuses, each with the fix (its settings'
``REFUSED_OPTIONS``, :func:`rlserve.config.fields.check_table`)."""

WEIGHT_IH, WEIGHT_HH, BIAS = "memory.weight_ih", "memory.weight_hh", "memory.bias"
"""The names of the LSTM's arrays among a policy's weights."""


@dataclass(frozen=True, slots=True)
class LSTMMemory:
    """A one-layer LSTM between the observation's encoding and the actor's linear layers.

    Attributes:
        cell_size: ``N``, the width of ``h`` and of ``c``; the recurrent state is ``2N`` wide.
        input_dim: ``F``, the width of what the LSTM reads: the image encoder's output, or the
            flattened observation less its mask (implied by the rest of the spec; not on the
            wire).

    Raises:
        ConfigError: A size that is not a whole number in ``[1, MAX_CELL_SIZE]`` (cell) or
            positive (input).
    """

    cell_size: int
    input_dim: int

    def __post_init__(self) -> None:
        size = self.cell_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_CELL_SIZE:
            raise ConfigError(
                f"model spec: memory cell_size must be a whole number from 1 to "
                f"{MAX_CELL_SIZE}, got {size!r}; use a smaller lstm_cell_size"
            )
        if isinstance(self.input_dim, bool) or not isinstance(self.input_dim, int):
            raise ConfigError("model spec: memory input_dim must be a whole number")
        if self.input_dim < 1:
            raise ConfigError(
                f"model spec: the LSTM reads {self.input_dim} values; it needs at least one"
            )

    @property
    def state_size(self) -> int:
        """``2 * cell_size``: the width of the recurrent state ``concat(h, c)``."""
        return 2 * self.cell_size

    def array_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of each of the LSTM's arrays, by name."""
        n, f = self.cell_size, self.input_dim
        return {WEIGHT_IH: (4 * n, f), WEIGHT_HH: (4 * n, n), BIAS: (4 * n,)}

    def to_wire(self) -> dict[str, Any]:
        """The wire form, ``{"kind": "lstm", "cell_size": N}`` (``input_dim`` is implied)."""
        return {"kind": "lstm", "cell_size": self.cell_size}

    @classmethod
    def from_wire(cls, raw: Any, input_dim: int) -> LSTMMemory:
        """Rebuild the description from :meth:`to_wire` output and the implied ``input_dim``.

        Raises:
            ConfigError: Not a map, an unknown ``kind`` or a bad ``cell_size``.
        """
        if not isinstance(raw, dict):
            raise ConfigError(
                f"model spec: memory must be a map of kind and cell_size, got {raw!r}"
            )
        kind = raw.get("kind")
        if kind not in MEMORY_KINDS:
            raise ConfigError(
                f"model spec: unknown memory kind {kind!r}; known: {', '.join(MEMORY_KINDS)}"
            )
        return cls(raw.get("cell_size"), input_dim)  # type: ignore[arg-type]


class LSTMForward:
    """An :class:`LSTMMemory` with its arrays, ready to step.

    Args:
        memory: The description.
        weights: Named float32 arrays, among them ``memory.weight_ih``, ``memory.weight_hh``
            and ``memory.bias``.

    Raises:
        ConfigError: An array is missing, has the wrong shape or is not finite.
    """

    def __init__(self, memory: LSTMMemory, weights: dict[str, np.ndarray]):
        self.memory = memory
        arrays = {}
        for name, shape in memory.array_shapes().items():
            if name not in weights:
                raise ConfigError(
                    f"weights are missing '{name}' for the memory (an LSTM of "
                    f"{memory.cell_size} cells); publish it with the model"
                )
            array = np.asarray(weights[name], dtype=np.float32)
            if array.shape != shape:
                raise ConfigError(
                    f"memory array '{name}' has shape {list(array.shape)}; expected {list(shape)}"
                )
            if not np.isfinite(array).all():
                raise ConfigError(f"memory array '{name}' holds a value that is not finite")
            arrays[name] = array
        # sigmoid(z) = (tanh(z / 2) + 1) / 2: the rows of the gates i, f and o are halved once
        # here (exact in float32), so one tanh over all gates serves the four of them.
        n = memory.cell_size
        half = np.ones(4 * n, dtype=np.float32)
        half[: 2 * n] = 0.5
        half[3 * n :] = 0.5
        self._w_ih = np.ascontiguousarray((arrays[WEIGHT_IH] * half[:, None]).T)
        self._w_hh = np.ascontiguousarray((arrays[WEIGHT_HH] * half[:, None]).T)
        self._bias = arrays[BIAS] * half

    def __call__(self, x: np.ndarray, state: np.ndarray) -> np.ndarray:
        """One step: ``[B, F]`` inputs and ``[B, 2N]`` states -> the ``[B, 2N]`` next states.

        ``state`` is left as it is (the caller may hold it as a fragment's ``state_in``); the
        result is a new float32 array whose first ``N`` columns are ``h'``.
        """
        n = self.memory.cell_size
        gates = serial_matmul(x, self._w_ih)
        gates += serial_matmul(state[:, :n], self._w_hh)
        gates += self._bias
        np.tanh(gates, out=gates)
        sig_if = gates[:, : 2 * n]
        sig_if += 1.0
        sig_if *= 0.5
        sig_o = gates[:, 3 * n :]
        sig_o += 1.0
        sig_o *= 0.5
        result = np.empty((gates.shape[0], 2 * n), dtype=np.float32)
        h, c = result[:, :n], result[:, n:]
        np.multiply(gates[:, n : 2 * n], state[:, n:], out=c)
        c += gates[:, :n] * gates[:, 2 * n : 3 * n]
        np.tanh(c, out=h)
        h *= sig_o
        return result


def check_state(state: Any, rows: int, state_size: int) -> np.ndarray:
    """``state`` as the ``[rows, state_size]`` float32 array a policy with memory steps from.

    Raises:
        SpaceError: None, or another shape, naming the fix.
    """
    if state is None:
        raise SpaceError(
            f"this policy has memory: pass state=, [{rows}, {state_size}] float32 (zeros at an "
            "episode's start: policy.initial_state(rows); then each output's state)"
        )
    array = np.asarray(state, dtype=np.float32)
    if array.shape != (rows, state_size):
        raise SpaceError(
            f"recurrent state has shape {list(array.shape)}; expected [{rows}, {state_size}] "
            "(one row per observation: policy.initial_state(rows) at an episode's start)"
        )
    return array
