"""Machine-readable test vectors for docs/protocol-vectors/ (format: that folder's README.md).

``messages.json`` holds messages that travelled in the session of scripts/protocol_examples.py
plus one array of every dtype code; ``forward-pass.json`` holds tiny policies of every
distribution kind a learner ships (``categorical``, ``gaussian``, ``epsilon_greedy``,
``squashed_gaussian``) computed by :class:`rlserve.policy.NumpyPolicy`. :func:`to_tagged` and
:func:`from_tagged` convert between decoded values and the vectors' JSON form;
tests/docs/test_protocol_vectors.py uses them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import numpy as np

from rlserve.policy.model_spec import ModelSpec
from rlserve.policy.numpy_policy import NumpyPolicy
from rlserve.protocol.codec import DTYPE_CODES, decode, encode, to_jsonable

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "docs" / "protocol-vectors"
FORMAT = 1
"""Version of the vector files' layout."""
UNIFORM = 0.5
"""The uniform draw the categorical vector samples its choice with (section 14.4)."""
EPSILON = 0.25
"""The ``epsilon`` of the epsilon-greedy vector's model."""
EXPLORE_DRAWS = ((0.5, 2), (0.125, 1), (0.125, 0))
"""The epsilon-greedy vector's exploring steps: (uniform draw, uniform choice) each. The first
draw is not below ``EPSILON`` (the greedy choice is taken, the uniform choice drawn but unused);
the others are (the uniform choice is taken: another choice, then the greedy one)."""
SQUASHED_NOISE = (0.5, -0.75)
"""The standard normal draws ``e`` of the squashed-Gaussian vector's sample."""
RTOL = 1e-5
ATOL = 1e-6
"""The tolerance of every real number ``forward-pass.json`` gives as a result: an implementation
passes where ``|got - want| <= ATOL + RTOL * |want|`` (section 14.4; integers match exactly).

The float32 results move in their last digits with the CPU, the BLAS kernel, the maths library
and the summation order, and a double-precision implementation differs by as much. Measured on
these vectors against the committed numbers: float32 under other OpenBLAS kernels (AVX-512, Sandy
Bridge, SSE3) and numpy without its AVX2 loops (another ``tanh``) differs by at most 4.8e-7
absolute and 2.2e-6 relative (a value of 0.04 moved by 9e-8); float64 by at most 8.2e-7 (2.5e-7
relative); float32 with each sum reversed, pairwise or fused (FMA) by at most 1.9e-6 (1.1e-6
relative). The worst of these used 6.4% of this tolerance, hence ``ATOL``: ``RTOL`` alone is too
tight for values near 0. It still catches mistakes: the squashed Gaussian's log-density computed
in float32 instead of double precision is off by 1.3e-4, about five times the tolerance (a
looser ``RTOL`` of 1e-4 would let it pass)."""
TOLERANCE = {"rtol": RTOL, "atol": ATOL}
"""The ``tolerance`` field of ``forward-pass.json``."""


def close(got: Any, want: Any, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Whether every number of ``got`` is within ``atol + rtol * |want|`` of ``want``'s.

    Both may be numbers or (nested) sequences of the same shape; NaNs must match NaNs.
    """
    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return a.shape == b.shape and bool(
        np.all((np.abs(a - b) <= atol + rtol * np.abs(b)) | (np.isnan(a) & np.isnan(b)) | (a == b))
    )


def _number(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def to_tagged(value: Any) -> Any:
    """A decoded value as plain JSON: arrays and non-finite floats tagged (README.md)."""
    if isinstance(value, np.ndarray):
        data = value.reshape(-1).tolist()
        if value.dtype.kind == "f":
            data = [_number(v) for v in data]
        return {"$ndarray": {"dtype": str(value.dtype), "shape": list(value.shape), "data": data}}
    if isinstance(value, dict):
        return {k: to_tagged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_tagged(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": _number(value)}
    return value


def from_tagged(value: Any) -> Any:
    """The inverse of :func:`to_tagged`."""
    if isinstance(value, dict):
        if set(value) == {"$ndarray"}:
            spec = value["$ndarray"]
            data = [float(v) if isinstance(v, str) else v for v in spec["data"]]
            return np.array(data, dtype=spec["dtype"]).reshape(spec["shape"])
        if set(value) == {"$float"}:
            return float(value["$float"])
        return {k: from_tagged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_tagged(v) for v in value]
    return value


def json_text(value: Any) -> str:
    """The HTTP carrier's JSON for ``value`` (NaN as the bare token, as section 14.8 allows)."""
    return json.dumps(to_jsonable(value), separators=(",", ":"), ensure_ascii=False)


def vector(name: str, description: str, value: dict[str, Any], body: bytes) -> dict[str, Any]:
    """One message vector."""
    return {
        "name": name,
        "description": description,
        "msgpack": body.hex(),
        "json": json_text(value),
        "value": to_tagged(value),
    }


_WANTED = {
    # (direction, type, form) -> (name, description); form tells batched and special cases apart
    ("request", "hello", ""): ("hello", "hello request (section 7.1)"),
    ("reply", "welcome", ""): ("welcome", "welcome reply for CartPole-v1 (section 7.1)"),
    ("request", "start_episode", ""): ("start_episode", "start_episode with an id (7.2)"),
    ("reply", "episode_started", ""): ("episode_started", "episode_started (7.2)"),
    ("request", "get_action", ""): ("get_action", "get_action, single form, first step (7.3)"),
    ("request", "get_action", "reward"): ("get_action_reward", "get_action with a reward (7.3)"),
    ("reply", "action", ""): ("action", "action reply, single form (7.3)"),
    ("request", "get_action", "batched"): ("get_action_batched", "get_action, batched (7.3)"),
    ("reply", "action", "batched"): ("action_batched", "action reply, batched: int64 (7.3)"),
    ("request", "log_action", ""): ("log_action", "log_action (7.4)"),
    ("request", "log_returns", ""): ("log_returns", "log_returns (7.5)"),
    ("reply", "ok", ""): ("ok", "ok reply (7.4-7.6)"),
    ("request", "end_episode", ""): ("end_episode", "end_episode (7.6)"),
    ("request", "ping", ""): ("ping", "ping (7.7)"),
    ("reply", "pong", ""): ("pong", "pong (7.7)"),
    ("reply", "error", ""): ("error", "error reply (7.8)"),
    ("reply", "error", "null-id"): ("error_null_id", "error reply with id null (7.8)"),
    ("request", "get_weights", ""): ("get_weights", "get_weights (7.9)"),
    ("reply", "weights", ""): ("weights", "weights reply, full (7.9)"),
    ("request", "get_weights", "have"): ("get_weights_have", "get_weights with have_version (7.9)"),
    ("reply", "weights", "unchanged"): ("weights_unchanged", "weights reply, unchanged (7.9)"),
    ("request", "report_samples", ""): ("report_samples", "report_samples batch (7.10)"),
    ("reply", "samples_accepted", ""): ("samples_accepted", "samples_accepted (7.10)"),
    ("reply", "samples_accepted", "duplicate"): (
        "samples_accepted_duplicate",
        "samples_accepted for a re-sent batch (7.10)",
    ),
    ("reply", "welcome", "mapping"): (
        "welcome_mapping",
        "welcome of a server with two policies and an agent mapping (15.2, 15.8)",
    ),
    ("request", "get_action", "agents"): (
        "get_action_agents",
        "get_action, multi-agent form (7.3, 15)",
    ),
    ("reply", "action", "agents"): (
        "action_agents",
        "action reply to a multi-agent get_action, agents of one policy: int64 (7.3, 15)",
    ),
    ("reply", "action", "agents-list"): (
        "action_agents_mixed",
        "action reply to a multi-agent get_action, agents of two policies: a list (7.3, 15.8)",
    ),
    ("request", "log_action", "agents"): ("log_action_agents", "log_action, multi-agent (7.4)"),
    ("request", "log_returns", "agents"): (
        "log_returns_agents",
        "log_returns, multi-agent, with an agent terminated (7.5, 15)",
    ),
    ("request", "end_episode", "agents"): ("end_episode_agents", "end_episode, multi-agent (7.6)"),
    ("request", "hello", "map-agents"): (
        "hello_map_agents",
        "hello of a local-inference client that asks map_agents (7.1, 7.12)",
    ),
    ("reply", "welcome", "map-agents"): (
        "welcome_map_agents",
        "welcome of a server that maps agents with a function (7.1, 7.12)",
    ),
    ("request", "map_agents", ""): ("map_agents", "map_agents (7.12)"),
    ("reply", "agents_mapped", ""): ("agents_mapped", "agents_mapped reply (7.12)"),
}


def _form(direction: str, message: dict[str, Any], request: dict[str, Any] | None) -> str:
    if message.get("map_agents") is True:
        return "map-agents"
    if direction == "request":
        if "agent_ids" in message and message.get("type") != "map_agents":
            return "agents"
        if "episode_ids" in message:
            return "batched"
        if message.get("type") == "get_action" and "reward" in message:
            return "reward"
        if "have_version" in message:
            return "have"
        return ""
    if "actions" in message and request is not None and "agent_ids" in request:
        return "agents" if isinstance(message["actions"], np.ndarray) else "agents-list"
    if "actions" in message:
        return "batched"
    if message.get("mapping"):
        return "mapping"
    if message.get("unchanged"):
        return "unchanged"
    if message.get("duplicate"):
        return "duplicate"
    if message.get("type") == "error" and message.get("id") is None:
        return "null-id"
    return ""


def message_vectors(frames: list[Any]) -> list[dict[str, Any]]:
    """The first message of every wanted kind among the recorded exchanges, in _WANTED order."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for ex in frames:
        for direction, message, frame in (
            ("request", ex.request, ex.request_frame),
            ("reply", ex.reply, ex.reply_frame),
        ):
            if message is None or frame[4:] != encode(message):
                continue  # a deliberately malformed request, or a normalised reply
            key = (direction, str(message.get("type")), _form(direction, message, ex.request))
            if key in _WANTED and key not in found:
                name, description = _WANTED[key]
                found[key] = vector(name, description, message, frame[4:])
    missing = [_WANTED[k][0] for k in _WANTED if k not in found]
    if missing:
        raise RuntimeError(f"the session produced no vector for {missing}")
    return [found[k] for k in _WANTED]


def array_vectors() -> list[dict[str, Any]]:
    """One map ``{"array": ...}`` per dtype code, plus a 0-dimensional and an empty array."""
    samples: dict[str, list[Any]] = {
        "bool": [True, False, True, True],
        "int8": [-128, -1, 0, 127],
        "uint8": [0, 1, 128, 255],
        "int16": [-32768, -2, 3, 32767],
        "uint16": [0, 2, 513, 65535],
        "int32": [-2147483648, -3, 70000, 2147483647],
        "uint32": [0, 3, 70000, 4294967295],
        "int64": [-9223372036854775808, -4, 5000000000, 9223372036854775807],
        "uint64": [0, 4, 5000000000, 18446744073709551615],
        "float16": [-2.0, 0.5, 65504.0, 0.0],
        "float32": [0.015625, -0.25, 3.4028234663852886e38, float("nan")],
        "float64": [0.1, -1e-300, float("inf"), float("-inf")],
    }
    out = []
    for code, dtype in DTYPE_CODES.items():
        array = np.array(samples[str(dtype)], dtype=dtype).reshape(2, 2)
        value = {"array": array}
        out.append(
            {
                **vector(
                    f"array_{dtype}",
                    f"a [2, 2] {dtype} array, dtype code {code} (5.3)",
                    value,
                    encode(value),
                ),
                "json": None
                if dtype.kind == "f" and not np.isfinite(array).all()
                else json_text(value),
            }
        )
    for name, array, text in (
        ("array_0d", np.array(1.5, np.float32), "a 0-dimensional float32 array (5.3, 5.4)"),
        ("array_empty", np.zeros((0, 4), np.float32), "an empty [0, 4] float32 array"),
    ):
        value = {"array": array}
        out.append(vector(name, text, value, encode(value)))
    for v in out:
        assert from_tagged(v["value"]).keys() == decode(bytes.fromhex(v["msgpack"])).keys()
    return out


def tiny_policies() -> list[dict[str, Any]]:
    """Tiny policies small enough to check by hand (section 14.4).

    A categorical one, a gaussian one, a gaussian one with observation normalisation and
    normalised actions, an epsilon-greedy one (DQN's) and a squashed-Gaussian one (SAC's).
    """
    out = []
    rng = np.random.default_rng(7)
    for distribution, action_dim in (("categorical", 3), ("gaussian", 2)):
        spec = ModelSpec(
            obs_dim=3,
            actor_layers=("actor.0", "actor.2"),
            activation="tanh",
            distribution=distribution,
            action_dim=action_dim,
            action_low=(-1.0,) * action_dim if distribution == "gaussian" else (),
            action_high=(1.0,) * action_dim if distribution == "gaussian" else (),
            action_start=1 if distribution == "categorical" else 0,
        )
        # Weights on a grid of 1/64 are exact in float32 and short in decimal.
        arrays = {
            "actor.0.weight": np.round(rng.uniform(-1, 1, (4, 3)) * 64) / 64,
            "actor.0.bias": np.round(rng.uniform(-0.5, 0.5, 4) * 64) / 64,
            "actor.2.weight": np.round(rng.uniform(-1, 1, (action_dim, 4)) * 64) / 64,
            "actor.2.bias": np.round(rng.uniform(-0.5, 0.5, action_dim) * 64) / 64,
        }
        if distribution == "gaussian":
            arrays["log_std"] = np.array([-0.5, 0.25])
        arrays = {k: (v + 0.0).astype(np.float32) for k, v in arrays.items()}
        policy = NumpyPolicy(spec, arrays, version=0)
        obs = np.array([[0.5, -0.25, 0.125]], np.float32)
        hidden = np.tanh(obs @ arrays["actor.0.weight"].T + arrays["actor.0.bias"])
        output = policy.forward(obs)
        case: dict[str, Any] = {
            "name": f"tiny_{distribution}",
            "model": spec.to_wire(),
            "arrays": {k: to_tagged(v) for k, v in arrays.items()},
            "observation": obs[0].tolist(),
            "hidden": [float(v) for v in hidden[0]],
        }
        if distribution == "categorical":
            logits = output[0].astype(np.float64)
            probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
            logps = policy.log_prob(np.repeat(obs, action_dim, 0), np.arange(action_dim))
            # Section 14.4's rule: the smallest j whose running sum of weights passes u * S.
            w = np.exp(logits - logits.max())
            choice = int(np.argmax(np.cumsum(w) > UNIFORM * w.sum()))
            case.update(
                {
                    "logits": [float(v) for v in output[0]],
                    "probabilities": [float(v) for v in probs],
                    "log_probabilities": [float(v) for v in logps],
                    "uniform_draw": UNIFORM,
                    "sampled_choice": choice,
                    "sampled_action": choice + spec.action_start,
                    "sampled_log_probability": float(logps[choice]),
                    "greedy_choice": int(np.argmax(logits)),
                    "greedy_action": int(np.argmax(logits)) + spec.action_start,
                }
            )
        else:
            action = np.array([[0.25, -1.5]], np.float32)
            case.update(
                {
                    "mean": [float(v) for v in output[0]],
                    "log_std": [float(v) for v in arrays["log_std"]],
                    "action": action[0].tolist(),
                    "action_log_probability": float(policy.log_prob(obs, action)[0]),
                    "clipped_action": [float(v) for v in policy.to_env_actions(action)[0]],
                }
            )
        out.append(case)
    out.append(tiny_normalized_gaussian(rng))
    out.append(tiny_epsilon_greedy(rng))
    out.append(tiny_squashed_gaussian(rng))
    return out


def tiny_normalized_gaussian(rng: np.random.Generator) -> dict[str, Any]:
    """A gaussian policy that normalises its observations and acts in units of its Box's bounds.

    The observation's last element is beyond ``obs_clip``; the given action's first value is
    beyond the Box, so it is clipped on its way to the simulator.
    """
    spec = ModelSpec(
        obs_dim=3,
        actor_layers=("actor.0", "actor.2"),
        activation="tanh",
        distribution="gaussian",
        action_dim=2,
        action_low=(-100.0, 0.0),
        action_high=(100.0, 10.0),
        obs_mean=(1.0, -2.0, 100.0),
        obs_std=(0.5, 4.0, 25.0),
        obs_clip=3.0,
        action_scale=(100.0, 5.0),
        action_bias=(0.0, 5.0),
    )
    arrays = {
        "actor.0.weight": np.round(rng.uniform(-1, 1, (4, 3)) * 64) / 64,
        "actor.0.bias": np.round(rng.uniform(-0.5, 0.5, 4) * 64) / 64,
        "actor.2.weight": np.round(rng.uniform(-1, 1, (2, 4)) * 64) / 64,
        "actor.2.bias": np.round(rng.uniform(-0.5, 0.5, 2) * 64) / 64,
        "log_std": np.array([-0.5, 0.25]),
    }
    arrays = {k: (v + 0.0).astype(np.float32) for k, v in arrays.items()}
    policy = NumpyPolicy(spec, arrays, version=0)
    obs = np.array([[1.75, 2.0, 0.0]], np.float32)
    x = policy.normalize(obs)
    hidden = np.tanh(x @ arrays["actor.0.weight"].T + arrays["actor.0.bias"])
    mean = policy.forward(obs)
    greedy = policy.compute_actions(obs, explore=False).actions
    action = np.array([[130.0, 4.0]], np.float32)
    return {
        "name": "tiny_gaussian_normalized",
        "model": spec.to_wire(),
        "arrays": {k: to_tagged(v) for k, v in arrays.items()},
        "observation": obs[0].tolist(),
        "normalized_observation": [float(v) for v in x[0]],
        "hidden": [float(v) for v in hidden[0]],
        "mean": [float(v) for v in mean[0]],
        "log_std": [float(v) for v in arrays["log_std"]],
        "greedy_action": [float(v) for v in greedy[0]],
        "action": action[0].tolist(),
        "normalized_action": [float(v) for v in (action[0] - [0.0, 5.0]) / [100.0, 5.0]],
        "action_log_probability": float(policy.log_prob(obs, action)[0]),
        "clipped_action": [float(v) for v in policy.to_env_actions(action)[0]],
    }


class _FixedDraws:
    """A stand-in for the policy's random generator that returns given draws, in order."""

    def __init__(
        self,
        uniform: tuple[float, ...] = (),
        integers: tuple[int, ...] = (),
        normal: tuple[float, ...] = (),
    ):
        self._uniform = list(uniform)
        self._integers = list(integers)
        self._normal = normal

    def random(self) -> float:
        return self._uniform.pop(0)

    def integers(self, low: int, high: int) -> int:
        value = self._integers.pop(0)
        assert low <= value < high
        return value

    def standard_normal(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.array(self._normal, dtype=np.float64).reshape(shape)


def _with_draws(policy: NumpyPolicy, draws: _FixedDraws) -> NumpyPolicy:
    policy._rng = cast(np.random.Generator, draws)  # fixed draws, for the vector
    return policy


def _grid(rng: np.random.Generator, shape: tuple[int, ...], bound: float) -> np.ndarray:
    """Uniform values on a grid of 1/64: exact in float32 and short in decimal."""
    return np.round(rng.uniform(-bound, bound, shape) * 64) / 64


def tiny_epsilon_greedy(rng: np.random.Generator) -> dict[str, Any]:
    """An epsilon-greedy policy (DQN's): action values, ties, the greedy and the random branch.

    Its layers are named as DQN names them (``trunk.0``, ``head``), with ``relu``, and it
    normalises its observations. The head's last row repeats the row of the best choice, so
    two choices tie for the best value: the greedy choice is the first of them.
    """
    spec = ModelSpec(
        obs_dim=3,
        actor_layers=("trunk.0", "head"),
        activation="relu",
        distribution="epsilon_greedy",
        action_dim=4,
        action_start=-1,
        epsilon=EPSILON,
        obs_mean=(0.5, 0.0, -1.0),
        obs_std=(2.0, 0.5, 4.0),
        obs_clip=10.0,
    )
    arrays = {
        "trunk.0.weight": _grid(rng, (4, 3), 1.0),
        "trunk.0.bias": _grid(rng, (4,), 0.5),
        "head.weight": _grid(rng, (4, 4), 1.0),
        "head.bias": _grid(rng, (4,), 0.5),
    }
    obs = np.array([[1.5, -0.25, 1.0]], np.float32)
    x = (obs - np.array(spec.obs_mean)) / np.array(spec.obs_std)
    values = np.maximum(x @ arrays["trunk.0.weight"].T + arrays["trunk.0.bias"], 0.0)
    values = values @ arrays["head.weight"].T + arrays["head.bias"]
    best = int(np.argmax(values[0, :3]))
    arrays["head.weight"][3] = arrays["head.weight"][best]  # a tie with the best choice
    arrays["head.bias"][3] = arrays["head.bias"][best]
    arrays = {k: (v + 0.0).astype(np.float32) for k, v in arrays.items()}
    policy = NumpyPolicy(spec, arrays, version=0)
    x = policy.normalize(obs)
    hidden = np.maximum(x @ arrays["trunk.0.weight"].T + arrays["trunk.0.bias"], 0.0)
    q = policy.forward(obs)
    greedy = policy.compute_actions(obs, explore=False)
    n = spec.action_dim
    logps = policy.log_prob(np.repeat(obs, n, 0), np.arange(n))
    case: dict[str, Any] = {
        "name": "tiny_epsilon_greedy",
        "model": spec.to_wire(),
        "arrays": {k: to_tagged(v) for k, v in arrays.items()},
        "observation": obs[0].tolist(),
        "normalized_observation": [float(v) for v in x[0]],
        "hidden": [float(v) for v in hidden[0]],
        "q_values": [float(v) for v in q[0]],
        "greedy_choice": int(greedy.actions[0]),
        "greedy_action": int(policy.to_env_actions(greedy.actions)[0]),
        "log_probabilities": [float(v) for v in logps],
    }
    steps = []
    for draw, choice in EXPLORE_DRAWS:
        taken = _with_draws(policy, _FixedDraws((draw,), (choice,))).compute_actions(obs)
        steps.append(
            {
                "explore_draw": draw,
                "uniform_choice": choice,
                "choice": int(taken.actions[0]),
                "action": int(policy.to_env_actions(taken.actions)[0]),
                "log_probability": float(taken.logp[0]),
            }
        )
    case["exploring_steps"] = steps
    return case


def tiny_squashed_gaussian(rng: np.random.Generator) -> dict[str, Any]:
    """A squashed-Gaussian policy (SAC's) with one sample from fixed normal draws.

    The second value's log standard deviation is above the clamp (the head's bias is 6), so it
    is clamped to 2; its sample lands near the low bound, where ``SQUASH_EPS`` visibly changes
    the log-density.
    """
    spec = ModelSpec(
        obs_dim=3,
        actor_layers=("actor.0", "actor.2"),
        activation="tanh",
        distribution="squashed_gaussian",
        action_dim=4,
        action_low=(-2.0, 0.0),
        action_high=(2.0, 10.0),
        action_parts=(("squashed_gaussian", 2),),
        action_offsets=(0, 0),
    )
    arrays = {
        "actor.0.weight": _grid(rng, (4, 3), 1.0),
        "actor.0.bias": _grid(rng, (4,), 0.5),
        "actor.2.weight": _grid(rng, (4, 4), 1.0),
        "actor.2.bias": _grid(rng, (4,), 0.5),
    }
    arrays["actor.2.bias"][3] = 6.0  # the second log_std: beyond SQUASHED_LOG_STD_MAX
    arrays = {k: (v + 0.0).astype(np.float32) for k, v in arrays.items()}
    policy = NumpyPolicy(spec, arrays, version=0)
    obs = np.array([[0.5, -0.25, 0.125]], np.float32)
    hidden = np.tanh(obs @ arrays["actor.0.weight"].T + arrays["actor.0.bias"])
    y = policy.forward(obs)[0]
    greedy = policy.compute_actions(obs, explore=False)
    sample = _with_draws(policy, _FixedDraws(normal=SQUASHED_NOISE)).compute_actions(obs)
    clamped = np.clip(y[2:].astype(np.float64), -20.0, 2.0)
    u = y[:2].astype(np.float64) + np.exp(clamped) * np.array(SQUASHED_NOISE)
    return {
        "name": "tiny_squashed_gaussian",
        "model": spec.to_wire(),
        "arrays": {k: to_tagged(v) for k, v in arrays.items()},
        "observation": obs[0].tolist(),
        "hidden": [float(v) for v in hidden[0]],
        "output": [float(v) for v in y],
        "mean": [float(v) for v in y[:2]],
        "clamped_log_std": [float(v) for v in clamped],
        "noise": list(SQUASHED_NOISE),
        "u": [float(v) for v in u],
        "tanh_u": [float(v) for v in np.tanh(u)],
        "action": [float(v) for v in sample.actions[0]],
        "action_log_probability": float(sample.logp[0]),
        "greedy_action": [float(v) for v in greedy.actions[0]],
        "greedy_log_probability": float(greedy.logp[0]),
    }


def dump(data: Any) -> str:
    """The vector files' JSON text."""
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def vector_files(frames: list[Any], requests: list[Any]) -> dict[Path, str]:
    """Every file of docs/protocol-vectors/ but README.md, by path."""
    del requests  # the HTTP forms are derived from the same values
    messages = {"format": FORMAT, "vectors": message_vectors(frames) + array_vectors()}
    forward = {"format": FORMAT, "tolerance": TOLERANCE, "policies": tiny_policies()}
    return {FOLDER / "messages.json": dump(messages), FOLDER / "forward-pass.json": dump(forward)}
