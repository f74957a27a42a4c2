"""Proximal Policy Optimisation, decoupled (clipped objective, GAE, value loss, entropy bonus).

Read top to bottom: the learner (ingest, update, checkpoints). Settings:
:class:`~rlserve.learners.ppo_config.PPOSettings` in ``ppo_config.py``, torch-free because the
server reads them. Turning fragments into a training batch (the checks, staleness, proximal
log-probabilities, importance weights, GAE, logged steps): :mod:`rlserve.learners.ppo_batch`.
The losses, the minibatches and the update's metrics: :mod:`rlserve.learners.ppo_losses`.
With memory (``use_lstm``) the batch is one of sequences: :mod:`rlserve.learners.ppo_sequences`.

Experience arrives as trajectory fragments from any source, usually taken by weights one or more
versions older than the learner's (the server keeps acting while the learner trains). A step
collected by weights more than ``max_policy_lag`` versions old is dropped and counted; an update
trains on at most ``max_steps_per_update`` steps, the newest, and counts the rest.

The update is *decoupled* PPO (Hilton et al. 2021, "Batch size-invariance for policy
optimization"). At its start the learner computes each step's log-probability under its current
weights, the *proximal* policy ``pi_prox``, which stays fixed through the update. The ratio that
is clipped is ``pi / pi_prox`` (so it starts at exactly 1, ``approx_kl`` at 0, whatever the lag of
the data), and each step's clipped term is weighted by its importance weight to the behaviour
policy, truncated as V-trace does: ``w = min(pi_prox / pi_behaviour, importance_weight_cap)``.
Advantages are GAE over the steps as taken; with ``truncated_traces`` the lambda trace is cut by
``min(1, pi_prox / pi_behaviour)`` at each step (Retrace's ``c``), so the advantage of an action
is not carried over later actions that ``pi_prox`` would rarely take (off by default: it was
slower on CartPole with the demo's lag, docs/benchmarks.md).

Steps logged with ``log_action`` (``policy_chosen`` false, or an unknown, NaN, behaviour
log-probability) are treated as ``logged_steps`` says: ``exclude`` (the default) leaves them out of
every loss and cuts the lambda trace at them (their rewards still count in the previous step's TD
error); ``value`` does the same but trains the value function on them too, towards the return of
the logged action: ``V`` then learns the value of the mix of policy and logged controller, not the
policy's (nothing unbiased can be had without the logged actions' probabilities), and the bias
reaches the previous step's advantage through ``V`` of the logged step's state; ``bc`` adds a
behaviour-cloning term (``bc_coef`` times their mean negative log-likelihood) to ``value``;
``on_policy`` trains them as if the proximal policy had sampled them (weight 1, trace not cut;
rlserve's treatment before these options). A finite behaviour log-probability sent with a logged
step is ignored, and a logged step is never dropped as stale: no policy sampled it, so the version
that was served when it was logged says nothing about it.

Normalisation (:mod:`rlserve.learners.normalization`). With ``normalize_observations`` (left
unset: on when a Box part of the observation space is unbounded) an update first takes the
buffered steps' observations into the running statistics and freezes them: the proximal
log-probabilities, the values and every gradient step read observations normalised with
the frozen values, which are published with the update's weights (so ``pi_prox`` already has the
new statistics, and the importance weights account for the change from the behaviour policy's).
With ``normalize_rewards`` the buffered rewards also feed the running variance of each episode's
discounted return, and GAE sees the rewards divided by its square root (clipped to
``reward_clip``); the value function learns in those units. With ``normalize_actions`` (the
default) a bounded Box's Gaussian works in units of its bounds: action columns stay in the
space's units and :meth:`ActorCritic.log_prob_entropy` maps them back before the density.

The learner is robust on its own against hostile or broken experience (defence in depth behind the
server's validation): a fragment with a malformed shape, a non-finite value, an impossible action
or a magnitude beyond ``max_abs_input`` is excluded whole at ingest and counted (its GAE would
carry the bad value back over every earlier step); the log-ratio is clamped before ``exp``; and a
minibatch whose loss or gradient norm is still non-finite skips its optimiser step and is counted.
Both are reported by a warning on the ``rlserve.learner`` logger at most once per
``WARN_INTERVAL_S`` (:mod:`rlserve.learners.common`) with the counts since the last one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlserve.learners.base import Learner
from rlserve.learners.common import (
    DeferredAdam,
    RateLimitedWarning,
    finite_step,
    learner_warning,
    read_checkpoint,
    read_weights,
    resolve_device,
    write_checkpoint,
    yield_cpu,
)
from rlserve.learners.normalization import (
    ObservationNormalization,
    normalizes_observations,
    restore_observation_normalization,
)
from rlserve.learners.ppo_batch import build_batch, check_fragment, fresh_mask
from rlserve.learners.ppo_config import ONLY_LOGGED_WARNING, PPOSettings
from rlserve.learners.ppo_losses import (
    ADVANTAGE_STD_FLOOR,
    UpdateStats,
    clipped_policy_loss,
    epoch_minibatches,
    minibatch_indices,
    normalise_advantages,
    value_loss,
)
from rlserve.learners.ppo_sequences import (
    build_sequence_batch,
    chunks_per_minibatch,
    valid_steps,
)
from rlserve.learners.recurrent_models import RecurrentActorCritic, ppo_model
from rlserve.learners.running_stats import ReturnScaler
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment

__all__ = [
    "ADVANTAGE_STD_FLOOR",
    "PPOLearner",
    "PPOSettings",
    "clipped_policy_loss",
    "minibatch_indices",
    "normalise_advantages",
    "value_loss",
]

logger = logging.getLogger("rlserve.learner")


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
        self.model = ppo_model(observation_space, action_space, config)
        self.model.to(self.device)
        self._memory = self.model if isinstance(self.model, RecurrentActorCritic) else None
        """The model when it has memory (``use_lstm``): batches of chunks (``ppo_sequences``)."""
        self.obs_normalization: ObservationNormalization | None = None
        """Observation statistics (``normalize_observations``), frozen per weights version;
        never with an image encoder (it reads raw pixels)."""
        if self.model.image is None and normalizes_observations(
            config.normalize_observations, observation_space, memory=config.use_lstm
        ):
            self.obs_normalization = ObservationNormalization(
                self.model.obs_dim, config.obs_clip, self.model.action_mask
            )
        self.return_scaler: ReturnScaler | None = None
        """Reward scaling by the discounted return's running std (``normalize_rewards``)."""
        # Auto: on with memory. The LSTM is shared by the actor and the critic, so unscaled
        # returns let the value loss's gradients swamp the policy's in it (StatelessCartPole:
        # 150-320 and unsteady at 300k env steps without, 500 by 100k with; docs/learners.md).
        normalize_rewards = config.normalize_rewards
        if normalize_rewards if normalize_rewards is not None else config.use_lstm:
            self.return_scaler = ReturnScaler(config.gamma, config.reward_clip)
        self._reward_divisor = 1.0
        self._parameters = list(self.model.parameters())
        self._adam = DeferredAdam(self._parameters, lr=config.lr, eps=1e-5)
        self._version = 0
        self._buffer: list[Fragment] = []
        self._buffered_steps = 0
        self._counters = {
            "updates": 0,
            "steps_trained": 0,
            "steps_dropped_stale": 0,
            "steps_dropped_cap": 0,
            "steps_logged": 0,
            "fragments_excluded_invalid": 0,
            "steps_excluded_invalid": 0,
            "minibatches_skipped_nonfinite": 0,
            "updates_skipped_nonfinite": 0,
        }
        self._batch_stats: dict[str, float] = {}
        self._warnings = learner_warning()
        self._only_logged = RateLimitedWarning(ONLY_LOGGED_WARNING)
        self._logged_left_out = 0

    @property
    def optimizer(self) -> torch.optim.Adam:
        """Adam over the model's parameters (built at the first gradient step)."""
        return self._adam.optimizer

    def ingest(self, fragments: list[Fragment]) -> None:
        """Buffer fragments; stale steps are counted as dropped at once.

        A fragment that cannot be trained on safely (see :meth:`sanitise`) is excluded whole and
        counted in ``fragments_excluded_invalid`` and ``steps_excluded_invalid``.
        """
        for raw in fragments:
            fragment, problem = self.sanitise(raw)
            if fragment is None:
                self._exclude_fragment(raw, problem)
                continue
            fresh = int(fresh_mask(fragment, self._version, self.config.max_policy_lag).sum())
            self._counters["steps_dropped_stale"] += len(fragment) - fresh
            if fresh:
                self._buffer.append(fragment)
                self._buffered_steps += fresh
        self._warnings.flush()

    def sanitise(self, fragment: Fragment) -> tuple[Fragment | None, str]:
        """The fragment in the dtypes trained on, or ``None`` and why not.

        See :func:`~rlserve.learners.ppo_batch.check_fragment`.
        """
        return check_fragment(fragment, self.model, self.config.max_abs_input)

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
        """Consume the buffer into one batch (:func:`build_batch`); None when nothing is usable.

        Its statistics (lag histogram, behaviour KL...) go to ``_batch_stats``.
        """
        fragments, self._buffer, self._buffered_steps = self._buffer, [], 0
        divisor = None if self.return_scaler is None else self._reward_divisor
        args = (self.config, self._version, self.obs_normalization, divisor, self.device)
        if self._memory is None:
            batch = build_batch(fragments, self.model, *args)
        else:
            batch = build_sequence_batch(fragments, self._memory, *args)
        for steps, problem in batch.excluded:
            self._exclude(steps, problem)
        self._counters["steps_logged"] += batch.steps_logged
        self._logged_left_out = batch.steps_logged if self.config.logged_steps == "exclude" else 0
        self._counters["steps_dropped_cap"] += batch.steps_dropped_cap
        self._batch_stats = batch.stats
        return batch.tensors

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
        self._update_normalization()
        batch = self._build_batch()
        valid = None if batch is None or self._memory is None else batch["valid"]
        size = 0 if batch is None else int(batch["obs"].shape[0] if valid is None else valid.sum())
        stats = UpdateStats(cfg.clip_coef)
        every_step_in_surrogate = batch is not None and bool(
            (batch["policy"] if valid is None else batch["policy"][valid]).all()
        )
        columns = {} if batch is None else self._minibatch_columns(batch, every_step_in_surrogate)
        rows = cfg.minibatch_size if valid is None else chunks_per_minibatch(cfg)
        skipped = 0
        for _ in range(cfg.num_epochs if batch is not None else 0):
            for minibatch in epoch_minibatches(columns, rows, self._generator):
                if not self._minibatch(minibatch, stats, every_step_in_surrogate):
                    skipped += 1
                yield_cpu()
            if cfg.target_kl is not None:
                kl = stats.last_approx_kl()
                if kl is not None and kl > cfg.target_kl:
                    break
        applied = stats.applied
        self._counters["minibatches_skipped_nonfinite"] += skipped
        if skipped:
            self._warnings.add(
                "minibatch steps skipped for a non-finite loss or gradient", count=skipped
            )
        metrics = {f"learner/{k}": v for k, v in stats.means().items()}
        metrics.update({f"learner/{k}": v for k, v in self._batch_stats.items()})
        if applied:
            self._version += 1
            self._counters["updates"] += 1
            self._counters["steps_trained"] += size
            assert batch is not None
            # float64: returns up to max_abs_input square past float32.
            returns_t, values_t = batch["returns"], batch["values"]
            if valid is not None:
                returns_t, values_t = returns_t[valid], values_t[valid]
            returns = returns_t.cpu().numpy().astype(np.float64)
            values = values_t.cpu().numpy().astype(np.float64)
            var = float(np.var(returns))
            residual = float(np.var(returns - values))
            explained = float("nan") if var == 0 else 1.0 - residual / var
            metrics["learner/explained_variance"] = explained
        else:
            only_logged = size == 0 and self._logged_left_out > 0
            self._skip_update(nonfinite=not only_logged)
            if only_logged:
                self._only_logged.add("logged steps left out", count=self._logged_left_out)
                self._only_logged.flush()
        self._warnings.flush()
        if self.return_scaler is not None:
            metrics["learner/reward_scale"] = self._reward_divisor
        metrics.update(
            {
                "learner/batch_steps": float(size),
                "learner/update_seconds": time.perf_counter() - started,
                "learner/weights_version": float(self._version),
            }
        )
        metrics.update({f"learner/{k}": float(v) for k, v in self._counters.items()})
        return metrics

    def _update_normalization(self) -> None:
        """Take the buffered steps into the running statistics and freeze them for the update.

        Observations: every step's (``obs[:T]`` of each buffered fragment); rewards: each
        fragment's, continuing its episode's discounted return. The frozen observation
        statistics are what this update trains with and what its weights are published with.
        """
        if self.obs_normalization is None and self.return_scaler is None:
            return
        for fragment in self._buffer:
            steps = len(fragment)
            if self.obs_normalization is not None:
                self.obs_normalization.observe(fragment.obs[:steps])
            if self.return_scaler is not None:
                ended = bool(fragment.terminated or fragment.truncated)
                key = (fragment.episode_id, fragment.agent_id)
                self.return_scaler.observe(key, fragment.rewards, ended)
        if self.obs_normalization is not None:
            self.obs_normalization.freeze()
        if self.return_scaler is not None:
            self._reward_divisor = self.return_scaler.scale()

    def _minibatch_columns(
        self, batch: dict[str, torch.Tensor], every_step_in_surrogate: bool
    ) -> dict[str, torch.Tensor]:
        """The batch's columns a minibatch reads (``policy`` and ``logged`` only when used)."""
        names = ["obs", "actions", "advantages", "prox_logp", "weights", "returns"]
        if not every_step_in_surrogate:
            names.append("policy")
        if self.config.logged_steps == "bc":
            names.append("logged")
        if self._memory is not None:
            names += ["valid", "state_in"]
        return {name: batch[name] for name in names}

    def _minibatch(
        self,
        minibatch: dict[str, torch.Tensor],
        stats: UpdateStats,
        every_step_in_surrogate: bool = True,
    ) -> bool:
        """One gradient step on ``minibatch`` (rows of the batch's columns); False when not finite.

        The surrogate is decoupled: its ratio is against ``prox_logp`` and each step's term is
        weighted by ``weights``; steps whose ``policy`` is false (logged steps) are left out of
        it, and with ``logged_steps = bc`` the logged ones make the behaviour-cloning term.
        Applied steps' metrics go to ``stats``.
        """
        cfg = self.config
        if self._memory is None:
            obs = minibatch["obs"]
            features = self.model.features(obs)  # one encoder pass for the actor and the critic
        else:
            obs, features, minibatch = valid_steps(self._memory, minibatch)
        logp, entropy = self.model.log_prob_entropy(obs, minibatch["actions"], features)
        adv = minibatch["advantages"]
        prox = minibatch["prox_logp"]
        weights = minibatch["weights"]
        policy_logp = logp
        if not every_step_in_surrogate:
            in_surrogate = minibatch["policy"]
            policy_logp, adv = logp[in_surrogate], adv[in_surrogate]
            prox, weights = prox[in_surrogate], weights[in_surrogate]
        ratio: torch.Tensor | None = None
        if policy_logp.numel():
            if cfg.norm_advantages and adv.numel() > 1:
                adv = normalise_advantages(adv)
            policy_loss, ratio = clipped_policy_loss(policy_logp, prox, adv, cfg.clip_coef, weights)
        else:
            policy_loss = logp.new_zeros(())
        v_loss = value_loss(self.model.value(obs, features), minibatch["returns"])
        entropy_mean = entropy.mean()
        loss = policy_loss.add(v_loss, alpha=cfg.vf_coef).sub(entropy_mean, alpha=cfg.ent_coef)
        bc_loss: torch.Tensor | None = None
        if cfg.logged_steps == "bc":
            logged = minibatch["logged"]
            if bool(logged.any()):
                bc_loss = -logp[logged].mean()
                loss = loss + cfg.bc_coef * bc_loss
        if not finite_step(self.optimizer, loss, self._parameters, cfg.max_grad_norm):
            return False
        stats.add(policy_loss, v_loss, entropy_mean, ratio, bc_loss)
        return True

    def weights(self) -> WeightsPackage:
        """The current actor as named numpy arrays, with its observation statistics."""
        spec = self._with_normalization(self.model.spec())
        return WeightsPackage(self._version, spec, self.model.actor_arrays())

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Write a checkpoint loadable with ``torch.load(weights_only=True)``."""
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self._adam.state_dict(),
            "counters": self.counters(),
            "torch_rng": self._generator.get_state(),
            "extra": extra,
            "normalize_actions": self.model.normalizes_actions,
        }
        if self.obs_normalization is not None:
            state["obs_normalization"] = self.obs_normalization.state()
        if self.return_scaler is not None:
            state["reward_normalization"] = {
                k: torch.from_numpy(v) for k, v in self.return_scaler.state().items()
            }
            state["reward_divisor"] = self._reward_divisor
        write_checkpoint(path, state)

    def load(self, path: Path) -> dict[str, Any]:
        """Restore model, optimiser, counters, RNG and normalisation from ``path``.

        The weights' observation and action normalisation are the checkpoint's (a checkpoint of
        an rlserve without them: none), whatever the settings say (:meth:`_take_normalization`).
        """
        state = read_checkpoint(path, self.device)
        self.model.load_state_dict(state["model"])
        self._take_normalization(state, path)
        if self.return_scaler is not None and "reward_normalization" in state:
            self.return_scaler.load_state(state["reward_normalization"])
            self._reward_divisor = float(state.get("reward_divisor", 1.0))
        self._adam.load_state_dict(state["optimizer"])
        self._restore_counters(state["counters"])
        self._generator.set_state(state["torch_rng"].cpu())  # map_location moved it
        return dict(state["extra"])

    def initialise_from(self, path: Path) -> None:
        """Take the model weights of a checkpoint (``torch.load(weights_only=True)``).

        The optimiser (its settings are this learner's), the counters and the version stay as
        they are.

        Raises:
            ValueError: The checkpoint holds no model of this learner's shape (other spaces,
                ``hidden`` or ``activation``).
        """
        what = (
            "model of this policy's shape (its spaces, hidden sizes, activation and memory "
            "settings must be the same)"
        )
        state = read_weights(path, self.device, self.model.load_state_dict, what)
        self._take_normalization(state, path)

    def _take_normalization(self, state: dict[str, Any], path: Path) -> None:
        """Act with the checkpoint's action and observation normalisation (its weights' own).

        A checkpoint without ``normalize_actions`` predates it and acted in the Box's units;
        one without ``obs_normalization`` read raw observations. A difference from the settings
        is logged as a warning.
        """
        trained_scaled = bool(state.get("normalize_actions", False))
        if trained_scaled != self.model.normalizes_actions:
            was = self.model.normalizes_actions
            self.model.set_action_normalization(trained_scaled)
            if self.model.normalizes_actions != was:
                logger.warning(
                    "%s acts %s: its policy keeps doing so (normalize_actions is ignored for it)",
                    path,
                    "in [-1, 1] units of the Box's bounds"
                    if trained_scaled
                    else "in the Box's own units",
                )
        self.obs_normalization = restore_observation_normalization(
            self.obs_normalization,
            state.get("obs_normalization"),
            self.model.obs_dim,
            str(path),
            self.model.action_mask,
        )
