"""What PPO, DQN and SAC share, so that no learner imports another.

The device a learner trains on (:func:`resolve_device`), its rate-limited warning
(:class:`RateLimitedWarning`), the checks of a fragment as received (each learner checks its own
fields with these: arrays, shapes, dtypes, choice indices, magnitudes; DQN and SAC the same
fields, :func:`check_replay_fragment`), the guarded optimiser step that skips a non-finite loss
or gradient (:func:`finite_step`), and the checkpoint file (:func:`write_checkpoint`,
:func:`read_checkpoint`: ``torch.load(weights_only=True)``, so loading one runs no code).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlserve.learners.replay import checked_chosen, storage_dtype
from rlserve.learners.setting_checks import check_device_present
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.values import indices_within, within
from rlserve.run.durable import atomic_write_bytes

logger = logging.getLogger("rlserve.learner")

WARN_INTERVAL_S = 60.0

_FLOAT32 = np.dtype(np.float32)


def resolve_device(name: str) -> torch.device:
    """Map ``auto`` to cuda when available, else cpu.

    Raises:
        ConfigError: ``name`` is a cuda device this machine's torch cannot use.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device_present(name)
    return torch.device(name)


class RateLimitedWarning:
    """Counts problems by kind and logs them at most once per interval, with their counts.

    :meth:`add` only counts; :meth:`flush` logs what was counted when the interval since the
    last line has passed (the first line goes out at once), so a flood of bad minibatches or
    fragments gives one line per interval rather than one per event.

    Args:
        what: The start of each line (what the counts are about).
        interval: Seconds between two lines.
        clock: Monotonic time source (tests pass their own).
    """

    def __init__(
        self,
        what: str,
        interval: float = WARN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.interval = interval
        self.clock = clock
        self._counts: Counter[str] = Counter()
        self._examples: dict[str, str] = {}
        self._last = -math.inf

    def add(self, kind: str, count: int = 1, example: str = "") -> None:
        """Count ``count`` problems of ``kind``; ``example`` describes the first one."""
        self._counts[kind] += count
        self._examples.setdefault(kind, example)

    def flush(self) -> None:
        """Log the counts gathered so far if the interval since the last line has passed."""
        if not self._counts:
            return
        now = self.clock()
        if now - self._last < self.interval:
            return
        self._last = now
        parts = []
        for kind, count in self._counts.items():
            example = self._examples.get(kind)
            parts.append(f"{count} {kind}" + (f" (e.g. {example})" if example else ""))
        logger.warning("%s: %s", self.what, "; ".join(parts))
        self._counts.clear()
        self._examples.clear()


def learner_warning() -> RateLimitedWarning:
    """The warning every learner logs its left-out experience and skipped steps with."""
    return RateLimitedWarning(
        "rlserve learner: experience or updates left out to keep the weights finite"
    )


# -- fragment checks --------------------------------------------------------------------------


def fragment_arrays(
    fragment: Fragment, names: Iterable[str]
) -> tuple[dict[str, np.ndarray] | None, str]:
    """The fragment's fields ``names`` as arrays (``rewards`` a non-empty ``[T]``), or why not."""
    try:
        arrays = {name: np.asarray(getattr(fragment, name)) for name in names}
    except (ValueError, TypeError) as exc:
        return None, f"a field is not an array ({exc})"
    rewards = arrays["rewards"]
    if rewards.ndim != 1 or rewards.shape[0] == 0:
        return None, f"rewards has shape {rewards.shape}, expected a non-empty [T]"
    return arrays, ""


def shape_problem(arrays: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]]) -> str:
    """Why the first of ``expected``'s arrays whose shape differs is wrong; "" when none."""
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            return f"{name} has shape {arrays[name].shape}, expected {shape}"
    return ""


def dtype_problem(arrays: Mapping[str, np.ndarray], integers: Container[str] = ()) -> str:
    """Why the first array that is not numbers (bool, int, float) is wrong; "" when none.

    The arrays named in ``integers`` must be integers.
    """
    for name, array in arrays.items():
        if array.dtype.kind not in ("iu" if name in integers else "biuf"):
            return f"{name} has dtype {array.dtype}"
    return ""


def as_float32(array: np.ndarray) -> np.ndarray:
    """``array`` itself when float32, else a float32 copy (an overflow to inf is caught later)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return array.astype(np.float32, copy=False)


def choice_indices(actions: np.ndarray, choices: int) -> tuple[np.ndarray | None, str]:
    """``[T]`` Discrete actions as int64 indices ``0..choices-1``, or None and why not."""
    if actions.dtype.kind == "f":
        whole = np.isfinite(actions) & (actions == np.round(actions))
        if not whole.all():
            return None, f"actions holds {actions[~whole][0]}, not a choice index"
    indices = actions.astype(np.int64, copy=False)
    if not indices_within(indices, choices - 1):
        outside = (indices < 0) | (indices >= choices)
        return None, f"actions holds {indices[outside][0]}, outside the choices 0..{choices - 1}"
    return indices, ""


def magnitude_problem(arrays: Mapping[str, np.ndarray], limit: float, algorithm: str) -> str:
    """Why the first float array with a non-finite value or one beyond ``limit`` is wrong.

    "" when every value is finite and within ``limit``; the message names the option that
    raises it (``--<algorithm>-max-abs-input``).
    """
    for name, array in arrays.items():
        if within(array, limit):
            continue
        finite = np.isfinite(array)
        if not finite.all():
            return f"{name} holds {array[~finite][0]}"
        large = np.abs(array) > limit
        return (
            f"{name} holds {array[large][0]:.3g}, beyond max_abs_input {limit:.3g} "
            f"(raise --{algorithm}-max-abs-input if such values are real)"
        )
    return ""


def replay_obs_dtype(observation_space: gym.Space[Any]) -> np.dtype[Any]:
    """The dtype an off-policy learner's replay buffer stores this space's observations in.

    uint8 for a space of whole numbers within [0, 255] (images, masks, one-hot choices), float32
    otherwise (:func:`~rlserve.learners.replay.storage_dtype`).
    """
    flat = gym.spaces.flatten_space(observation_space)
    if not isinstance(flat, gym.spaces.Box):
        return np.dtype(np.float32)
    return storage_dtype(flat.low, flat.high, flat.dtype)


def check_replay_fragment(
    fragment: Fragment,
    obs_dim: int,
    limit: float,
    algorithm: str,
    *,
    choices: int | None = None,
    action_dim: int | None = None,
    obs_dtype: np.dtype[Any] = _FLOAT32,
) -> tuple[Fragment | None, str]:
    """An off-policy learner's fragment in the dtypes it stores, or ``None`` and why not.

    Shapes must be ``[T + 1, obs_dim]`` observations, ``[T]`` rewards and ``policy_chosen``
    (which becomes bool: non-zero is chosen) with ``T >= 1``, and ``[T]`` choice indices
    (``choices``: Discrete, int64) or ``[T, action_dim]`` values (a Box, float32, checked as
    observations and rewards are); observations and rewards float32, finite and within
    ``limit``.

    Args:
        fragment: The fragment as received.
        obs_dim: The observation width.
        limit: ``max_abs_input``.
        algorithm: The algorithm's name, for the option the message names.
        choices: The number of Discrete actions (one of ``choices`` and ``action_dim``).
        action_dim: The Box's width.
        obs_dtype: The replay buffer's observation dtype: with uint8 (a space of whole numbers
            within [0, 255], :func:`~rlserve.learners.replay.storage_dtype`) an observation
            value outside them is refused, as the buffer could not hold it.
    """
    arrays, problem = fragment_arrays(fragment, ("obs", "actions", "rewards"))
    if arrays is None:
        return None, problem
    steps = arrays["rewards"].shape[0]
    action_shape = (steps,) if action_dim is None else (steps, action_dim)
    problem = shape_problem(arrays, {"obs": (steps + 1, obs_dim), "actions": action_shape})
    if problem:
        return None, problem
    chosen, problem = checked_chosen(fragment.policy_chosen, steps)
    if chosen is None:
        return None, problem
    problem = dtype_problem(arrays)
    if problem:
        return None, problem
    actions: np.ndarray | None = None
    if choices is not None:
        actions, problem = choice_indices(arrays["actions"], choices)
        if actions is None:
            return None, problem
    checked = {"obs": as_float32(arrays["obs"])}
    if actions is None:
        actions = checked["actions"] = as_float32(arrays["actions"])
    checked["rewards"] = as_float32(arrays["rewards"])
    problem = magnitude_problem(checked, limit, algorithm)
    if problem:
        return None, problem
    obs, rewards = checked["obs"], checked["rewards"]
    if obs_dtype == np.uint8 and not _whole_bytes(obs):
        return None, (
            f"{algorithm} fragment has observation values that are not whole numbers within "
            "[0, 255], though the observation space declares only those; send the space's own "
            "values (uint8 pixels, 0/1 masks), or declare a float Box"
        )
    if (
        obs is fragment.obs
        and actions is fragment.actions
        and rewards is fragment.rewards
        and chosen is fragment.policy_chosen
    ):
        return fragment, ""  # already in the stored dtypes (the usual case)
    replaced = dataclasses.replace(
        fragment, obs=obs, actions=actions, rewards=rewards, policy_chosen=chosen
    )
    return replaced, ""


def _whole_bytes(values: np.ndarray) -> bool:
    return bool(
        values.size == 0
        or (values.min() >= 0 and values.max() <= 255 and np.array_equal(values, np.floor(values)))
    )


# -- gradient steps and checkpoints -----------------------------------------------------------

# Devices whose fused Adam kernel this torch has (one kernel for every parameter: a small
# network's step on a CPU is otherwise mostly Python around per-parameter operations).
_FUSED_ADAM_DEVICES = ("cpu", "cuda")


def yield_cpu() -> None:
    """Give the rest of this scheduler slice to a process waiting for the CPU (between steps).

    Called between gradient steps: on a machine the learner shares with the serving process, a
    reply then waits at most one gradient step for a core, not a whole slice of the learner (the
    p99 of ``get_action`` with 8 clients training fell from 3.0-3.7 ms to 1.7-2.5). It costs a
    system call (about a µs) and returns at once when nothing waits; a no-op where the OS has no
    ``sched_yield``.
    """
    if _SCHED_YIELD is not None:
        _SCHED_YIELD()


_SCHED_YIELD = getattr(os, "sched_yield", None)


def adam(parameters: list[nn.Parameter], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam over ``parameters``, with the fused kernel where the device has one.

    The fused step is Adam's arithmetic in one kernel: its results match the per-parameter
    step's to float32 rounding, not bit for bit.
    """
    return torch.optim.Adam(parameters, lr=lr, eps=eps, **_adam_kernel(parameters))


def _adam_kernel(parameters: list[nn.Parameter]) -> dict[str, Any]:
    devices = {p.device.type for p in parameters}
    fused = bool(devices) and devices <= set(_FUSED_ADAM_DEVICES)
    return {"fused": True} if fused else {"foreach": None}


class DeferredAdam:
    """:func:`adam` over ``parameters``, built when first used rather than with the learner.

    torch imports ``torch._dynamo`` to build any optimiser: about as much CPU as importing torch
    itself (1-1.5 s). A learner that never trains (a frozen policy; a server whose clients have
    not sent a training batch yet) never pays it, and every learner publishes its first weights
    that much sooner. A checkpoint of an optimiser never built stores None for its state.
    """

    def __init__(self, parameters: list[nn.Parameter], lr: float, eps: float = 1e-8) -> None:
        self._parameters = parameters
        self._lr = lr
        self._eps = eps
        self._optimizer: torch.optim.Adam | None = None

    @property
    def optimizer(self) -> torch.optim.Adam:
        """The optimiser, built now if it was not yet."""
        if self._optimizer is None:
            self._optimizer = adam(self._parameters, self._lr, self._eps)
        return self._optimizer

    def state_dict(self) -> dict[str, Any] | None:
        """The optimiser's state for a checkpoint; None if it was never built (no step yet)."""
        return None if self._optimizer is None else self._optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore a checkpoint's state (:meth:`state_dict`); None: as never built."""
        if state is None:
            self._optimizer = None
        else:
            load_optimizer(self.optimizer, state)


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore ``optimizer`` from a checkpoint's state and keep the kernel it was built with.

    A checkpoint's parameter groups carry the kernel choice of the learner that wrote it (an
    older rlserve's: none); loading would otherwise switch to it.
    """
    kernels = [{k: group.get(k) for k in ("fused", "foreach")} for group in optimizer.param_groups]
    groups = state["param_groups"]
    if len(groups) == len(kernels):
        # The kernel goes in before loading: it decides where Adam's step counts are put.
        groups = [{**group, **kernel} for group, kernel in zip(groups, kernels, strict=True)]
    optimizer.load_state_dict({**state, "param_groups": groups})


def finite_step(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    parameters: Sequence[nn.Parameter],
    max_grad_norm: float,
) -> bool:
    """Step ``optimizer`` on ``loss`` with its gradient norm clipped, unless either is not finite.

    ``parameters`` are the optimiser's, in a list (a module's ``parameters()`` would walk its
    submodules at every step).

    Returns:
        Whether the step was taken; when not, the parameters and the optimiser state are as
        they were and no gradient is left behind.
    """
    _drop_gradients(parameters)
    if not torch.isfinite(loss):
        return False
    loss.backward()
    if not clip_gradients(parameters, max_grad_norm):
        _drop_gradients(parameters)
        return False
    optimizer.step()
    return True


def clip_gradients(parameters: Sequence[nn.Parameter], max_norm: float) -> bool:
    """Scale the gradients to a global norm of at most ``max_norm``; False if it is not finite.

    ``torch.nn.utils.clip_grad_norm_``'s arithmetic (the norm of the per-tensor norms, scaled by
    ``min(1, max_norm / (norm + 1e-6))``) without its per-call Python; a non-finite norm leaves
    the gradients unscaled, for the caller to drop.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return True
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if not torch.isfinite(total):
        return False
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return True


def _drop_gradients(parameters: Sequence[nn.Parameter]) -> None:
    # What optimizer.zero_grad(set_to_none=True) does, without its profiler and hook calls.
    for parameter in parameters:
        parameter.grad = None


def write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors, numbers, strings, lists and dicts) atomically to ``path``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def read_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """Read a :func:`write_checkpoint` file onto ``device``; it holds data only, never code."""
    state: dict[str, Any] = torch.load(path, map_location=device, weights_only=True)
    return state


def read_weights(
    path: Path, device: torch.device, load: Callable[[Any], Any], what: str
) -> dict[str, Any]:
    """Read a checkpoint and ``load`` its ``model`` entry into the learner's networks.

    Returns:
        The whole checkpoint, for what else the caller takes from it.

    Raises:
        ValueError: It holds no model that fits: ``"{path} holds no {what}: {error}"``.
    """
    state = read_checkpoint(path, device)
    try:
        load(state["model"])
    except (KeyError, TypeError, RuntimeError) as exc:
        raise ValueError(f"{path} holds no {what}: {exc}") from exc
    return state
