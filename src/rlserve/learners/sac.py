"""Soft Actor-Critic for Box actions: twin critics, automatic entropy tuning, a squashed Gaussian.

Read top to bottom: the losses (plain functions, tested against hand-computed values), then the
learner. Settings: :class:`~rlserve.learners.sac_config.SACSettings` in ``sac_config.py``,
torch-free because the server reads them; the networks: :mod:`rlserve.learners.sac_models`.

Experience arrives as trajectory fragments from any source; every step goes into the replay
buffer (:mod:`rlserve.learners.replay`) as the action actually taken, whoever chose it and however
old the acting weights (SAC learns off-policy), converted from the space's units to the squashed
units ``[-1, 1]`` the networks work in, its n-step sums (``n_step``) joined across an episode's
fragments as DQN's are. Training follows a schedule: a warm-up of ``learning_starts`` steps,
then ``updates_per_step`` gradient steps owed per step taken in, paid in updates of at most
``train_every * updates_per_step`` gradient steps; each update that applies one advances the
weights version.

One gradient step (SB3's order): sample actions at ``obs`` with the current actor; step the
temperature ``alpha = exp(log_alpha)`` towards the target entropy; step both critics towards
``r + discount * (min_i Q'_i(s', a') - alpha * log pi(a'|s'))``, ``a' ~ pi(s')``, with the
target critics ``Q'``; step the actor on ``mean(alpha * log pi(a|s) - min_i Q_i(s, a))``; move
the target critics by ``tau``. The temperature used in a step is the one before its update.

An image observation (a Box of rank 3, alone or in a Dict or Tuple) is read through conv
encoders chosen by the settings ``encoder`` and ``conv_filters`` as PPO's and DQN's are: the actor
has its own, the twin critics share one (:mod:`rlserve.learners.sac_models`), and each is trained
by its own side's loss only.

With ``normalize_observations`` the observations go into the replay buffer raw and into the
running statistics as they arrive; each update freezes the statistics, normalises the sampled
observations (and next observations) with them for actor and critics alike, and publishes them
with its weights.

As PPO's learner, it is robust on its own against hostile or broken experience: a fragment with
a malformed shape, a non-finite value or a magnitude beyond ``max_abs_input`` is excluded whole
and counted, and a gradient step whose critic or temperature loss is not finite applies nothing
and is counted (one whose actor loss, computed after the critics' step, is not finite keeps that
step and skips the actor's, the temperature's and the target's).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlserve.learners.base import ReplayLearner
from rlserve.learners.common import (
    DeferredAdam,
    check_replay_fragment,
    learner_warning,
    read_checkpoint,
    read_weights,
    replay_obs_dtype,
    resolve_device,
    write_checkpoint,
    yield_cpu,
)
from rlserve.learners.normalization import (
    ObservationNormalization,
    restore_observation_normalization,
)
from rlserve.learners.replay import ReplayBuffer
from rlserve.learners.sac_config import SACSettings
from rlserve.learners.sac_models import EnsembleQ, SquashedGaussianActor
from rlserve.policy.encoder_choice import settings_encoder
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment

# -- the maths --------------------------------------------------------------------------------


def soft_q_target(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    next_q: torch.Tensor,
    next_logp: torch.Tensor,
    alpha: torch.Tensor | float,
) -> torch.Tensor:
    """The critics' target: ``r + discount * (min_i next_q[i] - alpha * next_logp)``, ``[B]``.

    Args:
        rewards: ``[B]`` (n-step) rewards.
        discounts: ``[B]`` ``gamma^k``, 0 after a terminal state.
        next_q: ``[n, B]`` target critics' values of the next observation and sampled action.
        next_logp: ``[B]`` log-density of that action.
        alpha: The entropy temperature.
    """
    soft_value = next_q.min(dim=0).values - alpha * next_logp
    return rewards + discounts * soft_value


def critic_loss(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Half the sum over critics of their mean squared error: ``0.5 * sum_i mean((q_i - y)^2)``.

    Args:
        q: ``[n, B]`` critics' values of the taken actions.
        target: ``[B]`` targets (no gradient flows into them).
    """
    return 0.5 * (q - target.detach()).pow(2).mean(dim=1).sum()


def actor_loss(logp: torch.Tensor, q: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """``mean(alpha * logp - min_i q[i])``: maximise the soft value of the actor's actions.

    Args:
        logp: ``[B]`` log-density of reparameterised actions.
        q: ``[n, B]`` critics' values of those actions.
        alpha: The entropy temperature (held fixed).
    """
    return (alpha * logp - q.min(dim=0).values).mean()


def temperature_loss(
    log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float
) -> torch.Tensor:
    """``-mean(log_alpha * (logp + target_entropy))`` with ``logp`` held fixed.

    Its gradient in ``log_alpha`` is ``-(mean(logp) + target_entropy)`` = entropy minus target:
    descending it lowers the temperature when the policy is more random than the target and
    raises it when less.
    """
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


def polyak_update(target: list[torch.Tensor], source: list[torch.Tensor], tau: float) -> None:
    """Move each ``target`` tensor towards its ``source``: ``t <- t + tau * (s - t)``."""
    with torch.no_grad():
        torch._foreach_lerp_(target, source, tau)


def to_squashed(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """``[N, A]`` actions in the space's units as ``[-1, 1]`` squashed values (clipped), float32."""
    scaled = 2.0 * (actions.astype(np.float64) - low) / (high - low) - 1.0
    return np.clip(scaled, -1.0, 1.0).astype(np.float32)


# -- the learner ------------------------------------------------------------------------------


class SACLearner(ReplayLearner):
    """SAC on fragments of external or hosted experience.

    Args:
        observation_space: The policy's observation space.
        action_space: A float Box with finite bounds.
        config: Hyper-parameters.

    Raises:
        UnsupportedSpaceError: The action space is not a bounded float Box.
    """

    def __init__(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: SACSettings
    ):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)  # the networks' initial weights
        # The actor's noise: a CPU generator whatever the device, so a checkpoint's stream
        # resumes on any device (the actor moves the noise to its own).
        self._generator = torch.Generator()
        self._generator.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        image = settings_encoder(config, observation_space)
        self.actor = SquashedGaussianActor(
            observation_space, action_space, config.hidden, config.activation, image
        )
        dist = self.actor.action_distribution
        self.obs_dim = self.actor.obs_dim
        self.action_dim = self.actor.action_dim
        self._low = np.asarray(dist.low, dtype=np.float64)
        self._high = np.asarray(dist.high, dtype=np.float64)
        # The critics' encoder is their own, shared by the twin heads (SB3's layout).
        self.critic = EnsembleQ(
            self.obs_dim, self.action_dim, config.hidden, config.activation, image=image
        )
        self.critic_target = EnsembleQ(
            self.obs_dim, self.action_dim, config.hidden, config.activation, image=image
        )
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(
            torch.tensor(float(np.log(config.initial_alpha)), device=self.device)
        )
        for module in (self.actor, self.critic, self.critic_target):
            module.to(self.device)
        self.target_entropy = (
            float(-self.action_dim) if config.target_entropy is None else config.target_entropy
        )
        self._adams = {
            "actor": DeferredAdam(list(self.actor.parameters()), lr=config.lr),
            "critic": DeferredAdam(list(self.critic.parameters()), lr=config.critic_lr),
            "alpha": DeferredAdam([self.log_alpha], lr=config.lr),
        }
        self.replay = ReplayBuffer(
            config.buffer_size,
            self.obs_dim,
            config.gamma,
            config.n_step,
            action_shape=(self.action_dim,),
            seed=config.seed,
            through_logged=config.n_step_through_logged,
            obs_dtype=replay_obs_dtype(observation_space),
        )
        self.obs_normalization: ObservationNormalization | None = None
        """Observation statistics (``normalize_observations``): raw observations are stored
        in the replay buffer and normalised when sampled, with the values frozen per update."""
        if config.normalize_observations:
            self.obs_normalization = ObservationNormalization(self.obs_dim, config.obs_clip)
        self._version = 0
        self._owed = 0.0  # gradient steps owed by the steps taken in after the warm-up
        self._new_steps = 0  # steps taken in since the last update
        self._counters = {
            "updates": 0,
            "gradient_steps": 0,
            "steps_trained": 0,
            "fragments_excluded_invalid": 0,
            "steps_excluded_invalid": 0,
            "gradient_steps_skipped_nonfinite": 0,
            "updates_skipped_nonfinite": 0,
        }
        self._warnings = learner_warning()

    # -- versions and experience -------------------------------------------------------------

    @property
    def actor_optimizer(self) -> torch.optim.Adam:
        """Adam over the actor's parameters (built at the first gradient step)."""
        return self._adams["actor"].optimizer

    @property
    def critic_optimizer(self) -> torch.optim.Adam:
        """Adam over both critics' parameters, at ``critic_lr``."""
        return self._adams["critic"].optimizer

    @property
    def alpha_optimizer(self) -> torch.optim.Adam:
        """Adam over the log of the entropy temperature."""
        return self._adams["alpha"].optimizer

    @property
    def alpha(self) -> float:
        """The current entropy temperature."""
        return float(self.log_alpha.detach().exp())

    def ingest(self, fragments: list[Fragment]) -> None:
        """Store fragments' steps in the replay buffer and owe their gradient steps.

        Every step is kept, however stale its weights or whoever chose it. A fragment that
        cannot be trained on safely (see :meth:`sanitise`) is excluded whole and counted.
        """
        for raw in fragments:
            fragment, problem = self.sanitise(raw)
            if fragment is None:
                self._exclude_fragment(raw, problem)
                continue
            if self.obs_normalization is not None:
                self.obs_normalization.observe(fragment.obs[: len(fragment)])
            before = self.replay.added
            squashed = to_squashed(fragment.actions, self._low, self._high)
            steps = self.replay.add_fragment(dataclasses.replace(fragment, actions=squashed))
            # Only the steps past the warm-up owe gradient steps.
            warm = max(0, self.replay.added - max(before, self.config.learning_starts))
            self._owed += warm * self.config.updates_per_step
            self._new_steps += steps
        self._warnings.flush()

    def sanitise(self, fragment: Fragment) -> tuple[Fragment | None, str]:
        """Return the fragment in float32, or ``None`` and why it cannot be used.

        Shapes must match the model; observations, rewards and actions must be finite and
        within ``max_abs_input``. Actions outside the Box are kept (the environment clipped
        them; the learner does too). ``policy_chosen`` becomes bool (non-zero: chosen).
        """
        return check_replay_fragment(
            fragment,
            self.obs_dim,
            self.config.max_abs_input,
            "sac",
            action_dim=self.action_dim,
            obs_dtype=self.replay.obs_dtype,
        )

    # -- the schedule ------------------------------------------------------------------------

    @property
    def owed_steps(self) -> int:
        """Env steps whose gradient steps are still to make (owed gradient steps, in env steps)."""
        return math.ceil(self._owed / self.config.updates_per_step)

    @property
    def sample_steps(self) -> int:
        """``train_every``: the env steps of one hand-off between two updates."""
        return self.config.train_every

    def ready(self) -> bool:
        """Whether the warm-up is over and at least one gradient step is owed."""
        return len(self.replay) >= self.config.learning_starts and self._owed >= 1.0

    def update(self) -> dict[str, float]:
        """Pay owed gradient steps, at most ``train_every * updates_per_step`` of them.

        A gradient step whose losses are not finite is skipped (see the module) and counted in
        ``learner/gradient_steps_skipped_nonfinite``; when none applies the version does not
        advance (``learner/updates_skipped_nonfinite``).
        """
        started = time.perf_counter()
        count = min(int(self._owed), self.config.updates_per_hand_off)
        self._owed -= count
        new_steps, self._new_steps = self._new_steps, 0
        stats: dict[str, list[float]] = {
            "critic_loss": [],
            "actor_loss": [],
            "alpha_loss": [],
            "entropy": [],
            "q_mean": [],
        }
        skipped = 0
        if self.obs_normalization is not None:
            self.obs_normalization.freeze()  # this update's gradient steps and its weights
        for _ in range(count if len(self.replay) else 0):
            if not self._gradient_step(stats):
                skipped += 1
            yield_cpu()
        applied = count - skipped if len(self.replay) else 0
        self._counters["gradient_steps_skipped_nonfinite"] += skipped
        if skipped:
            self._warnings.add("gradient steps skipped for a non-finite loss", count=skipped)
        metrics = {f"learner/{k}": float(np.mean(v)) for k, v in stats.items() if v}
        if applied:
            self._version += 1
            self._counters["updates"] += 1
            self._counters["gradient_steps"] += applied
            self._counters["steps_trained"] += new_steps
        else:
            self._skip_update()
        self._warnings.flush()
        metrics.update(
            {
                "learner/alpha": self.alpha,
                "learner/replay_size": float(len(self.replay)),
                "learner/batch_steps": float(new_steps),
                "learner/update_seconds": time.perf_counter() - started,
                "learner/weights_version": float(self._version),
            }
        )
        metrics.update({f"learner/{k}": float(v) for k, v in self._counters.items()})
        return metrics

    def _gradient_step(self, stats: dict[str, list[float]]) -> bool:
        """One SAC gradient step on a sampled batch; False when a loss is not finite."""
        batch = self.replay.sample(self.config.batch_size)
        device = self.device
        obs_np, next_obs_np = batch.obs, batch.next_obs
        if self.obs_normalization is not None:
            obs_np = self.obs_normalization.numpy(obs_np)
            next_obs_np = self.obs_normalization.numpy(next_obs_np)
        obs = torch.as_tensor(obs_np, device=device)
        actions = torch.as_tensor(batch.actions, device=device)
        rewards = torch.as_tensor(batch.rewards, device=device)
        next_obs = torch.as_tensor(next_obs_np, device=device)
        discounts = torch.as_tensor(batch.discounts, device=device)

        pi_actions, pi_logp = self.actor.sample(obs, self._generator)
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_logp = self.actor.sample(next_obs, self._generator)
            next_q = self.critic_target(next_obs, next_actions)
            target = soft_q_target(rewards, discounts, next_q, next_logp, alpha)
        q = self.critic(obs, actions)
        q_loss = critic_loss(q, target)
        alpha_loss = temperature_loss(self.log_alpha, pi_logp, self.target_entropy)
        if not (torch.isfinite(q_loss) and torch.isfinite(alpha_loss)):
            return False
        # The actor's loss reads the critics after their step, without training them.
        self.critic_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        self.critic_optimizer.step()
        self.critic.requires_grad_(False)
        try:
            pi_q = self.critic(obs, pi_actions)
            pi_loss = actor_loss(pi_logp, pi_q, alpha)
            finite = bool(torch.isfinite(pi_loss))
            if finite:
                self.actor_optimizer.zero_grad(set_to_none=True)
                pi_loss.backward()
                self.actor_optimizer.step()
        finally:
            self.critic.requires_grad_(True)
        if not finite:
            return False
        if self.config.learn_alpha:
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()
        polyak_update(
            list(self.critic_target.parameters()),
            list(self.critic.parameters()),
            self.config.tau,
        )
        stats["critic_loss"].append(q_loss.item())
        stats["actor_loss"].append(pi_loss.item())
        stats["alpha_loss"].append(alpha_loss.item())
        stats["entropy"].append(-float(pi_logp.detach().mean()))
        stats["q_mean"].append(float(q.detach().mean()))
        return True

    # -- publishing and checkpoints ----------------------------------------------------------

    def weights(self) -> WeightsPackage:
        """The current actor as named numpy arrays (a ``squashed_gaussian`` model spec).

        The spec carries the frozen observation statistics when the learner normalises.
        """
        spec = self._with_normalization(self.actor.spec())
        return WeightsPackage(self._version, spec, self.actor.actor_arrays())

    def _model_state(self) -> dict[str, Any]:
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
        }

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Write a checkpoint loadable with ``torch.load(weights_only=True)``.

        With ``checkpoint_replay`` the replay buffer's contents go in too (as tensors), so a
        resumed run trains on the same experience.
        """
        state: dict[str, Any] = {
            "model": self._model_state(),
            "optimizers": {name: adam.state_dict() for name, adam in self._adams.items()},
            "counters": self.counters(),
            "schedule": {"owed": self._owed, "new_steps": self._new_steps},
            "torch_rng": self._generator.get_state(),
            "extra": extra,
        }
        if self.obs_normalization is not None:
            state["obs_normalization"] = self.obs_normalization.state()
        if self.config.checkpoint_replay:
            state["replay"] = {
                name: torch.from_numpy(np.ascontiguousarray(array))
                for name, array in self.replay.state().items()
            }
        write_checkpoint(path, state)

    def load(self, path: Path) -> dict[str, Any]:
        """Restore networks, optimisers, counters, schedule, RNG and replay from ``path``.

        The observation normalisation is the checkpoint's, whatever the settings say. A saved
        replay buffer that does not fit this learner's ``gamma`` / ``n_step`` is left out with a
        warning: the run resumes with an empty buffer.
        """
        state = read_checkpoint(path, self.device)
        self._load_model(state["model"])
        self._take_normalization(state, path)
        for name, adam in self._adams.items():
            adam.load_state_dict(state["optimizers"][name])
        self._restore_counters(state["counters"])
        self._owed = float(state["schedule"]["owed"])
        self._new_steps = int(state["schedule"]["new_steps"])
        self._generator.set_state(state["torch_rng"].cpu())  # map_location moved it
        self._restore_replay(state.get("replay"), path)
        return dict(state["extra"])

    def _load_model(self, model: dict[str, Any]) -> None:
        self.actor.load_state_dict(model["actor"])
        self.critic.load_state_dict(model["critic"])
        self.critic_target.load_state_dict(model["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(model["log_alpha"])

    def initialise_from(self, path: Path) -> None:
        """Take the networks and temperature of a checkpoint; the rest stays this learner's.

        Raises:
            ValueError: The checkpoint holds no SAC model of this learner's shape.
        """
        what = (
            "SAC model of this policy's shape (its spaces, hidden sizes, activation and image "
            "encoder must be the same)"
        )
        state = read_weights(path, self.device, self._load_model, what)
        self._take_normalization(state, path)

    def _take_normalization(self, state: dict[str, Any], path: Path) -> None:
        """Take the checkpoint's observation normalisation, its networks' own.

        See :func:`~rlserve.learners.normalization.restore_observation_normalization`.
        """
        self.obs_normalization = restore_observation_normalization(
            self.obs_normalization, state.get("obs_normalization"), self.obs_dim, str(path)
        )
