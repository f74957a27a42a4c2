"""PPO's experience: a fragment checked as it arrives, then the buffered ones as one training batch.

:func:`check_fragment` takes a fragment as received and returns it in the dtypes trained on, or
says why it cannot be trained on (the learner excludes it whole and counts it). :func:`build_batch`
turns the fragments buffered since the last update into the batch the update trains on: it drops
the steps of weights more than ``max_policy_lag`` versions old (:func:`fresh_mask`; a logged step
is never stale), computes each step's log-probability under the learner's weights (the proximal
policy) and its truncated importance weight to the behaviour policy, runs GAE with the learner's
value network (the lambda trace cut at logged steps, and with ``truncated_traces`` by
Retrace's coefficients), leaves logged steps out as ``logged_steps`` says, and keeps at most
``max_steps_per_update`` steps, the newest. :mod:`rlserve.learners.ppo` says why.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from rlserve.learners.advantages import gae
from rlserve.learners.common import (
    as_float32,
    choice_indices,
    dtype_problem,
    fragment_arrays,
    magnitude_problem,
    shape_problem,
)
from rlserve.learners.models import ActorCritic
from rlserve.learners.normalization import ObservationNormalization
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.running_stats import scale_rewards
from rlserve.policy.action_mask import illegal_action_problem, part_sizes
from rlserve.protocol.fragment import Fragment

# exp(20) is about 4.9e8: far outside any clip range, yet its products stay finite in float32.
LOG_RATIO_LIMIT = 20.0


def logged_mask(fragment: Fragment) -> np.ndarray:
    """``[T]`` True at the fragment's logged steps (not chosen by the policy, or NaN logp)."""
    return _logged(fragment.policy_chosen, fragment.behaviour_logp)


def fresh_mask(fragment: Fragment, version: int, max_policy_lag: int) -> np.ndarray:
    """``[T]`` True at the steps recent enough to train on.

    A logged step is never stale: no policy sampled it.
    """
    return _fresh(fragment.weights_version, logged_mask(fragment), version, max_policy_lag)


def _logged(policy_chosen: np.ndarray, behaviour_logp: np.ndarray) -> np.ndarray:
    return ~policy_chosen | np.isnan(behaviour_logp)


def _fresh(versions: np.ndarray, logged: np.ndarray, version: int, lag: int) -> np.ndarray:
    return (versions >= version - lag) | logged


def importance_log_ratio(proximal_logp: np.ndarray, behaviour_logp: np.ndarray) -> np.ndarray:
    """``log(pi_prox / pi_behaviour)`` per step, clamped to ``[-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]``.

    NaN where the behaviour log-probability is unknown (NaN).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        return np.clip(proximal_logp - behaviour_logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def importance_weights(log_ratio: np.ndarray, cap: float) -> np.ndarray:
    """Truncated importance weights ``min(exp(log_ratio), cap)`` (V-trace's ``rho``), float32."""
    return np.minimum(np.exp(log_ratio), np.float32(cap)).astype(np.float32)


def trace_coefficients(log_ratio: np.ndarray) -> np.ndarray:
    """Retrace's trace coefficients ``min(1, exp(log_ratio))``, float32."""
    return np.minimum(np.exp(log_ratio), np.float32(1.0)).astype(np.float32)


def behaviour_kl(log_ratio: np.ndarray) -> float:
    """Estimate of ``KL(pi_behaviour || pi_prox)`` from steps sampled by the behaviour policy.

    The mean of ``(rho - 1) - log rho`` with ``rho = pi_prox / pi_behaviour`` (non-negative per
    step; NaN when there is no step).
    """
    if log_ratio.size == 0:
        return float("nan")
    log_ratio = log_ratio.astype(np.float64)
    return float(np.mean(np.expm1(log_ratio) - log_ratio))


def check_fragment(
    fragment: Fragment, model: ActorCritic, limit: float
) -> tuple[Fragment | None, str]:
    """Return the fragment in the dtypes trained on, or ``None`` and why it cannot be used.

    Values are checked after the cast: shapes must match the model, observations, rewards
    and Box actions must be finite and within ``limit`` (``max_abs_input``), Discrete actions
    whole choice indices (legal ones, with a legal-move mask), versions integers. An infinite
    behaviour log-probability becomes NaN (unknown); a finite but absurd one is left to the clamp
    of the log-ratio. A policy with memory needs ``state_in`` (:func:`checked_state_in`), finite
    and within ``limit``.
    ``policy_chosen`` becomes bool (non-zero: chosen).
    """
    names = ("obs", "actions", "rewards", "behaviour_logp", "policy_chosen", "weights_version")
    arrays, problem = fragment_arrays(fragment, names)
    if arrays is None:
        return None, problem
    steps = arrays["rewards"].shape[0]
    distribution = model.action_distribution
    categorical = distribution.scalar
    expected = {
        "obs": (steps + 1, model.obs_dim),
        "actions": (steps,) if categorical else (steps, distribution.action_width),
        "behaviour_logp": (steps,),
        "policy_chosen": (steps,),
        "weights_version": (steps,),
    }
    problem = shape_problem(arrays, expected) or dtype_problem(arrays, {"weights_version"})
    if problem:
        return None, problem
    obs = as_float32(arrays["obs"])
    rewards = as_float32(arrays["rewards"])
    logp = as_float32(arrays["behaviour_logp"])
    if categorical:
        actions, problem = choice_indices(arrays["actions"], model.action_dim)
        if actions is None:
            return None, problem
    else:
        actions = as_float32(arrays["actions"])
        if distribution.kind != "gaussian":  # discrete columns: whole, in range
            problem = distribution.check_actions(actions, steps)
            if problem:
                return None, problem
    if model.action_mask is not None:
        sizes = part_sizes(distribution.parts)
        problem = illegal_action_problem(obs[:steps], actions, model.action_mask, sizes)
        if problem:
            return None, problem
    state_in, problem = checked_state_in(fragment, getattr(model, "state_size", 0))
    if problem:
        return None, problem
    checked = {"obs": obs, "rewards": rewards} | ({} if categorical else {"actions": actions})
    if state_in is not None:
        checked["state_in"] = state_in
    problem = magnitude_problem(checked, limit, "ppo")
    if problem:
        return None, problem
    infinite = np.isinf(logp)
    if infinite.any():
        # No action sampled from a policy has probability 0 or infinite density: an
        # infinite value is as unknown as NaN, and takes the current policy's log-prob.
        logp = np.where(infinite, np.float32(np.nan), logp)
    versions = arrays["weights_version"].astype(np.int64, copy=False)
    chosen = arrays["policy_chosen"]
    if chosen.dtype != np.bool_:
        chosen = chosen != 0
    if (
        obs is fragment.obs
        and actions is fragment.actions
        and rewards is fragment.rewards
        and logp is fragment.behaviour_logp
        and versions is fragment.weights_version
        and chosen is fragment.policy_chosen
        and state_in is fragment.state_in
    ):
        return fragment, ""  # already in the trained dtypes (the usual case)
    replaced = dataclasses.replace(
        fragment,
        obs=obs,
        actions=actions,
        rewards=rewards,
        behaviour_logp=logp,
        policy_chosen=chosen,
        weights_version=versions,
        state_in=state_in,
    )
    return replaced, ""


def checked_state_in(fragment: Fragment, state_size: int) -> tuple[np.ndarray | None, str]:
    """The fragment's ``state_in`` as float32 ``[state_size]`` (None without memory), or why not.

    A policy without memory (``state_size`` 0) ignores any ``state_in``; one with memory needs
    it: the learner replays the fragment's observations from it.
    """
    if state_size == 0:
        return fragment.state_in, ""
    if fragment.state_in is None:
        return None, (
            f"it has no state_in, and this policy has memory (use_lstm): send each fragment "
            f"with the [{state_size}] recurrent state before its first step"
        )
    try:
        state = as_float32(np.asarray(fragment.state_in))
    except (TypeError, ValueError) as exc:
        return None, f"state_in is not an array ({exc})"
    if state.shape != (state_size,):
        return None, f"state_in has shape {list(state.shape)}, expected [{state_size}]"
    return state, ""


@dataclasses.dataclass
class TrainingBatch:
    """One update's batch, and what building it left out.

    Attributes:
        tensors: Per step: ``obs``, ``actions``, ``prox_logp`` (the proximal policy's
            log-probability), ``weights`` (truncated importance weights to the behaviour
            policy), ``advantages``, ``returns``, ``values``, ``policy`` (whether the step is in
            the surrogate) and ``logged`` (a logged step); None when no usable step is left.
        stats: The batch's statistics (lag histogram, behaviour KL, mean importance weight).
        steps_logged: Logged steps among the fresh ones.
        steps_dropped_cap: Steps over ``max_steps_per_update`` left out (the oldest).
        excluded: ``(steps, why)`` of each fragment left out whole (GAE overflowed float32).
    """

    tensors: dict[str, torch.Tensor] | None = None
    stats: dict[str, float] = dataclasses.field(default_factory=dict)
    steps_logged: int = 0
    steps_dropped_cap: int = 0
    excluded: list[tuple[int, str]] = dataclasses.field(default_factory=list)


STEP_COLUMNS = (
    "obs",
    "actions",
    "prox_logp",
    "weights",
    "advantages",
    "returns",
    "values",
    "policy",
    "logged",
    "log_ratio",
    "versions",
)
"""The per-step columns :func:`fragment_steps` gives for each fragment."""


def fragment_steps(
    f: Fragment,
    obs_rows: np.ndarray,
    values: np.ndarray,
    prox: np.ndarray,
    cfg: PPOSettings,
    version: int,
    reward_divisor: float | None,
    batch: TrainingBatch,
) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """One fragment's columns (:data:`STEP_COLUMNS`, ``[T]`` each) and which steps to train on.

    Args:
        f: A fragment checked by :func:`check_fragment`.
        obs_rows: ``[T, D]`` its observations as the networks read them (normalised).
        values: ``[T + 1]`` the value network's estimates, the bootstrap value last.
        prox: ``[T]`` the proximal policy's log-probabilities of its actions.
        cfg: The learner's settings.
        version: The learner's weights version (staleness).
        reward_divisor: What rewards are divided by before GAE, if any.
        batch: Where a logged step count goes, and the fragment if it must be left out.

    Returns:
        ``(columns, mask)``, ``mask`` True at the steps that go into the losses (fresh, and not
        logged steps left out by ``logged_steps``); None when its GAE overflowed float32 (the
        fragment is recorded in ``batch.excluded``).
    """
    steps = len(f)
    logged = logged_mask(f)
    if cfg.logged_steps == "on_policy":
        log_ratio = importance_log_ratio(prox, np.where(logged, prox, f.behaviour_logp))
        sampled = np.ones(steps, dtype=bool)
    else:
        log_ratio = np.where(logged, 0.0, importance_log_ratio(prox, f.behaviour_logp))
        sampled = ~logged
    traces: np.ndarray | None = None
    if cfg.truncated_traces:
        traces = trace_coefficients(log_ratio)
    if cfg.logged_steps != "on_policy" and logged.any():
        traces = np.where(logged, 0.0, 1.0 if traces is None else traces)
    bootstrap = 0.0 if f.terminated else float(values[steps])
    rewards = f.rewards
    if reward_divisor is not None:
        rewards = scale_rewards(rewards, reward_divisor, cfg.reward_clip)
    with np.errstate(over="ignore", invalid="ignore"):
        advantages, returns = gae(
            rewards, values[:steps], bootstrap, cfg.gamma, cfg.gae_lambda, traces
        )
    if not (np.isfinite(advantages).all() and np.isfinite(returns).all()):
        batch.excluded.append((steps, "its advantages or returns overflowed float32"))
        return None
    mask = fresh_mask(f, version, cfg.max_policy_lag)
    batch.steps_logged += int((logged & mask).sum())
    if cfg.logged_steps == "exclude":
        mask = mask & ~logged
    columns = {
        "obs": obs_rows,
        "actions": f.actions,
        "prox_logp": prox,
        "weights": importance_weights(log_ratio, cfg.importance_weight_cap),
        "advantages": advantages,
        "returns": returns,
        "values": values[:steps],
        "policy": sampled,
        "logged": logged,
        "log_ratio": log_ratio,
        "versions": f.weights_version,
    }
    return columns, mask


def build_batch(
    fragments: list[Fragment],
    model: ActorCritic,
    cfg: PPOSettings,
    version: int,
    obs_normalization: ObservationNormalization | None,
    reward_divisor: float | None,
    device: torch.device,
) -> TrainingBatch:
    """Turn checked fragments into one update's batch (see the module doc).

    A backlog past the step cap (a learner behind its clients, or one that replays the log
    after a restart) costs the forward passes and GAE of only the fragments that hold one of
    the steps kept (:func:`fragments_within_cap`), not of every buffered step; the batch is
    the same. Should one of those fragments be left out (its GAE overflowed), the cap would
    choose among the others too, so the batch is then built from every fragment. (The other
    fragments' GAE is never run: were one of them to overflow, its steps are counted as over
    the cap, not as excluded.)

    Args:
        fragments: The buffered fragments, each checked by :func:`check_fragment`.
        model: The learner's networks, at the start of the update (the proximal policy).
        cfg: The learner's settings.
        version: The learner's weights version (staleness and the lag histogram).
        obs_normalization: The frozen observation statistics the networks read with, if any.
        reward_divisor: What rewards are divided by before GAE (``normalize_rewards``), if any.
        device: Where the networks and the batch's tensors are.
    """
    args = (model, cfg, version, obs_normalization, reward_divisor, device)
    within = fragments_within_cap(fragments, cfg, version)
    if within is not None:
        kept, logged_left_out, steps_left_out = within
        batch = batch_of_fragments(kept, *args)
        if not batch.excluded:
            batch.steps_logged += logged_left_out
            batch.steps_dropped_cap += steps_left_out
            return batch
    return batch_of_fragments(fragments, *args)


def fragments_within_cap(
    fragments: list[Fragment], cfg: PPOSettings, version: int
) -> tuple[list[Fragment], int, int] | None:
    """The fragments holding one of the ``step_cap`` steps an update keeps, when that is not all.

    The steps kept are chosen as :func:`build_batch` chooses them (:func:`newest_steps` over
    the trainable steps: fresh, and not logged ones left out), from the fragments alone.

    Returns:
        None when every fragment holds a kept step; else ``(fragments, logged, left_out)``:
        those that do, in order; the fresh logged steps of the others (``steps_logged``); and
        their trainable steps (over the cap).
    """
    cap = cfg.step_cap
    lengths = np.fromiter((len(f) for f in fragments), np.int64, len(fragments))
    if lengths.sum() <= cap:
        return None
    # The masks of every step at once: a backlog has thousands of fragments.
    versions = np.concatenate([f.weights_version for f in fragments])
    logged = _logged(
        np.concatenate([f.policy_chosen for f in fragments]),
        np.concatenate([f.behaviour_logp for f in fragments]),
    )
    fresh = _fresh(versions, logged, version, cfg.max_policy_lag)
    trainable = fresh & ~logged if cfg.logged_steps == "exclude" else fresh
    owners = np.repeat(np.arange(len(fragments)), lengths)
    keep = newest_steps(versions[trainable], cap)
    if keep is None:
        return None
    holds = np.zeros(len(fragments), dtype=bool)
    holds[owners[trainable][keep]] = True
    if holds.all():
        return None
    left_out = ~holds
    logged_counts = np.bincount(owners[fresh & logged], minlength=len(fragments))
    trainable_counts = np.bincount(owners[trainable], minlength=len(fragments))
    return (
        [f for f, held in zip(fragments, holds.tolist(), strict=True) if held],
        int(logged_counts[left_out].sum()),
        int(trainable_counts[left_out].sum()),
    )


def batch_of_fragments(
    fragments: list[Fragment],
    model: ActorCritic,
    cfg: PPOSettings,
    version: int,
    obs_normalization: ObservationNormalization | None,
    reward_divisor: float | None,
    device: torch.device,
) -> TrainingBatch:
    """:func:`build_batch` over every one of ``fragments`` (none left out for the cap first)."""
    batch = TrainingBatch()
    if not fragments:
        return batch
    obs_np = np.concatenate([f.obs for f in fragments])
    if obs_normalization is not None:
        obs_np = obs_normalization.numpy(obs_np)
    obs_all = torch.as_tensor(obs_np, device=device)
    # Rows of obs_all that are steps: every row but the last of each fragment.
    step_rows = np.ones(obs_all.shape[0], dtype=bool)
    step_rows[np.cumsum([len(f) + 1 for f in fragments]) - 1] = False
    actions_all = torch.as_tensor(np.concatenate([f.actions for f in fragments]), device=device)
    with torch.no_grad():
        features_all = model.features(obs_all)
        values_all = model.value(obs_all, features_all).cpu().numpy()
        steps_only = torch.as_tensor(step_rows, device=device)
        prox_all, _ = model.log_prob_entropy(
            obs_all[steps_only], actions_all, features_all[steps_only]
        )
    prox_np = prox_all.cpu().numpy()
    parts: dict[str, list[np.ndarray]] = {k: [] for k in STEP_COLUMNS}
    start = step = 0
    for f in fragments:
        steps = len(f)
        values = values_all[start : start + steps + 1]
        obs_rows = obs_np[start : start + steps]
        prox = prox_np[step : step + steps]
        start += steps + 1
        step += steps
        found = fragment_steps(f, obs_rows, values, prox, cfg, version, reward_divisor, batch)
        if found is None:
            continue
        columns, mask = found
        for name, column in columns.items():
            parts[name].append(column[mask])
    if not parts["obs"]:
        return batch
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    version_of = arrays.pop("versions")
    keep = newest_steps(version_of, cfg.step_cap)
    if keep is not None:
        batch.steps_dropped_cap = version_of.shape[0] - keep.shape[0]
        arrays = {k: v[keep] for k, v in arrays.items()}
        version_of = version_of[keep]
    if version_of.shape[0] == 0:
        return batch
    log_ratio = arrays.pop("log_ratio")
    record_stats(batch, version, version_of, log_ratio, arrays)
    batch.tensors = {k: torch.as_tensor(v, device=device) for k, v in arrays.items()}
    return batch


def newest_steps(version_of: np.ndarray, cap: int) -> np.ndarray | None:
    """The positions of the ``cap`` newest steps, in order (None: all of them are kept).

    Newest by weights version, then by arrival.
    """
    if version_of.shape[0] <= cap:
        return None
    order = np.lexsort((np.arange(version_of.shape[0]), version_of))
    return np.sort(order[-cap:])


def record_stats(
    batch: TrainingBatch,
    version: int,
    version_of: np.ndarray,
    log_ratio: np.ndarray,
    columns: dict[str, np.ndarray],
) -> None:
    """Put the trained steps' lag histogram, behaviour KL and mean importance weight in ``batch``.

    ``version_of``, ``log_ratio`` and ``columns`` (``logged``, ``weights``, ``policy``) hold
    the trained steps only.
    """
    sampled = ~columns["logged"]
    if sampled.any():
        lag = np.maximum(version - version_of[sampled], 0)
        batch.stats = {
            "lag_0": float(np.mean(lag == 0)),
            "lag_1": float(np.mean(lag == 1)),
            "lag_2": float(np.mean(lag == 2)),
            "lag_3plus": float(np.mean(lag >= 3)),
            "behaviour_kl": behaviour_kl(log_ratio[sampled]),
        }
    policy_weights = columns["weights"][columns["policy"]]
    if policy_weights.size:
        batch.stats["importance_weight_mean"] = float(policy_weights.mean())
