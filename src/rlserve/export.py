"""Export a trained policy from a run folder, to run it inside a simulator without rlserve.

``rlserve export runs/<name> --format onnx`` writes ``runs/<name>/policy.onnx`` and a
``policy.onnx.json`` that describes it. The ONNX model takes one input and gives the greedy
action and the distribution's parameters, so an engine can act deterministically or sample:

=============  ====================  ===========================================================
name           shape, dtype          meaning
=============  ====================  ===========================================================
``obs``        ``[N, D]`` float32    flattened observations (``D`` = ``obs_dim`` in the JSON)
``action``     ``[N]`` int64         Discrete: the most likely choice, plus the space's ``start``
               ``[N, A]`` float32    Box: the mean action, clipped to the space's bounds
``logits``     ``[N, n]`` float32    Discrete only: unnormalised log-probabilities of choices
``mean``       ``[N, A]`` float32    Box only: the Gaussian's mean (before clipping)
``log_std``    ``[A]`` float32       Box only: the Gaussian's log standard deviation
=============  ====================  ===========================================================

The checkpoint is loaded with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlserve.algorithms.models import ActorCritic
from rlserve.algorithms.ppo_config import PPOConfig
from rlserve.config import build
from rlserve.errors import ConfigError
from rlserve.server.learner_worker import checkpoint_files
from rlserve.server.run_folder import RunFolder
from rlserve.spaces import from_description


class _GreedyPolicy(nn.Module):
    """The actor with its action head, as exported."""

    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, model: ActorCritic):
        super().__init__()
        self.actor = model.actor
        self.distribution = model.distribution
        self.start = model.action_start
        self.log_std = model.log_std
        self.register_buffer("low", torch.tensor(model.action_low or (0.0,)))
        self.register_buffer("high", torch.tensor(model.action_high or (0.0,)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.actor(obs)
        if self.distribution == "categorical":
            return out.argmax(dim=1) + self.start, out
        action = torch.maximum(torch.minimum(out, self.high), self.low)
        return action, out, self.log_std * 1.0


def load_model(
    run_dir: str | Path, checkpoint: str | Path | None = None
) -> tuple[ActorCritic, Path]:
    """Rebuild a run's model from its configuration and a checkpoint (default: the newest).

    Raises:
        ConfigError: Not a run folder, or no checkpoint in it.
    """
    run = RunFolder.existing(run_dir)
    tables, spaces = run.load()
    ppo = build(PPOConfig, tables.get("ppo"), None)
    model = ActorCritic(
        from_description(spaces["observation_space"]),
        from_description(spaces["action_space"]),
        ppo.hidden,
        ppo.activation,
    )
    if checkpoint is None:
        files = checkpoint_files(run.path)
        if not files:
            raise ConfigError(f"{run.path} has no checkpoint yet; train (rlserve serve) first")
        checkpoint = files[-1]
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    model.eval()
    return model, Path(checkpoint)


def export_onnx(
    run_dir: str | Path, output: str | Path | None = None, checkpoint: str | Path | None = None
) -> Path:
    """Write the run's policy as ONNX (and a JSON description beside it); return its path."""
    model, source = load_model(run_dir, checkpoint)
    path = Path(output) if output is not None else Path(run_dir) / "policy.onnx"
    wrapper = _GreedyPolicy(model).eval()
    categorical = model.distribution == "categorical"
    outputs = ["action", "logits"] if categorical else ["action", "mean", "log_std"]
    example = torch.zeros(2, model.obs_dim)
    batch = torch.export.Dim("batch")
    torch.onnx.export(
        wrapper,
        (example,),
        str(path),
        input_names=["obs"],
        output_names=outputs,
        dynamic_shapes=({0: batch},),
        dynamo=True,
        verbose=False,
    )
    description: dict[str, Any] = {
        "format": "onnx",
        "checkpoint": str(source),
        "inputs": {"obs": {"shape": ["N", model.obs_dim], "dtype": "float32"}},
        "outputs": {
            "action": {
                "shape": ["N"] if categorical else ["N", model.action_dim],
                "dtype": "int64" if categorical else "float32",
            },
            **(
                {"logits": {"shape": ["N", model.action_dim], "dtype": "float32"}}
                if categorical
                else {
                    "mean": {"shape": ["N", model.action_dim], "dtype": "float32"},
                    "log_std": {"shape": [model.action_dim], "dtype": "float32"},
                }
            ),
        },
        "model": model.spec().to_wire(),
    }
    Path(f"{path}.json").write_text(json.dumps(description, indent=2))
    return path
