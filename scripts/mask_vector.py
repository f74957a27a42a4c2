"""The legal-move mask vectors, ``docs/protocol-vectors/masked-forward-pass.json``.

Two tiny masked policies, small enough to check by hand (``docs/protocol.md`` section 14.4.2):
the observation space is ``Dict(action_mask=MultiBinary(3), observations=Box(-inf, inf, (2,)))``,
flattened with the mask first (``model.action_mask`` = ``{start: 0, size: 3}``), and one linear
layer maps the 2 real observation values to 3 outputs. ``tiny_masked_categorical`` (PPO's) reads
them as logits, ``tiny_masked_epsilon_greedy`` (DQN's) as action values. Weights and observation
values are multiples of 1/8 and 1/4, so every output is exact in float32. Each policy has a few
observations (every choice legal; the unmasked best choice illegal; one legal choice) with the
masked outputs, the probabilities and the greedy action, computed by
:class:`rlserve.policy.NumpyPolicy`, and one observation with no legal choice, which a policy
refuses. No server needed: ``.venv/bin/python scripts/mask_vector.py`` rewrites the file.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol_vectors import FOLDER, FORMAT, TOLERANCE, dump, to_tagged

from rlserve.errors import SpaceError
from rlserve.policy.action_mask import MASKED_LOGIT
from rlserve.policy.greedy import epsilon_greedy_choices
from rlserve.policy.model_spec import ModelSpec
from rlserve.policy.numpy_policy import NumpyPolicy

PATH = FOLDER / "masked-forward-pass.json"

OBSERVATION_SPACE = "Dict(action_mask=MultiBinary(3), observations=Box(-inf, inf, (2,), float32))"
"""The observation space both policies act in (its flattened form: 3 mask values, then 2)."""

WEIGHT = np.array([[0.5, -0.25], [1.0, 0.5], [-0.75, 0.125]], dtype=np.float32)
"""``actor.0.weight``, ``[3, 2]``."""

BIAS = np.array([0.125, 0.0, -0.25], dtype=np.float32)
"""``actor.0.bias``, ``[3]``."""

OBSERVATIONS = (
    ((1, 1, 1), (1.0, 0.5)),
    ((1, 0, 1), (1.0, 0.5)),
    ((1, 1, 0), (-1.0, 0.25)),
    ((0, 0, 1), (-0.5, 1.0)),
)
"""(mask, real observation) pairs: every choice legal; the unmasked best choice (1) illegal;
the unmasked best choice (2) illegal again, another observation; a single legal choice."""

NO_LEGAL = ((0, 0, 0), (1.0, 0.5))
"""An observation whose mask leaves no legal choice: refused, never acted on."""

UNIFORM = 0.5
"""The categorical steps' uniform draw ``u`` (section 14.4, before it is multiplied by ``S``)."""

EPSILON = 0.25
"""The epsilon-greedy policy's ``epsilon``."""

EXPLORE_DRAWS = ((0.125, 0.75), (0.5, 0.75))
"""The epsilon-greedy exploring steps' draws at every observation: ``(r, v)``; a random legal
choice when ``r < epsilon``, the ``floor(v * n_legal)``-th legal one (rlserve's rule)."""


class _Draws:
    """The two uniform draws :func:`epsilon_greedy_choices` asks a generator for, given."""

    def __init__(self, explore: float, which: float) -> None:
        self._values = [explore, which]

    def random(self, size: int) -> np.ndarray:
        """The next given draw, ``size`` times."""
        return np.full(size, self._values.pop(0))


def _spec(distribution: str) -> ModelSpec:
    return ModelSpec(
        obs_dim=5,
        actor_layers=("actor.0",),
        activation="tanh",
        distribution=distribution,
        action_dim=3,
        action_start=1,
        epsilon=EPSILON if distribution == "epsilon_greedy" else 0.0,
        action_mask=(0, 3),
    )


def _observation(mask: tuple[int, ...], real: tuple[float, ...]) -> np.ndarray:
    return np.array([[*mask, *real]], dtype=np.float32)


def _refused(policy: NumpyPolicy) -> dict[str, Any]:
    obs = _observation(*NO_LEGAL)
    try:
        policy.compute_actions(obs, explore=False)
    except SpaceError as exc:
        return {"observation": obs[0].tolist(), "error": str(exc)}
    raise RuntimeError("a policy acted on an observation with no legal choice")


def _common(policy: NumpyPolicy, mask: tuple[int, ...], real: tuple[float, ...]) -> dict[str, Any]:
    obs = _observation(mask, real)
    outputs = policy.forward(obs)[0]
    legal = [m > 0.5 for m in mask]
    masked = np.where(legal, outputs, np.float32(MASKED_LOGIT)).astype(np.float32)
    greedy = int(masked.argmax())
    return {
        "observation": obs[0].tolist(),
        "legal": legal,
        "features": list(real),
        "outputs": outputs.tolist(),
        "masked_outputs": masked.tolist(),
        "unmasked_greedy_choice": int(outputs.argmax()),
        "greedy_choice": greedy,
        "greedy_action": greedy + 1,
    }


def tiny_masked_categorical() -> dict[str, Any]:
    """The masked categorical vector: per observation the masked logits, softmax and samples."""
    spec = _spec("categorical")
    arrays = {"actor.0.weight": WEIGHT, "actor.0.bias": BIAS}
    policy = NumpyPolicy(spec, arrays, 0)
    steps = []
    for mask, real in OBSERVATIONS:
        step = _common(policy, mask, real)
        obs = _observation(mask, real)
        legal_choices = [j for j, ok in enumerate(step["legal"]) if ok]
        choices = np.array(legal_choices, dtype=np.int64)
        logp = policy.log_prob(np.repeat(obs, len(choices), axis=0), choices)
        log_probs: list[float | None] = [None, None, None]
        probs = [0.0, 0.0, 0.0]
        for j, value in zip(legal_choices, logp.tolist(), strict=True):
            log_probs[j] = value
            probs[j] = math.exp(value)
        weights = [math.exp(v - max(step["masked_outputs"])) for v in step["masked_outputs"]]
        threshold, running, sampled = UNIFORM * sum(weights), 0.0, len(weights) - 1
        for j, w in enumerate(weights):
            running += w
            if running > threshold:
                sampled = j
                break
        step |= {
            "probabilities": probs,
            "log_probabilities": log_probs,
            "uniform_draw": UNIFORM,
            "sampled_choice": sampled,
            "sampled_action": sampled + 1,
            "sampled_log_probability": log_probs[sampled],
        }
        steps.append(step)
    return {
        "name": "tiny_masked_categorical",
        "observation_space": OBSERVATION_SPACE,
        "model": spec.to_wire(),
        "arrays": {name: to_tagged(a) for name, a in arrays.items()},
        "steps": steps,
        "refused": _refused(policy),
    }


def tiny_masked_epsilon_greedy() -> dict[str, Any]:
    """The masked epsilon-greedy vector: per observation the masked values and log-probabilities."""
    spec = _spec("epsilon_greedy")
    arrays = {"actor.0.weight": WEIGHT, "actor.0.bias": BIAS}
    policy = NumpyPolicy(spec, arrays, 0)
    steps = []
    for mask, real in OBSERVATIONS:
        step = _common(policy, mask, real)
        obs = _observation(mask, real)
        every = np.arange(3, dtype=np.int64)
        logp = policy.log_prob(np.repeat(obs, 3, axis=0), every).tolist()
        masked = np.array([step["masked_outputs"]], dtype=np.float32)
        exploring = []
        for r, v in EXPLORE_DRAWS:
            draws: Any = _Draws(r, v)
            choice = int(epsilon_greedy_choices(masked, EPSILON, draws, True, True)[0])
            exploring.append(
                {
                    "explore_draw": r,
                    "legal_draw": v,
                    "choice": choice,
                    "action": choice + 1,
                    "log_probability": logp[choice],
                }
            )
        step |= {
            "legal_count": sum(step["legal"]),
            "log_probabilities": [
                p if ok else None for p, ok in zip(logp, step["legal"], strict=True)
            ],
            "exploring_steps": exploring,
        }
        steps.append(step)
    return {
        "name": "tiny_masked_epsilon_greedy",
        "observation_space": OBSERVATION_SPACE,
        "model": spec.to_wire(),
        "arrays": {name: to_tagged(a) for name, a in arrays.items()},
        "steps": steps,
        "refused": _refused(policy),
    }


def mask_vector_file() -> str:
    """The file's text."""
    policies = [tiny_masked_categorical(), tiny_masked_epsilon_greedy()]
    return dump({"format": FORMAT, "tolerance": TOLERANCE, "policies": policies})


if __name__ == "__main__":
    PATH.write_text(mask_vector_file())
    print(f"wrote {PATH}")
