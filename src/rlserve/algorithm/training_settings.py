"""What ``training()`` and ``multi_agent()`` take, per algorithm, as settings dataclass fields.

Each algorithm's settings are its dataclass in :mod:`rlserve.learners.registry`; a setting may
also go by RLlib's name for it (:data:`RLLIB_NAMES`), RLlib's ``model``, ``observation_filter``,
``replay_buffer_config`` and ``lr_schedule`` forms are translated, and RLlib settings that have no
rlserve counterpart are refused naming what to set instead (:data:`RLLIB_SAC_REFUSED`). An
algorithm trained on hosted environments starts from :data:`HOSTED_DEFAULTS`. Torch-free.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlserve.errors import ConfigError
from rlserve.learners.registry import algorithm

RLLIB_TRAINING_NAMES = {
    "lambda_": "gae_lambda",
    "lambda": "gae_lambda",
    "sgd_minibatch_size": "minibatch_size",
    "num_sgd_iter": "num_epochs",
    "clip_param": "clip_coef",
    "vf_loss_coeff": "vf_coef",
    "entropy_coeff": "ent_coef",
    "grad_clip": "max_grad_norm",
    "kl_target": "target_kl",
}
"""RLlib's names for PPO settings -> rlserve's :class:`PPOSettings` fields."""

RLLIB_DQN_NAMES = {
    "train_batch_size": "batch_size",
    "num_steps_sampled_before_learning_starts": "learning_starts",
    "target_network_update_freq": "target_update_interval",
    "grad_clip": "max_grad_norm",
    "store_buffer_in_checkpoints": "checkpoint_replay",
}
"""RLlib's names for DQN settings -> rlserve's :class:`DQNSettings` fields (plus
``replay_buffer_config={"capacity": N}`` for ``buffer_size``)."""

RLLIB_SAC_NAMES = {
    "train_batch_size": "batch_size",
    "num_steps_sampled_before_learning_starts": "learning_starts",
    "store_buffer_in_checkpoints": "checkpoint_replay",
}
"""RLlib's names for SAC settings -> rlserve's :class:`SACSettings` fields (plus
``replay_buffer_config={"capacity": N}`` for ``buffer_size``; ``tau``, ``initial_alpha``,
``target_entropy`` (``"auto"``: unset), ``n_step``, ``gamma`` and ``lr`` have the same names;
``actor_lr`` and ``alpha_lr`` (both, one value) are ``lr``, ``critic_lr`` is ``critic_lr``, and
``twin_q=True`` is what rlserve does anyway)."""

RLLIB_SAC_REFUSED: dict[str, str] = {
    "training_intensity": (
        "is not supported; rlserve's SAC sets the gradient steps per env step, "
        "updates_per_step (RLlib's training_intensity / train_batch_size)"
    ),
    "target_network_update_freq": (
        "is not supported; rlserve's SAC moves its target critics by tau after every "
        "gradient step (set tau)"
    ),
    "grad_clip": "is not supported: rlserve's SAC does not clip gradients; drop it",
    "optimization_config": (
        "is not supported; rlserve's SAC has a learning rate for the actor and the "
        "temperature, lr, and one for the critics, critic_lr"
    ),
    "q_model_config": (
        "is not supported; actor and critics share hidden and activation (or "
        'model={"fcnet_hiddens": [...], "fcnet_activation": ...})'
    ),
    "policy_model_config": (
        "is not supported; actor and critics share hidden and activation (or "
        'model={"fcnet_hiddens": [...], "fcnet_activation": ...})'
    ),
    "_deterministic_loss": "is not supported",
    "_use_beta_distribution": (
        "is not supported: rlserve's SAC acts with a tanh-squashed Gaussian"
    ),
}
"""RLlib's SAC settings that have no rlserve counterpart, with what to do instead."""

SAC_LEARNING_RATES = ("actor_lr", "critic_lr", "alpha_lr")
"""RLlib's three SAC learning rates; rlserve's SAC has two: ``lr`` (actor and temperature) and
``critic_lr``."""

OBSERVATION_FILTERS = {"MeanStdFilter": True, "NoFilter": False}
"""RLlib's ``observation_filter`` values -> the algorithm's ``normalize_observations`` (neither
given: the algorithm's default; for PPO automatic, on for unbounded Box observations)."""


MEMORY_SETTINGS = ("use_lstm", "max_seq_len", "lstm_cell_size")
"""The recurrent-policy settings (RLlib's names, in ``training()`` or in ``model={...}``): PPO's."""


def _refuse_memory(algo: str, fields: dict[str, Any], where: str) -> None:
    """Drop ``use_lstm=False`` of an algorithm without memory; refuse any other memory setting.

    Raises:
        ConfigError: ``use_lstm=True``, ``max_seq_len`` or ``lstm_cell_size`` given to an
            algorithm other than PPO; the message names the fix.
    """
    if fields.get("use_lstm") is False:
        del fields["use_lstm"]
    given = [name for name in MEMORY_SETTINGS if name in fields]
    if given:
        shown = ", ".join(f"{name}={fields[name]!r}" for name in given)
        raise ConfigError(
            f"{where}: {shown} is not supported by {algo}: only PPO trains recurrent (LSTM) "
            f"policies; use PPOConfig for memory, or drop {', '.join(given)}"
        )


def observation_filter(value: Any) -> bool:
    """RLlib's ``observation_filter`` as ``normalize_observations``.

    Raises:
        ConfigError: Not one of :data:`OBSERVATION_FILTERS`.
    """
    if value not in OBSERVATION_FILTERS:
        raise ConfigError(
            f"observation_filter must be one of {', '.join(OBSERVATION_FILTERS)}, got {value!r}"
        )
    return OBSERVATION_FILTERS[value]


RLLIB_NAMES: dict[str, dict[str, str]] = {
    "ppo": RLLIB_TRAINING_NAMES,
    "dqn": RLLIB_DQN_NAMES,
    "sac": RLLIB_SAC_NAMES,
}
"""Per algorithm, RLlib's names for its settings -> the settings dataclass's fields."""


HOSTED_PPO_DEFAULTS: dict[str, Any] = {}
"""PPO defaults for hosted environments: none differ. One set was chosen on the learning suite
(``bench/suite.py``) for both; what separates the sources, steps one weights version behind from
external clients that act while the learner trains, is handled by ``max_policy_lag`` and the
importance weights, whose defaults are harmless where sampling is synchronous (hosted)."""

HOSTED_DQN_DEFAULTS: dict[str, Any] = {}
"""DQN defaults for hosted environments (the settings' own defaults serve both)."""

HOSTED_SAC_DEFAULTS: dict[str, Any] = {}
"""SAC defaults for hosted environments (the settings' own defaults serve both)."""

HOSTED_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": HOSTED_PPO_DEFAULTS,
    "dqn": HOSTED_DQN_DEFAULTS,
    "sac": HOSTED_SAC_DEFAULTS,
}
"""Per algorithm, the defaults a hosted environment starts from (over its settings' own)."""


def settings_fields(
    algo: str, settings: dict[str, Any], where: str, iteration: bool = False
) -> dict[str, Any]:
    """``settings`` as fields of ``algo``'s settings dataclass.

    A setting may be a field, RLlib's name for one (:data:`RLLIB_NAMES`; for SAC also the
    three learning rates with one value, ``twin_q=True`` and ``target_entropy="auto"``),
    ``model={"fcnet_hiddens": ..., "fcnet_activation": ..., "conv_filters": ...}`` (and for PPO
    ``use_lstm``, ``max_seq_len``, ``lstm_cell_size``, there or as settings), for DQN and SAC
    ``replay_buffer_config={"capacity": N}`` and for DQN a two-point ``lr_schedule`` (or
    ``lr`` given as one).

    Args:
        algo: The algorithm's name.
        settings: The settings as given.
        where: Where they were given, for errors (``training()``, ``policy 'red'``).
        iteration: ``min_env_steps_per_iteration`` is a setting there (listed in errors).

    Raises:
        ConfigError: A name is not one of the algorithm's settings, or has no rlserve
            counterpart; the message lists the settings or names what to set instead.
    """
    entry = algorithm(algo)
    aliases = RLLIB_NAMES.get(entry.name, {})
    known = {f.name for f in dataclasses.fields(entry.settings)}
    fields: dict[str, Any] = {}
    rates = {k: settings[k] for k in SAC_LEARNING_RATES if k in settings}
    for name, value in settings.items():
        if name == "model":
            fields.update(_model(value))
            continue
        if name in MEMORY_SETTINGS:
            fields[name] = value
            continue
        if name == "observation_filter":
            fields["normalize_observations"] = observation_filter(value)
            continue
        if name == "replay_buffer_config" and "buffer_size" in known:
            fields.update(_replay_buffer(value))
            continue
        if "lr_end" in known and (
            name == "lr_schedule" or (name == "lr" and isinstance(value, list | tuple))
        ):
            fields.update(_lr_schedule(name, value))
            continue
        if entry.name == "sac":
            refused = RLLIB_SAC_REFUSED.get(name)
            if refused is not None:
                raise ConfigError(f"{where}: sac setting '{name}' {refused}")
            if name in rates:
                continue
            if name == "twin_q":
                if value is not True:
                    raise ConfigError(
                        f"{where}: twin_q={value!r} is not supported: rlserve's SAC always "
                        "learns twin critics; drop twin_q"
                    )
                continue
            if name == "target_entropy" and value == "auto":
                fields["target_entropy"] = None  # unset: minus the number of action values
                continue
        field_name = aliases.get(name, name)
        if field_name not in known:
            extra = ", min_env_steps_per_iteration" if iteration else ""
            raise ConfigError(
                f"{where} of {entry.name} has no setting '{name}'; the settings are "
                f"{', '.join(sorted(known | set(aliases)))}, model{extra}"
            )
        fields[field_name] = value
    if rates:
        fields.update(_sac_learning_rates(rates, where))
    if entry.name != "ppo":
        _refuse_memory(entry.name, fields, where)
    return fields


def _sac_learning_rates(rates: dict[str, Any], where: str) -> dict[str, Any]:
    """RLlib's ``actor_lr`` and ``alpha_lr`` (both, one value) as ``lr``; ``critic_lr`` as is."""
    fields: dict[str, Any] = {}
    if "critic_lr" in rates:
        fields["critic_lr"] = rates["critic_lr"]
    shared = {k: v for k, v in rates.items() if k != "critic_lr"}
    if shared:
        if len(shared) != 2 or len(set(shared.values())) != 1:
            shown = ", ".join(f"{k}={v}" for k, v in shared.items())
            raise ConfigError(
                f"{where}: rlserve's SAC has one learning rate for the actor and the "
                f"temperature, lr (got {shown}); pass lr=..., or actor_lr and alpha_lr both "
                "with one value"
            )
        fields["lr"] = next(iter(shared.values()))
    return fields


def _replay_buffer(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ConfigError(f"replay_buffer_config must be a dict, got {type(config).__name__}")
    fields: dict[str, Any] = {}
    for key, value in config.items():
        if key == "capacity":
            fields["buffer_size"] = int(value)
        elif key != "type":  # RLlib's buffer class: rlserve has one
            raise ConfigError(
                f"replay_buffer_config setting '{key}' is not supported; use capacity"
            )
    return fields


def _lr_schedule(name: str, schedule: Any) -> dict[str, Any]:
    """RLlib's two-point learning-rate schedule as ``lr``, ``lr_end`` and ``lr_decay_steps``.

    ``[[0, lr], [steps, lr_end]]``: a linear fall over env steps, then flat.
    """
    try:
        (start, first), (steps, last) = ((int(t), float(v)) for t, v in schedule)
    except (TypeError, ValueError):
        start, steps = -1, 0
    if start != 0 or steps <= 0:
        raise ConfigError(
            f"{name}={schedule!r}: rlserve's learning rate falls linearly from one value to "
            "another, [[0, lr], [env_steps, lr_end]]; or set lr, lr_end and lr_decay_steps"
        )
    return {"lr": first, "lr_end": last, "lr_decay_steps": steps}


def _model(model: Any) -> dict[str, Any]:
    if not isinstance(model, dict):
        raise ConfigError(f"model must be a dict, got {type(model).__name__}")
    fields: dict[str, Any] = {}
    for key, value in model.items():
        if key == "fcnet_hiddens":
            fields["hidden"] = tuple(int(v) for v in value)
        elif key == "fcnet_activation":
            fields["activation"] = str(value)
        elif key in MEMORY_SETTINGS:
            fields[key] = value
        elif key == "framestack":
            raise ConfigError(
                f"model framestack={value!r} is not supported (RLlib's old switch for its Atari "
                "preprocessing); set frame_stack=N, the frames per observation (e.g. 4)"
            )
        elif key == "conv_filters":
            if value is None:
                continue  # RLlib's default: the automatic stack
            if not isinstance(value, list | tuple):
                raise ConfigError(
                    f"model conv_filters must be [[filters, kernel, stride], ...], got {value!r}"
                )
            fields["conv_filters"] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        else:
            raise ConfigError(
                f"model setting '{key}' is not supported; use fcnet_hiddens, fcnet_activation, "
                "conv_filters, use_lstm, max_seq_len and lstm_cell_size"
            )
    return fields
