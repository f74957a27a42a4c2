"""Export a trained policy from a run folder, to run it inside a simulator without rlserve.

``rlserve export runs/<name> --format onnx`` writes ``runs/<name>/policy.onnx`` and a
``policy.onnx.json`` that describes it; ``--policy ID`` exports one policy of a run with several
(to ``runs/<name>/policy-<ID>.onnx``). The ONNX model takes one input and gives the greedy
action and the distribution's parameters, so an engine can act deterministically or sample:

=============  ====================  ===========================================================
name           shape, dtype          meaning
=============  ====================  ===========================================================
``obs``        ``[N, D]`` float32    flattened observations (``D`` = ``obs_dim``; ``columns``)
``action``     ``[N]`` int64         Discrete: the most likely choice, plus the space's ``start``
               ``[N, A]`` float32    Box: the mean action, clipped to the space's bounds
``logits``     ``[N, n]`` float32    Discrete only: unnormalised log-probabilities of choices
``mean``       ``[N, A]`` float32    Box only: the Gaussian's mean (before clipping)
``log_std``    ``[A]`` float32       Box only: the Gaussian's log standard deviation
=============  ====================  ===========================================================

Other action spaces (MultiDiscrete, MultiBinary, Dict, Tuple) give ``action`` ``[N, A]`` in the
flat action layout of ``docs/protocol.md`` §6.3 (each part's mode plus the space's ``start``,
Box values clipped; int64 when no part is a Box, else float32), ``params`` ``[N, P]`` (the
actor's outputs: logits, bit logits and means, part after part) and, when a part is a Box,
``log_std`` ``[G]``. The ``model`` entry of the JSON lists the parts (``action_parts``).

A DQN run (Discrete actions) gives ``action`` ``[N]`` int64, the choice of highest Q-value plus
the space's ``start``, and ``q_values`` ``[N, n]`` float32 (a dueling network's heads combined);
the JSON's ``model`` entry has ``distribution`` ``epsilon_greedy`` and the ``epsilon`` of the
checkpoint's schedule, for an engine that wants to explore as training did.

A SAC run (``[algorithm] name = "sac"``) exports its tanh-squashed Gaussian: ``action``
``[N, A]`` float32 is the deterministic action ``low + (tanh(mean) + 1) / 2 * (high - low)``,
``mean`` ``[N, A]`` and ``log_std`` ``[N, A]`` (state-dependent, clamped to ``[-20, 2]``) the
Gaussian before the squashing; an engine samples ``u ~ N(mean, exp(log_std))`` and scales
``tanh(u)`` the same way.

The JSON's ``inputs.obs.columns`` says where each part of the observation goes in ``obs``
(:func:`~rlserve.protocol.flat_layout.flat_columns`, the order of ``gymnasium.spaces.flatten``):
per leaf of a Dict or Tuple its ``key`` path, its columns ``start`` to ``stop``, and its
``encoding``: ``values`` (Box, MultiBinary), ``one_hot`` (Discrete: ``n`` columns, 1 at
``start + value - value_start``) or ``one_hot_each`` (MultiDiscrete).

The input ``obs`` is always the raw flattened observation. A policy trained with
``normalize_observations`` has its statistics baked in: the model computes
``clip((obs - obs_mean) / obs_std, -obs_clip, obs_clip)`` before its first layer, with the
values of the checkpoint's weights version (the JSON's ``model`` entry lists them, for
reference only: do not normalise again). A PPO policy whose Gaussian acts in normalised units
(``normalize_actions``, a bounded Box) gives ``mean`` and ``log_std`` in the space's units
(``action_bias + action_scale * mean`` and ``log_std + log(action_scale)``, so sampling
``mean + exp(log_std) * e`` and clipping is the same rule with or without it), and so does
``params`` for its Gaussian values.

A policy whose observation space has a legal-move mask (``docs/learners.md``, "Action masks")
reads it from ``obs`` too: the mask's values are the slice ``action_mask`` (``start``, ``size``) of
the JSON's ``model`` entry, and they are neither normalised nor read by the network. ``action``
is then the best legal choice (of each sub-action), and ``logits``, ``params`` and ``q_values``
hold ``-1.7e38`` (float32's lowest / 2) for illegal choices, so a softmax of them, or a sample,
never gives an illegal one.

A policy over an image observation (``docs/learners.md``, "Image observations") takes it
flattened in ``obs`` too, as float32 (a uint8 image's values as they are: the model divides them by
255); the JSON's ``model`` entry describes its conv ``encoder``.

A PPO policy with memory (``use_lstm``) takes a second input, ``state_in`` ``[N, 2C]`` float32
(``C`` the JSON model's ``memory.cell_size``; ``concat(h, c)``, zeros at an episode's start),
and gives ``state_out`` of the same shape as its last output: feed it back as the next step's
``state_in``, one row per episode (``docs/protocol.md``, the memory section, has the arithmetic).
The LSTM step is plain matrix products, sigmoids and tanhs, not ONNX's ``LSTM`` operator.

The file is self-contained (the weights are inside it): copy ``policy.onnx`` alone.

The checkpoint is loaded with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlserve.algorithm.export_notes import quiet_exporter
from rlserve.config.fields import build
from rlserve.errors import ConfigError
from rlserve.learners import masking
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.image_models import encode
from rlserve.learners.models import ActorCritic, QNetwork
from rlserve.learners.normalization import (
    ObservationNormalizer,
    load_normalizer,
    with_observation_normalization,
)
from rlserve.learners.recurrent_models import RecurrentActorCritic, ppo_model
from rlserve.learners.registry import algorithm, run_algorithm
from rlserve.learners.sac_config import SACSettings
from rlserve.learners.sac_models import SquashedGaussianActor
from rlserve.policy import ModelSpec
from rlserve.policy.distribution import ActionDistribution
from rlserve.policy.encoder_choice import settings_encoder
from rlserve.policy.frame_stacking import stacked_space
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.flat_layout import flat_columns
from rlserve.run.checkpoints import checkpoints_in
from rlserve.run.run_folder import RunFolder
from rlserve.server.policies import is_flat, policies_from_run, policy_paths


def _normalized(normalizer: ObservationNormalizer | None, obs: torch.Tensor) -> torch.Tensor:
    return obs if normalizer is None else normalizer(obs)


class _GreedyPolicy(nn.Module):
    """The actor with its action head, as exported."""

    low: torch.Tensor
    high: torch.Tensor
    offsets: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor
    log_scale: torch.Tensor

    def __init__(self, model: ActorCritic, normalizer: ObservationNormalizer | None):
        super().__init__()
        self.actor = model.actor
        self.normalizer = normalizer
        self.action_mask = model.action_mask
        self.image = model.image
        if model.image is not None:
            self.encoder = model.encoder
        self.distribution = model.action_distribution
        self.log_std = model.log_std
        dist = self.distribution
        self.register_buffer("low", torch.tensor(dist.low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(dist.high, dtype=torch.float32))
        self.register_buffer("offsets", torch.tensor(dist.offsets, dtype=torch.float32))
        # Gaussian values from normalised units to the space's (1 and 0 without).
        width = dist.action_width
        scale = torch.tensor(dist.scale or (1.0,) * width, dtype=torch.float32)
        bias = torch.tensor(dist.bias or (0.0,) * width, dtype=torch.float32)
        self.scaled = dist.scaled
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        gaussian = [i for i, (kind, _) in enumerate(dist.column_kinds()) if kind == "gaussian"]
        self.register_buffer("log_scale", torch.log(scale[gaussian]))

    def _log_std(self) -> torch.Tensor:
        if self.scaled:  # the standard deviation in the space's units
            return self.log_std + self.log_scale
        return self.log_std * 1.0

    def _features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, features)``: the normalised observation and what the first layer reads."""
        x = _normalized(self.normalizer, obs)
        features = masking.features(x, self.action_mask)
        if self.image is not None:
            features = encode(self.encoder, self.image, features)
        return x, features

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x, features = self._features(obs)
        return self._head(masking.masked(self.actor(features), x, self.action_mask))

    def _head(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The greedy action and the distribution's parameters from the actor's outputs."""
        kind = self.distribution.kind
        if kind == "categorical":
            return out.argmax(dim=1) + int(self.distribution.offsets[0]), out
        if kind == "gaussian":
            mean = out * self.scale + self.bias if self.scaled else out
            action = torch.maximum(torch.minimum(mean, self.high), self.low)
            return action, mean, self._log_std()
        # Each part's mode, in the flat action layout, then offset and clipped.
        columns: list[torch.Tensor] = []
        params: list[torch.Tensor] = []
        param = column = 0
        for part in self.distribution.parts:
            x = out[:, param : param + part.size]
            param += part.size
            if part.kind == "categorical":
                columns.append(x.argmax(dim=1, keepdim=True).to(out.dtype))
            elif part.kind == "bernoulli":
                columns.append((x > 0).to(out.dtype))
            else:
                if self.scaled:
                    cols = slice(column, column + part.size)
                    x = x * self.scale[cols] + self.bias[cols]
                columns.append(x)
            params.append(x)
            column += part.action_width
        action = torch.cat(columns, dim=1) + self.offsets
        action = torch.maximum(torch.minimum(action, self.high), self.low)
        if self.distribution.discrete:
            return (action.to(torch.int64), out)
        return action, torch.cat(params, dim=1), self._log_std()


class _RecurrentGreedyPolicy(_GreedyPolicy):
    """A policy with memory, as exported: the recurrent state is an input and an output.

    The LSTM step is written out as matrix products, sigmoids and tanhs rather than exported as
    ``nn.LSTM``: ONNX's ``LSTM`` operator is one that engines' runtimes often lack, and the
    plain operators run everywhere.
    """

    w_ih: torch.Tensor
    w_hh: torch.Tensor
    bias: torch.Tensor

    def __init__(self, model: RecurrentActorCritic, normalizer: ObservationNormalizer | None):
        super().__init__(model, normalizer)
        self.cell_size = model.cell_size
        lstm = dict(model.memory.named_parameters())
        with torch.no_grad():
            self.register_buffer("w_ih", lstm["weight_ih_l0"].detach().t().contiguous())
            self.register_buffer("w_hh", lstm["weight_hh_l0"].detach().t().contiguous())
            self.register_buffer("bias", (lstm["bias_ih_l0"] + lstm["bias_hh_l0"]).detach())

    def forward(self, obs: torch.Tensor, state_in: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        x, features = self._features(obs)
        n = self.cell_size
        h, c = state_in[:, :n], state_in[:, n:]
        gates = features @ self.w_ih + h @ self.w_hh + self.bias
        i, f, g, o = gates.split(n, dim=1)  # PyTorch's gate order
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        params = masking.masked(self.actor(h), x, self.action_mask)
        return (*self._head(params), torch.cat((h, c), dim=1))


class _GreedyQ(nn.Module):
    """A Q-network with its greedy choice, as exported."""

    def __init__(self, model: QNetwork, normalizer: ObservationNormalizer | None):
        super().__init__()
        self.model = model
        self.normalizer = normalizer
        self.start = int(model.action_distribution.offsets[0])

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = _normalized(self.normalizer, obs)
        q_values = self.model.legal_values(x, self.model(x))
        return q_values.argmax(dim=1) + self.start, q_values


class _SquashedPolicy(nn.Module):
    """A SAC actor with its deterministic action, as exported."""

    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, actor: SquashedGaussianActor, normalizer: ObservationNormalizer | None):
        super().__init__()
        self.actor = actor
        self.normalizer = normalizer
        dist = actor.action_distribution
        self.register_buffer("low", torch.tensor(dist.low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(dist.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mean, log_std = self.actor.params(_normalized(self.normalizer, obs))
        action = self.low + (torch.tanh(mean) + 1.0) * 0.5 * (self.high - self.low)
        return action, mean, log_std


def load_model(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    policy_id: str = DEFAULT_POLICY_ID,
) -> tuple[ActorCritic | QNetwork | SquashedGaussianActor, ObservationNormalizer | None, Path, Any]:
    """Rebuild a run's model from its configuration and a checkpoint (default: the newest).

    The policy's algorithm (its ``algo``, else the run's ``[algorithm] name``, PPO without one)
    says which: PPO's actor-critic, DQN's Q-network or SAC's actor. The checkpoint says how its
    weights read observations and (PPO) act: the observation normaliser of its weights version
    (None when it has none) comes back with the model, and a PPO model acts in normalised Box
    units when the checkpoint was trained so.

    Args:
        run_dir: The run folder.
        checkpoint: The checkpoint to load (default: the policy's newest).
        policy_id: The policy, in a run with several.

    Returns:
        The model, its observation normaliser, the checkpoint, and the observation space the
        model reads (frames stacked when the policy stacks them).

    Raises:
        ConfigError: Not a run folder, no such policy in it, no checkpoint of it, or
            ``checkpoint`` is missing or not one of this policy.
    """
    run = RunFolder.existing(run_dir)
    tables, spaces = run.load()
    policies, _ = policies_from_run(tables, spaces)
    spec = policies.get(policy_id)
    if spec is None:
        raise ConfigError(
            f"{run.path} has no policy '{policy_id}'; pass --policy with one of "
            f"{', '.join(policies)}"
        )
    entry = algorithm(spec.algorithm_of(run_algorithm(tables).name))  # the policy's own
    settings = build(entry.settings, spec.settings_table(tables.get(entry.name) or {}), None)
    space = spec.observation_space
    if settings.frame_stack > 1:  # the model reads the stack
        space = stacked_space(space, settings.frame_stack)
    image = settings_encoder(settings, space)
    model: ActorCritic | QNetwork | SquashedGaussianActor
    if isinstance(settings, DQNSettings):
        model = QNetwork(
            space,
            spec.action_space,
            settings.hidden,
            settings.activation,
            settings.dueling,
            image,
        )
    elif isinstance(settings, SACSettings):
        model = SquashedGaussianActor(
            space, spec.action_space, settings.hidden, settings.activation, image
        )
    else:
        model = ppo_model(space, spec.action_space, settings)
    folder = policy_paths(run.path, policy_id, is_flat(policies)).checkpoints
    files = checkpoints_in(folder)
    if checkpoint is None:
        if not files:
            raise ConfigError(
                f"{folder} has no checkpoint yet: a run writes one when it stops and, as it "
                "trains, every --checkpoint-every (rlserve serve: 20 learner updates by "
                "default); train longer, or stop the run"
                if len(policies) == 1
                else f"policy '{policy_id}' of {run.path} has no checkpoint yet ({folder})"
            )
        checkpoint = files[-1]
    elif not Path(checkpoint).is_file():
        newest = ", ".join(p.name for p in files[-3:]) or "none yet"
        raise ConfigError(
            f"checkpoint {checkpoint}: no such file; the policy's checkpoints are in {folder} "
            f"(newest: {newest}), or leave --checkpoint out for the newest"
        )
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        if isinstance(model, SquashedGaussianActor):
            # A SAC checkpoint holds its critics too.
            model.load_state_dict(state["model"]["actor"])
        else:
            model.load_state_dict(state["model"])
    except Exception as exc:  # any file: not torch's, damaged, or another model's weights
        detail = " ".join(str(exc).split())  # one line, however many torch gave
        detail = detail if len(detail) <= 300 else f"{detail[:300]}..."
        raise ConfigError(
            f"{checkpoint} is not a checkpoint of policy '{policy_id}' of {run.path} "
            f"({type(exc).__name__}: {detail}); pick one from {folder}"
        ) from exc
    if isinstance(model, ActorCritic):
        # A checkpoint without the flag predates normalised actions: its Gaussian is in the
        # Box's units.
        model.set_action_normalization(bool(state.get("normalize_actions", False)))
    if isinstance(model, QNetwork) and isinstance(settings, DQNSettings):
        model.epsilon = settings.epsilon(int(state["counters"].get("env_steps_ingested", 0)))
    model.eval()
    mask = None if isinstance(model, SquashedGaussianActor) else model.action_mask
    normalizer = load_normalizer(state.get("obs_normalization"), mask)
    return model, normalizer, Path(checkpoint), space


def export_onnx(
    run_dir: str | Path,
    output: str | Path | None = None,
    checkpoint: str | Path | None = None,
    policy_id: str = DEFAULT_POLICY_ID,
) -> Path:
    """Write a run's policy as ONNX (and a JSON description beside it); return its path.

    The default output is ``RUN_DIR/policy.onnx``, or ``RUN_DIR/policy-<id>.onnx`` for a policy
    other than ``default``.
    """
    model, normalizer, source, obs_space = load_model(run_dir, checkpoint, policy_id)
    name = "policy.onnx" if policy_id == DEFAULT_POLICY_ID else f"policy-{policy_id}.onnx"
    path = Path(output) if output is not None else Path(run_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper: nn.Module
    outputs: dict[str, dict[str, Any]]
    model_spec: ModelSpec
    if isinstance(model, QNetwork):
        wrapper = _GreedyQ(model, normalizer).eval()
        dist = model.action_distribution
        outputs = {
            "action": {"shape": ["N"], "dtype": "int64"},
            "q_values": {"shape": ["N", dist.param_dim], "dtype": "float32"},
        }
        model_spec = model.spec(model.epsilon)
    elif isinstance(model, SquashedGaussianActor):
        wrapper = _SquashedPolicy(model, normalizer).eval()
        dist = model.action_distribution
        outputs = _outputs(dist)
        model_spec = model.spec()
    else:
        recurrent = isinstance(model, RecurrentActorCritic)
        policy = _RecurrentGreedyPolicy if recurrent else _GreedyPolicy
        wrapper = policy(model, normalizer).eval()  # type: ignore[arg-type]
        dist = model.action_distribution
        outputs = _outputs(dist)
        model_spec = model.spec()
    if normalizer is not None:
        model_spec = with_observation_normalization(
            model_spec, normalizer.mean.numpy(), normalizer.std.numpy(), normalizer.clip
        )
    spec = model_spec.to_wire()
    batch = torch.export.Dim("batch")
    inputs: dict[str, dict[str, Any]] = {
        "obs": {
            "shape": ["N", model.obs_dim],
            "dtype": "float32",
            "columns": flat_columns(obs_space),  # where each key's values go
        }
    }
    examples: tuple[torch.Tensor, ...] = (torch.zeros(2, model.obs_dim),)
    if isinstance(model, RecurrentActorCritic):
        state = {"shape": ["N", model.state_size], "dtype": "float32"}
        inputs["state_in"] = outputs["state_out"] = state
        examples += (torch.zeros(2, model.state_size),)
    with quiet_exporter():
        torch.onnx.export(
            wrapper,
            examples,
            str(path),
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_shapes=tuple({0: batch} for _ in examples),
            dynamo=True,
            # One self-contained file: the weights inside it, no policy.onnx.data beside it.
            external_data=False,
            verbose=False,
        )
    description: dict[str, Any] = {
        "format": "onnx",
        "checkpoint": str(source),
        "updates": updates_of(source),
        "inputs": inputs,
        "outputs": outputs,
        "model": spec,
    }
    Path(f"{path}.json").write_text(json.dumps(description, indent=2))
    return path


def updates_of(checkpoint: str | Path) -> int:
    """The learner updates that made a checkpoint's weights (0: never trained)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return int(state.get("counters", {}).get("updates", 0))


def _outputs(dist: ActionDistribution) -> dict[str, dict[str, Any]]:
    """The ONNX model's outputs for ``dist``: name to shape and dtype."""
    if dist.kind == "squashed_gaussian":
        per_value = {"shape": ["N", dist.action_width], "dtype": "float32"}
        return {"action": per_value, "mean": per_value, "log_std": per_value}
    params = {"shape": ["N", dist.param_dim], "dtype": "float32"}
    log_std = {"log_std": {"shape": [dist.gaussian_dim], "dtype": "float32"}}
    if dist.kind == "categorical":
        return {"action": {"shape": ["N"], "dtype": "int64"}, "logits": params}
    if dist.kind == "gaussian":
        return {
            "action": {"shape": ["N", dist.action_width], "dtype": "float32"},
            "mean": params,
            **log_std,
        }
    action = {
        "shape": ["N", dist.action_width],
        "dtype": "int64" if dist.discrete else "float32",
    }
    return {"action": action, "params": params, **({} if dist.discrete else log_std)}
