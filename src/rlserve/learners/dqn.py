"""Deep Q-learning: replay, target network, double-Q, n-step returns, dueling heads, Huber loss.

Read top to bottom: the targets (their bootstrap values clamped to the returns that the rewards
taken in allow, so an over-estimate cannot feed on itself), then the learner. Settings:
:class:`~rlserve.learners.dqn_config.DQNSettings` in ``dqn_config.py``, torch-free because the
server reads them; the network: :class:`~rlserve.learners.models.QNetwork`.
Every step a source sends is stored in the replay buffer (:mod:`rlserve.learners.replay`) as
the action actually taken, whoever chose it (the policy on the server or in a local client, a
hosted runner, ``log_action``) and however old the weights that chose it: off-policy learning
does not care, but its n-step sums stop before an action the policy did not choose (they would
follow the other controller's actions otherwise). Training follows a schedule rather than
consuming what arrived: nothing until ``learning_starts`` transitions are stored (the warm-up),
then rounds of at least ``train_every`` new env steps, each round making ``updates_per_step``
gradient steps per new env step (a fraction carries over) and publishing one weights version.
The published weights carry the exploration epsilon of the schedule at that point
(``ModelSpec.epsilon``), so the server, or a local client's numpy policy, explores with it.

With ``normalize_observations`` the observations go into the replay buffer raw and into the
running statistics as they arrive; each round freezes the statistics, normalises the sampled
observations (and bootstrap observations) with them, and publishes them with its weights.

Like PPO's learner it defends itself against broken experience: a fragment with a malformed
shape, a non-finite value, an impossible action or a magnitude beyond ``max_abs_input`` is
excluded whole and counted; a gradient step whose loss or gradient norm is non-finite is skipped
and counted; a warning goes to the ``rlserve.learner`` logger at most once per minute.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch.nn import functional

from rlserve.learners.base import ReplayLearner
from rlserve.learners.common import (
    DeferredAdam,
    check_replay_fragment,
    finite_step,
    learner_warning,
    read_checkpoint,
    read_weights,
    replay_obs_dtype,
    resolve_device,
    write_checkpoint,
    yield_cpu,
)
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.models import QNetwork
from rlserve.learners.normalization import (
    ObservationNormalization,
    restore_observation_normalization,
)
from rlserve.learners.replay import ReplayBuffer
from rlserve.policy.action_mask import MASKED_LOGIT, illegal_action_problem
from rlserve.policy.encoder_choice import settings_encoder
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment


def q_targets(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    next_q_target: torch.Tensor,
    next_q_online: torch.Tensor | None,
    bounds: tuple[float, float] | None = None,
) -> torch.Tensor:
    """The bootstrapped targets ``reward + discount * Q_target(next_obs, a')``.

    Args:
        rewards: ``[B]`` n-step discounted reward sums.
        discounts: ``[B]`` ``gamma^k``, 0 after a terminal state.
        next_q_target: ``[B, n]`` the target network's values at the bootstrap observations.
        next_q_online: ``[B, n]`` the online network's values there (double-Q: it picks
            ``a' = argmax``, the target network values it), or None (plain DQN:
            ``a' = argmax`` of the target network itself).
        bounds: ``(low, high)`` the bootstrap value is clamped to, or None: no value of any
            state lies outside them (:func:`value_bounds`), so an over-estimate beyond them is
            not fed back into the targets, where it would grow on itself.

    With a legal-move mask both value tensors hold ``MASKED_LOGIT`` for the choices illegal at
    the bootstrap observation (``QNetwork.legal_values``), so ``a'`` is the best legal choice;
    an observation with no legal choice (a finished game) is an end: it bootstraps 0.
    """
    if next_q_online is None:
        bootstrap = next_q_target.max(dim=1).values
    else:
        best = next_q_online.argmax(dim=1, keepdim=True)
        bootstrap = next_q_target.gather(1, best).squeeze(1)
    bootstrap = bootstrap.masked_fill(bootstrap <= MASKED_LOGIT, 0.0)
    if bounds is not None:
        bootstrap = bootstrap.clamp(bounds[0], bounds[1])
    return rewards + discounts * bootstrap


def value_bounds(reward_min: float, reward_max: float, gamma: float) -> tuple[float, float] | None:
    """The range every discounted return lies in when each reward is within the given range.

    An episode may end at any step, so the return lies between ``min(0, reward_min) / (1 -
    gamma)`` and ``max(0, reward_max) / (1 - gamma)``; None when ``gamma`` is 1 (unbounded).
    """
    if gamma >= 1.0:
        return None
    return min(0.0, reward_min) / (1.0 - gamma), max(0.0, reward_max) / (1.0 - gamma)


class DQNLearner(ReplayLearner):
    """DQN on fragments of any source's experience (see the module doc).

    Each update that applies at least one gradient step advances :attr:`version` by one.

    Args:
        observation_space: The policy's observation space.
        action_space: A Discrete space.
        config: Hyper-parameters.
    """

    def __init__(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: DQNSettings
    ):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)  # the network's initial weights
        self.device = resolve_device(config.device)
        self.model = QNetwork(
            observation_space,
            action_space,
            config.hidden,
            config.activation,
            config.dueling,
            settings_encoder(config, observation_space),
        ).to(self.device)
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        self._parameters = list(self.model.parameters())
        self._adam = DeferredAdam(self._parameters, lr=config.lr)
        self.replay = ReplayBuffer(
            config.buffer_size,
            self.model.obs_dim,
            config.gamma,
            config.n_step,
            seed=config.seed,
            through_logged=config.n_step_through_logged,
            obs_dtype=replay_obs_dtype(observation_space),
        )
        self.obs_normalization: ObservationNormalization | None = None
        """Observation statistics (``normalize_observations``): raw observations are stored
        in the replay buffer and normalised when sampled, with the values frozen per round."""
        if config.normalize_observations:
            self.obs_normalization = ObservationNormalization(
                self.model.obs_dim, config.obs_clip, self.model.action_mask
            )
        self._version = 0
        self._new_steps = 0
        """Env steps taken in since the last update (:attr:`buffered_steps`)."""
        self._scheduled_steps = 0
        """Of those, the ones taken in past the warm-up: they earn gradient steps."""
        self._credit = 0.0
        """Fractional gradient steps carried to the next round."""
        self._reward_range: tuple[float, float] | None = None
        """The smallest and largest reward taken in (``clip_q_targets``)."""
        self._counters = {
            "updates": 0,
            "steps_trained": 0,
            "gradient_steps": 0,
            "env_steps_ingested": 0,
            "fragments_excluded_invalid": 0,
            "steps_excluded_invalid": 0,
            "gradient_steps_skipped_nonfinite": 0,
            "updates_skipped_nonfinite": 0,
        }
        self._warnings = learner_warning()

    @property
    def optimizer(self) -> torch.optim.Adam:
        """Adam over the Q-network's parameters (built at the first gradient step)."""
        return self._adam.optimizer

    # -- exploration -------------------------------------------------------------------------

    @property
    def epsilon(self) -> float:
        """The exploration epsilon of the schedule now (after the env steps taken in)."""
        return self.config.epsilon(self._counters["env_steps_ingested"])

    # -- experience --------------------------------------------------------------------------

    def ingest(self, fragments: list[Fragment]) -> None:
        """Store every usable fragment's steps in the replay buffer (staleness is no matter).

        A fragment that cannot be trained on safely (:meth:`sanitise`) is excluded whole and
        counted in ``fragments_excluded_invalid`` and ``steps_excluded_invalid``.
        """
        for raw in fragments:
            fragment, problem = self.sanitise(raw)
            if fragment is None:
                self._exclude_fragment(raw, problem)
                continue
            low, high = float(fragment.rewards.min()), float(fragment.rewards.max())
            if self._reward_range is not None:
                low, high = min(low, self._reward_range[0]), max(high, self._reward_range[1])
            self._reward_range = (low, high)
            if self.obs_normalization is not None:
                self.obs_normalization.observe(fragment.obs[:-1])
            before = self.replay.added
            steps = self.replay.add_fragment(fragment)
            self._counters["env_steps_ingested"] += steps
            self._new_steps += steps
            self._scheduled_steps += max(
                0, before + steps - max(before, self.config.learning_starts)
            )
        self._warnings.flush()

    def sanitise(self, fragment: Fragment) -> tuple[Fragment | None, str]:
        """The fragment with float32 observations and rewards and int64 actions, or why not.

        Shapes must be ``[T + 1, obs_dim]``, ``[T]``, ``[T]``, ``[T]`` with ``T >= 1``; observations
        and rewards finite and within ``max_abs_input``; actions whole choice indices
        (:func:`~rlserve.learners.common.check_replay_fragment`), legal where the observations
        have a legal-move mask.
        """
        checked, problem = check_replay_fragment(
            fragment,
            self.model.obs_dim,
            self.config.max_abs_input,
            "dqn",
            choices=self.model.action_dim,
            obs_dtype=self.replay.obs_dtype,
        )
        mask = self.model.action_mask
        if checked is not None and mask is not None:
            steps = len(checked.actions)
            problem = illegal_action_problem(
                checked.obs[:steps], checked.actions, mask, (self.model.action_dim,)
            )
            if problem:
                return None, problem
        return checked, problem

    @property
    def owed_steps(self) -> int:
        """Env steps past the warm-up whose gradient steps are still to make."""
        return self._scheduled_steps

    @property
    def sample_steps(self) -> int:
        """One training round: ``train_every`` env steps."""
        return self.config.train_every

    def ready(self) -> bool:
        """Past the warm-up, and ``train_every`` env steps taken in since the last update."""
        cfg = self.config
        return (
            len(self.replay) >= max(cfg.learning_starts, cfg.batch_size)
            and self._scheduled_steps >= cfg.train_every
        )

    # -- the update --------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        """One training round: ``updates_per_step`` gradient steps per new env step.

        A round trains on at most ``train_every`` of the scheduled env steps; a backlog (a
        learner process that fell behind its clients) stays scheduled, so :meth:`ready` says
        so again at once and every round publishes its weights, rather than one long round
        leaving the clients on old weights (and an old epsilon) meanwhile.

        A gradient step whose loss or gradient norm is non-finite is skipped (weights and
        optimiser unchanged) and counted in ``learner/gradient_steps_skipped_nonfinite``; when
        no step at all applies the round is counted in ``learner/updates_skipped_nonfinite``
        and the version does not advance.
        """
        started = time.perf_counter()
        cfg = self.config
        scheduled = min(self._scheduled_steps, cfg.train_every)
        planned = scheduled * cfg.updates_per_step + self._credit
        count = math.floor(planned)
        self._credit = planned - count
        self._scheduled_steps -= scheduled
        trained = self._new_steps if self._scheduled_steps == 0 else scheduled
        self._new_steps = max(0, self._new_steps - trained)
        losses: list[float] = []
        q_means: list[float] = []
        skipped = 0
        if self.obs_normalization is not None:
            self.obs_normalization.freeze()  # this round's gradient steps and its weights
        learning_rate = cfg.learning_rate(self._counters["env_steps_ingested"])
        if len(self.replay) >= cfg.batch_size:
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate
            for _ in range(count):
                if self._gradient_step(losses, q_means):
                    self._after_gradient_step()
                else:
                    skipped += 1
                yield_cpu()
        self._counters["gradient_steps_skipped_nonfinite"] += skipped
        if skipped:
            self._warnings.add("gradient steps skipped for a non-finite loss", count=skipped)
        metrics: dict[str, float] = {}
        if losses:
            self._version += 1
            self._counters["updates"] += 1
            self._counters["steps_trained"] += trained
            metrics["learner/q_loss"] = float(np.mean(losses))
            metrics["learner/q_mean"] = float(np.mean(q_means))
        else:
            self._skip_update()
        self._warnings.flush()
        metrics.update(
            {
                "learner/batch_steps": float(trained),
                "learner/epsilon": self.epsilon,
                "learner/lr": learning_rate,
                "learner/replay_size": float(len(self.replay)),
                "learner/update_seconds": time.perf_counter() - started,
                "learner/weights_version": float(self._version),
            }
        )
        metrics.update({f"learner/{k}": float(v) for k, v in self._counters.items()})
        return metrics

    def _gradient_step(self, losses: list[float], q_means: list[float]) -> bool:
        """One step on a sampled batch; False (and no step) when it is not finite."""
        cfg = self.config
        batch = self.replay.sample(cfg.batch_size)
        obs_np, next_obs_np = batch.obs, batch.next_obs
        if self.obs_normalization is not None:
            obs_np = self.obs_normalization.numpy(obs_np)
            next_obs_np = self.obs_normalization.numpy(next_obs_np)
        obs = torch.as_tensor(obs_np, device=self.device)
        actions = torch.as_tensor(batch.actions, device=self.device)
        rewards = torch.as_tensor(batch.rewards, device=self.device)
        discounts = torch.as_tensor(batch.discounts, device=self.device)
        next_obs = torch.as_tensor(next_obs_np, device=self.device)
        bounds = None
        if cfg.clip_q_targets and self._reward_range is not None:
            bounds = value_bounds(*self._reward_range, cfg.gamma)
        with torch.no_grad():
            # Over the next observation's legal choices only (all of them without a mask).
            next_target = self.model.legal_values(next_obs, self.target(next_obs))
            next_online = None
            if cfg.double_q:
                next_online = self.model.legal_values(next_obs, self.model(next_obs))
            targets = q_targets(rewards, discounts, next_target, next_online, bounds)
        q_all = self.model(obs)
        q_taken = q_all.gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = functional.huber_loss(q_taken, targets, delta=cfg.huber_delta)
        if not finite_step(self.optimizer, loss, self._parameters, cfg.max_grad_norm):
            return False
        losses.append(loss.item())
        q_means.append(q_taken.detach().mean().item())
        return True

    def _after_gradient_step(self) -> None:
        self._counters["gradient_steps"] += 1
        if self._counters["gradient_steps"] % self.config.target_update_interval == 0:
            self.sync_target(self.config.target_tau)

    def sync_target(self, tau: float = 1.0) -> None:
        """Move the target towards the online network: ``tau*online + (1-tau)*target``."""
        with torch.no_grad():
            for target, online in zip(
                self.target.parameters(), self.model.parameters(), strict=True
            ):
                if tau >= 1.0:
                    target.copy_(online)
                else:
                    target.lerp_(online, tau)

    # -- publishing and checkpoints ----------------------------------------------------------

    def weights(self) -> WeightsPackage:
        """The Q-network, folded to a plain MLP, with the schedule's epsilon in its spec.

        The spec carries the frozen observation statistics when the learner normalises.
        """
        spec = self._with_normalization(self.model.spec(self.epsilon))
        return WeightsPackage(self._version, spec, self.model.q_arrays())

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Write a checkpoint loadable with ``torch.load(weights_only=True)``.

        With ``checkpoint_replay`` the replay buffer's contents go into it too.
        """
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self._adam.state_dict(),
            "counters": self.counters(),
            "schedule": {
                "new_steps": self._new_steps,
                "scheduled_steps": self._scheduled_steps,
                "credit": self._credit,
                "reward_range": list(self._reward_range or ()),
            },
            "extra": extra,
        }
        if self.obs_normalization is not None:
            state["obs_normalization"] = self.obs_normalization.state()
        if self.config.checkpoint_replay:
            state["replay"] = {k: torch.from_numpy(v) for k, v in self.replay.state().items()}
        write_checkpoint(path, state)

    def load(self, path: Path) -> dict[str, Any]:
        """Restore networks, optimiser, counters, schedule (and the replay buffer, if saved).

        The observation normalisation is the checkpoint's, whatever the settings say
        (:func:`~rlserve.learners.normalization.restore_observation_normalization`).

        A saved replay buffer that does not fit this learner's ``gamma`` / ``n_step`` is left
        out with a warning: the run resumes with an empty buffer.
        """
        state = read_checkpoint(path, self.device)
        self.model.load_state_dict(state["model"])
        self.target.load_state_dict(state["target"])
        self.obs_normalization = restore_observation_normalization(
            self.obs_normalization,
            state.get("obs_normalization"),
            self.model.obs_dim,
            str(path),
            self.model.action_mask,
        )
        self._adam.load_state_dict(state["optimizer"])
        self._restore_counters(state["counters"])
        schedule = state.get("schedule", {})
        self._new_steps = int(schedule.get("new_steps", 0))
        self._scheduled_steps = int(schedule.get("scheduled_steps", 0))
        self._credit = float(schedule.get("credit", 0.0))
        reward_range = [float(v) for v in schedule.get("reward_range", [])]
        self._reward_range = (reward_range[0], reward_range[1]) if len(reward_range) == 2 else None
        self._restore_replay(state.get("replay"), path)
        return dict(state["extra"])

    def initialise_from(self, path: Path) -> None:
        """Take the Q-network weights of a checkpoint (online and target alike).

        Raises:
            ValueError: The checkpoint holds no Q-network of this learner's shape.
        """
        what = (
            "Q-network of this policy's shape (its spaces, hidden sizes, activation and dueling "
            "must be the same)"
        )
        state = read_weights(path, self.device, self.model.load_state_dict, what)
        self.obs_normalization = restore_observation_normalization(
            self.obs_normalization,
            state.get("obs_normalization"),
            self.model.obs_dim,
            str(path),
            self.model.action_mask,
        )
        self.sync_target()
