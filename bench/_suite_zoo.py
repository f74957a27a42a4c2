"""rl-zoo3's tuned hyperparameters for a task, read from the installed package, as SB3 kwargs.

The suite's third contender is SB3 with rl-zoo3's settings for the task: this module reads
``rl_zoo3/hyperparams/<algo>.yml`` of the installed ``rl_zoo3`` (``yaml.safe_load``) and turns
an entry into what SB3's constructor and ``make_vec_env`` take, the way rl-zoo3's
``ExperimentManager`` does:

- ``n_timesteps`` is dropped: the suite's budget is the issue's;
- ``n_envs`` (default 1), ``env_wrapper`` (import paths, optionally with kwargs),
  ``frame_stack``, ``env_kwargs`` build the vector env; ``normalize`` (true, or a dict / dict
  string of VecNormalize kwargs; ``gamma`` copied from the entry) wraps it in ``VecNormalize``;
- ``lin_X`` strings become linear schedules from ``X`` to 0 over the run;
- ``policy_kwargs`` strings (``dict(net_arch=[64, 64], activation_fn=nn.ReLU)``) are read by a
  small literal reader, never ``eval``: dicts, lists, numbers, strings and ``torch.nn`` names;
- ``noise_type`` / ``noise_std`` become an action-noise object;
- ``callback`` and ``vec_env_wrapper`` are not supported (none of the suite's tasks has one):
  an entry with either raises.

Where the yml has no entry for the task but has one for an older version of it (rl-zoo3 2.x
lists ``Hopper-v4``, not ``Hopper-v5``), that entry is used and named in the results.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOT_SUPPORTED = ("callback", "vec_env_wrapper", "replay_buffer_class")


@dataclass
class ZooEntry:
    """One rl-zoo3 entry, made ready for SB3."""

    name: str
    """The yml key it came from (the task, or an older version of it)."""
    policy: str
    n_envs: int
    model_kwargs: dict[str, Any]
    """For the SB3 algorithm's constructor (schedules and noise made, ``policy_kwargs`` read)."""
    normalize: dict[str, Any] | None
    """VecNormalize's kwargs, or None for no normalisation."""
    wrappers: list[tuple[Callable[..., Any], dict[str, Any]]] = field(default_factory=list)
    frame_stack: int | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)


def hyperparams_file(algo: str) -> Path:
    """The installed rl_zoo3's ``hyperparams/<algo>.yml``.

    Raises:
        SystemExit: rl_zoo3 is not installed.
    """
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "the zoo contender needs rl_zoo3: pip install -e '.[bench]' "
            "(or leave it out: --contenders rlserve,sb3)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "hyperparams" / f"{algo}.yml"


def find_entry(algo: str, task: str) -> tuple[str, dict[str, Any]] | None:
    """rl-zoo3's entry for ``task`` (or the newest older version of it), with its key."""
    import yaml

    entries: dict[str, Any] = yaml.safe_load(hyperparams_file(algo).read_text())
    if task in entries:
        return task, dict(entries[task])
    base, version = _split_version(task)
    older = [
        (v, key)
        for key in entries
        for b, v in [_split_version(key)]
        if b == base and v is not None and version is not None and v < version
    ]
    if not older:
        return None
    key = max(older)[1]
    return key, dict(entries[key])


def _split_version(name: str) -> tuple[str, int | None]:
    match = re.fullmatch(r"(.+)-v(\d+)", name)
    return (name, None) if match is None else (match.group(1), int(match.group(2)))


def prepare(algo: str, key: str, raw: dict[str, Any], action_dim: int) -> ZooEntry:
    """An entry's settings as SB3 takes them (see the module docstring).

    Raises:
        ValueError: The entry uses a key the suite does not support.
    """
    settings = dict(raw)
    for name in NOT_SUPPORTED:
        if name in settings:
            raise ValueError(f"rl-zoo3 {algo} {key}: '{name}' is not supported by the suite")
    settings.pop("n_timesteps", None)
    policy = str(settings.pop("policy", "MlpPolicy"))
    n_envs = int(settings.pop("n_envs", 1))
    normalize = _normalize(settings.pop("normalize", False), settings)
    wrappers = _wrappers(settings.pop("env_wrapper", None))
    frame_stack = settings.pop("frame_stack", None)
    env_kwargs = dict(settings.pop("env_kwargs", {}) or {})
    if isinstance(settings.get("policy_kwargs"), str):
        settings["policy_kwargs"] = read_literal(settings["policy_kwargs"])
    noise = _noise(settings.pop("noise_type", None), settings.pop("noise_std", 0.0), action_dim)
    if noise is not None:
        settings["action_noise"] = noise
    for name, value in settings.items():
        if isinstance(value, str) and value.startswith("lin_"):
            settings[name] = linear_schedule(float(value[len("lin_") :]))
    return ZooEntry(
        name=key,
        policy=policy,
        n_envs=n_envs,
        model_kwargs=settings,
        normalize=normalize,
        wrappers=wrappers,
        frame_stack=None if frame_stack is None else int(frame_stack),
        env_kwargs=env_kwargs,
    )


def linear_schedule(start: float) -> Callable[[float], float]:
    """From ``start`` down to 0 as SB3's progress_remaining goes from 1 to 0 (rl-zoo3's)."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * start

    return schedule


def _normalize(value: Any, settings: dict[str, Any]) -> dict[str, Any] | None:
    if value is False or value is None:
        return None
    kwargs: dict[str, Any] = {}
    if isinstance(value, str):
        kwargs = dict(read_literal(value))
    elif isinstance(value, dict):
        kwargs = dict(value)
    if "gamma" in settings:
        kwargs["gamma"] = settings["gamma"]
    return kwargs


def _wrappers(value: Any) -> list[tuple[Callable[..., Any], dict[str, Any]]]:
    if value is None:
        return []
    wrappers = []
    for item in value if isinstance(value, list) else [value]:
        path, kwargs = next(iter(item.items())) if isinstance(item, dict) else (item, {})
        module, _, name = str(path).rpartition(".")
        wrappers.append((getattr(importlib.import_module(module), name), dict(kwargs or {})))
    return wrappers


def _noise(kind: str | None, std: float, action_dim: int) -> Any:
    if kind is None:
        return None
    import numpy as np
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    mean, sigma = np.zeros(action_dim), float(std) * np.ones(action_dim)
    if "normal" in kind:
        return NormalActionNoise(mean, sigma)
    if "ornstein-uhlenbeck" in kind:
        return OrnsteinUhlenbeckActionNoise(mean, sigma)
    raise ValueError(f"rl-zoo3 noise_type '{kind}' is not one the suite knows")


def read_literal(text: str) -> Any:
    """A ``policy_kwargs``-style string as a value, without ``eval``.

    Reads literals (numbers, strings, True/False/None, lists, tuples, dicts), ``dict(k=v)``
    calls and ``nn.Name`` / ``th.nn.Name`` / ``torch.nn.Name`` (looked up in ``torch.nn``).

    Raises:
        ValueError: Anything else (a function call, an unknown name).
    """
    return _value(ast.parse(text.strip(), mode="eval").body, text)


def _value(node: ast.AST, text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, text)
    if isinstance(node, ast.List | ast.Tuple):
        items = [_value(item, text) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        return {
            _value(k, text): _value(v, text)
            for k, v in zip(node.keys, node.values, strict=True)
            if k is not None
        }
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        if node.args:
            raise ValueError(f"{text!r}: dict() with positional arguments is not read")
        return {kw.arg: _value(kw.value, text) for kw in node.keywords if kw.arg is not None}
    if isinstance(node, ast.Attribute):
        owner = ast.unparse(node.value)
        if owner in ("nn", "th.nn", "torch.nn"):
            import torch.nn

            found = getattr(torch.nn, node.attr, None)
            if isinstance(found, type):
                return found
    raise ValueError(
        f"{text!r}: cannot read {ast.unparse(node)!r} (only literals, dict() and nn.X)"
    )
