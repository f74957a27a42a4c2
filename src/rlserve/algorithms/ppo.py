"""Proximal Policy Optimisation (clipped objective, GAE, value loss, entropy bonus).

Read top to bottom: the config, the learner that turns fragments into a batch, the loss, the
update. Experience arrives as trajectory fragments from any source; a step collected by weights
more than ``max_policy_lag`` versions old is dropped and counted, a step one version old is
corrected by the importance ratio against its recorded behaviour log-probability (the clip keeps
that bounded). Steps logged with ``log_action`` have no behaviour log-probability; they take the
current policy's, so their first ratio is 1.

The learner is robust on its own against hostile or broken experience (defence in depth behind the
server's validation): a fragment with a malformed shape, a non-finite value, an impossible action
or a magnitude beyond ``max_abs_input`` is excluded whole at ingest and counted (its GAE would
carry the bad value back over every earlier step); the log-ratio is clamped before ``exp``; and a
minibatch whose loss or gradient norm is still non-finite skips its optimiser step and is counted.
Both are reported by a warning on the ``rlserve.learner`` logger at most once per
``WARN_INTERVAL_S`` with the counts since the last one.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlserve.algorithms.advantages import gae
from rlserve.algorithms.base import Learner, WeightsPackage
from rlserve.algorithms.models import ActorCritic
from rlserve.algorithms.ppo_config import PPOSettings
from rlserve.durable import atomic_write_bytes
from rlserve.samples import Fragment
from rlserve.values import indices_within, within

logger = logging.getLogger("rlserve.learner")

# exp(20) is about 4.9e8: far outside any clip range, yet its products stay finite in float32.
LOG_RATIO_LIMIT = 20.0
# Advantages spread less than this are only centred: dividing by a ~0 deviation would blow up.
ADVANTAGE_STD_FLOOR = 1e-6
WARN_INTERVAL_S = 60.0


def clipped_policy_loss(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, clip_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate objective, as a loss to minimise.

    Returns:
        ``(loss, ratio)``: ``mean(max(-A * r, -A * clip(r, 1 - c, 1 + c)))`` with
        ``r = exp(logp - behaviour_logp)``, and ``r`` itself. The log-ratio is clamped to
        ``[-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]`` first, so an absurd behaviour log-probability
        (say -1e30) gives a large finite ratio with no gradient instead of infinity.
    """
    ratio = (logp - behaviour_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)
    return torch.max(unclipped, clipped).mean(), ratio


def normalise_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """Centre advantages and scale them to unit deviation, never dividing by a ~0 deviation.

    A deviation below ``ADVANTAGE_STD_FLOOR`` (all advantages nearly equal) only centres them.
    """
    centred = advantages - advantages.mean()
    return centred / advantages.std().clamp_min(ADVANTAGE_STD_FLOOR)


def value_loss(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """Half the mean squared error between value estimates and returns."""
    return 0.5 * (values - returns).pow(2).mean()


def _as_float32(array: np.ndarray) -> np.ndarray:
    """``array`` itself when float32, else a float32 copy (an overflow to inf is caught later)."""
    if array.dtype == np.float32:
        return array
    with np.errstate(over="ignore", invalid="ignore"):
        return array.astype(np.float32)


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


def resolve_device(name: str) -> torch.device:
    """Map ``auto`` to cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class PPOLearner(Learner):
    """PPO on fragments of external or hosted experience.

    Each update that applies at least one optimiser step advances :attr:`version` by one. An
    update that applies none (every minibatch non-finite, or nothing usable buffered) leaves the
    version and the weights as they were, so a caller may publish the same version again.

    Args:
        observation_space: The policy's observation space.
        action_space: Any space :func:`rlserve.policy.distributions.action_distribution` takes.
        config: Hyper-parameters.
    """

    def __init__(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PPOSettings
    ):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)  # the model's initial weights
        # The minibatch order comes from the learner's own generator, not torch's global one:
        # learners of several policies (or Algorithms) in one process then neither share nor
        # disturb one stream, and a checkpoint restores exactly this learner's.
        self._generator = torch.Generator()
        self._generator.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        self.model = ActorCritic(observation_space, action_space, config.hidden, config.activation)
        self.model.to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, eps=1e-5)
        self._version = 0
        self._buffer: list[Fragment] = []
        self._buffered_steps = 0
        self._counters = {
            "updates": 0,
            "steps_trained": 0,
            "steps_dropped_stale": 0,
            "fragments_excluded_invalid": 0,
            "steps_excluded_invalid": 0,
            "minibatches_skipped_nonfinite": 0,
            "updates_skipped_nonfinite": 0,
        }
        self._warnings = RateLimitedWarning(
            "rlserve learner: experience or updates left out to keep the weights finite"
        )

    @property
    def version(self) -> int:
        """Version of the current weights; unchanged by an update that applied no step."""
        return self._version

    def continue_versions_from(self, version: int) -> None:
        """Number the next update's weights after ``version`` when it is ahead of ours."""
        self._version = max(self._version, version)

    def _fresh_mask(self, fragment: Fragment) -> np.ndarray:
        return fragment.weights_version >= self._version - self.config.max_policy_lag

    def ingest(self, fragments: list[Fragment]) -> None:
        """Buffer fragments; stale steps are counted as dropped at once.

        A fragment that cannot be trained on safely (see :meth:`sanitise`) is excluded whole and
        counted in ``fragments_excluded_invalid`` and ``steps_excluded_invalid``.
        """
        for raw in fragments:
            fragment, problem = self.sanitise(raw)
            if fragment is None:
                rewards = raw.rewards
                ndarray = isinstance(rewards, np.ndarray)
                self._exclude(len(rewards) if ndarray and rewards.ndim == 1 else 0, problem)
                continue
            fresh = int(self._fresh_mask(fragment).sum())
            self._counters["steps_dropped_stale"] += len(fragment) - fresh
            if fresh:
                self._buffer.append(fragment)
                self._buffered_steps += fresh
        self._warnings.flush()

    def _exclude(self, steps: int, problem: str) -> None:
        self._counters["fragments_excluded_invalid"] += 1
        self._counters["steps_excluded_invalid"] += steps
        self._warnings.add("fragments excluded", example=problem)

    def sanitise(self, fragment: Fragment) -> tuple[Fragment | None, str]:
        """Return the fragment in the dtypes trained on, or ``None`` and why it cannot be used.

        Values are checked after the cast: shapes must match the model, observations, rewards
        and Box actions must be finite and within ``max_abs_input``, Discrete actions whole
        choice indices, versions integers. An infinite behaviour log-probability becomes NaN
        (unknown); a finite but absurd one is left to the clamp of the log-ratio.
        """
        names = ("obs", "actions", "rewards", "behaviour_logp", "weights_version")
        try:
            arrays = {name: np.asarray(getattr(fragment, name)) for name in names}
        except (ValueError, TypeError) as exc:
            return None, f"a field is not an array ({exc})"
        steps = arrays["rewards"].shape[0] if arrays["rewards"].ndim == 1 else 0
        if steps == 0:
            return None, f"rewards has shape {arrays['rewards'].shape}, expected a non-empty [T]"
        distribution = self.model.action_distribution
        categorical = distribution.scalar
        expected = {
            "obs": (steps + 1, self.model.obs_dim),
            "actions": (steps,) if categorical else (steps, distribution.action_width),
            "behaviour_logp": (steps,),
            "weights_version": (steps,),
        }
        for name, shape in expected.items():
            if arrays[name].shape != shape:
                return None, f"{name} has shape {arrays[name].shape}, expected {shape}"
        for name, array in arrays.items():
            if array.dtype.kind not in ("iu" if name == "weights_version" else "biuf"):
                return None, f"{name} has dtype {array.dtype}"
        obs = _as_float32(arrays["obs"])
        rewards = _as_float32(arrays["rewards"])
        logp = _as_float32(arrays["behaviour_logp"])
        raw_actions = arrays["actions"]
        if categorical:
            if raw_actions.dtype.kind == "f":
                whole = np.isfinite(raw_actions) & (raw_actions == np.round(raw_actions))
                if not whole.all():
                    return None, f"actions holds {raw_actions[~whole][0]}, not a choice index"
            actions = raw_actions.astype(np.int64, copy=False)
            if not indices_within(actions, self.model.action_dim - 1):
                outside = (actions < 0) | (actions >= self.model.action_dim)
                return None, (
                    f"actions holds {actions[outside][0]}, outside the choices "
                    f"0..{self.model.action_dim - 1}"
                )
        else:
            actions = _as_float32(raw_actions)
            if distribution.kind != "gaussian":  # discrete columns: whole, in range
                problem = distribution.check_actions(actions, steps)
                if problem:
                    return None, problem
        limit = self.config.max_abs_input
        checked = {"obs": obs, "rewards": rewards} | ({} if categorical else {"actions": actions})
        for name, array in checked.items():
            if within(array, limit):
                continue
            finite = np.isfinite(array)
            if not finite.all():
                return None, f"{name} holds {array[~finite][0]}"
            large = np.abs(array) > limit
            return None, (
                f"{name} holds {array[large][0]:.3g}, beyond max_abs_input {limit:.3g} "
                "(raise --ppo-max-abs-input if such values are real)"
            )
        infinite = np.isinf(logp)
        if infinite.any():
            # No action sampled from a policy has probability 0 or infinite density: an
            # infinite value is as unknown as NaN, and takes the current policy's log-prob.
            logp = np.where(infinite, np.float32(np.nan), logp)
        versions = arrays["weights_version"].astype(np.int64, copy=False)
        if (
            obs is fragment.obs
            and actions is fragment.actions
            and rewards is fragment.rewards
            and logp is fragment.behaviour_logp
            and versions is fragment.weights_version
        ):
            return fragment, ""  # already in the trained dtypes (the usual case)
        return (
            dataclasses.replace(
                fragment,
                obs=obs,
                actions=actions,
                rewards=rewards,
                behaviour_logp=logp,
                weights_version=versions,
            ),
            "",
        )

    @property
    def buffered_steps(self) -> int:
        """Fresh steps buffered for the next update."""
        return self._buffered_steps

    @property
    def sample_steps(self) -> int:
        """One batch: PPO samples ``train_batch_size`` steps with each weights version."""
        return self.config.train_batch_size

    def ready(self) -> bool:
        """Whether ``train_batch_size`` fresh steps are buffered."""
        return self._buffered_steps >= self.config.train_batch_size

    def _build_batch(self) -> dict[str, torch.Tensor] | None:
        """Consume the buffer into one batch; ``None`` when no usable step is left in it."""
        fragments, self._buffer, self._buffered_steps = self._buffer, [], 0
        if not fragments:
            return None
        obs_all = torch.as_tensor(np.concatenate([f.obs for f in fragments]), device=self.device)
        with torch.no_grad():
            values_all = self.model.value(obs_all).cpu().numpy()
        parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("obs", "actions", "logp", "advantages", "returns", "values")
        }
        start = 0
        for f in fragments:
            steps = len(f)
            values = values_all[start : start + steps + 1]
            start += steps + 1
            bootstrap = 0.0 if f.terminated else float(values[steps])
            with np.errstate(over="ignore", invalid="ignore"):
                advantages, returns = gae(
                    f.rewards, values[:steps], bootstrap, self.config.gamma, self.config.gae_lambda
                )
            if not (np.isfinite(advantages).all() and np.isfinite(returns).all()):
                self._exclude(steps, "its advantages or returns overflowed float32")
                continue
            mask = self._fresh_mask(f)
            parts["obs"].append(f.obs[:steps][mask])
            parts["actions"].append(f.actions[mask])
            parts["logp"].append(f.behaviour_logp[mask])
            parts["advantages"].append(advantages[mask])
            parts["returns"].append(returns[mask])
            parts["values"].append(values[:steps][mask])
        if not parts["obs"]:
            return None
        tensors = {
            k: torch.as_tensor(np.concatenate(v), device=self.device) for k, v in parts.items()
        }
        unknown = torch.isnan(tensors["logp"])
        if unknown.any():
            with torch.no_grad():
                current, _ = self.model.log_prob_entropy(
                    tensors["obs"][unknown], tensors["actions"][unknown]
                )
            tensors["logp"][unknown] = current
        return tensors

    def update(self) -> dict[str, float]:
        """One PPO update over the buffered steps.

        A minibatch whose loss or gradient norm is non-finite skips its optimiser step (the
        weights and the optimiser state stay as they were) and is counted in
        ``learner/minibatches_skipped_nonfinite``. When no step at all is applied (every
        minibatch skipped, or no usable step buffered) the update is counted in
        ``learner/updates_skipped_nonfinite`` and the version does NOT advance: the weights are
        the ones already published, so clients keep their version and its steps stay fresh.
        The buffer is consumed either way.
        """
        started = time.perf_counter()
        cfg = self.config
        batch = self._build_batch()
        size = 0 if batch is None else int(batch["obs"].shape[0])
        stats: dict[str, list[float]] = {
            "policy_loss": [],
            "value_loss": [],
            "entropy": [],
            "approx_kl": [],
            "clip_frac": [],
        }
        skipped = 0
        for _ in range(cfg.num_epochs if batch is not None else 0):
            assert batch is not None
            order = torch.randperm(size, generator=self._generator).to(self.device)
            for lo in range(0, size, cfg.minibatch_size):
                if not self._minibatch(batch, order[lo : lo + cfg.minibatch_size], stats):
                    skipped += 1
            if (
                cfg.target_kl is not None
                and stats["approx_kl"]
                and stats["approx_kl"][-1] > cfg.target_kl
            ):
                break
        applied = len(stats["policy_loss"])
        self._counters["minibatches_skipped_nonfinite"] += skipped
        if skipped:
            self._warnings.add(
                "minibatch steps skipped for a non-finite loss or gradient", count=skipped
            )
        metrics = {f"learner/{k}": float(np.mean(v)) for k, v in stats.items() if v}
        if applied:
            self._version += 1
            self._counters["updates"] += 1
            self._counters["steps_trained"] += size
            assert batch is not None
            # float64: returns up to max_abs_input square past float32.
            returns = batch["returns"].cpu().numpy().astype(np.float64)
            values = batch["values"].cpu().numpy().astype(np.float64)
            var = float(np.var(returns))
            residual = float(np.var(returns - values))
            explained = float("nan") if var == 0 else 1.0 - residual / var
            metrics["learner/explained_variance"] = explained
        else:
            self._counters["updates_skipped_nonfinite"] += 1
            self._warnings.add("updates that applied no step (version kept)")
        self._warnings.flush()
        metrics.update(
            {
                "learner/batch_steps": float(size),
                "learner/update_seconds": time.perf_counter() - started,
                "learner/weights_version": float(self._version),
            }
        )
        metrics.update({f"learner/{k}": float(v) for k, v in self._counters.items()})
        return metrics

    def _minibatch(
        self, batch: dict[str, torch.Tensor], idx: torch.Tensor, stats: dict[str, list[float]]
    ) -> bool:
        """One gradient step on ``batch[idx]``; False (and no step) when it is not finite."""
        cfg = self.config
        logp, entropy = self.model.log_prob_entropy(batch["obs"][idx], batch["actions"][idx])
        adv = batch["advantages"][idx]
        if cfg.norm_advantages and adv.numel() > 1:
            adv = normalise_advantages(adv)
        policy_loss, ratio = clipped_policy_loss(logp, batch["logp"][idx], adv, cfg.clip_coef)
        v_loss = value_loss(self.model.value(batch["obs"][idx]), batch["returns"][idx])
        entropy_mean = entropy.mean()
        loss = policy_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy_mean
        self.optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            return False
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        if not torch.isfinite(grad_norm):
            # Clipping has already scaled the gradients by a non-finite factor: drop them.
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.optimizer.step()
        with torch.no_grad():
            log_ratio = ratio.log()
            stats["approx_kl"].append(float(((ratio - 1) - log_ratio).mean()))
            stats["clip_frac"].append(float(((ratio - 1).abs() > cfg.clip_coef).float().mean()))
        stats["policy_loss"].append(policy_loss.item())
        stats["value_loss"].append(v_loss.item())
        stats["entropy"].append(entropy_mean.item())
        return True

    def weights(self) -> WeightsPackage:
        """The current actor as named numpy arrays."""
        return WeightsPackage(self._version, self.model.spec(), self.model.actor_arrays())

    def counters(self) -> dict[str, int]:
        """Updates, trained steps and dropped stale steps."""
        return dict(self._counters, version=self._version)

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Write a checkpoint loadable with ``torch.load(weights_only=True)``."""
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "counters": self.counters(),
            "torch_rng": self._generator.get_state(),
            "extra": extra,
        }
        buffer = io.BytesIO()
        torch.save(state, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    def load(self, path: Path) -> dict[str, Any]:
        """Restore model, optimiser, counters and RNG from ``path``."""
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        counters = dict(state["counters"])
        self._version = int(counters.pop("version"))
        self._counters.update({k: int(v) for k, v in counters.items()})
        self._generator.set_state(state["torch_rng"])
        return dict(state["extra"])

    def initialise_from(self, path: Path) -> None:
        """Take the model weights of a checkpoint (``torch.load(weights_only=True)``).

        The optimiser (its settings are this learner's), the counters and the version stay as
        they are.

        Raises:
            ValueError: The checkpoint holds no model of this learner's shape (other spaces,
                ``hidden`` or ``activation``).
        """
        state = torch.load(path, map_location=self.device, weights_only=True)
        try:
            self.model.load_state_dict(state["model"])
        except (KeyError, TypeError, RuntimeError) as exc:
            raise ValueError(
                f"{path} holds no model of this policy's shape (its spaces, hidden sizes and "
                f"activation must be the same): {exc}"
            ) from exc
