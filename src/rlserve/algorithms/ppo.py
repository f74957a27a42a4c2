"""Proximal Policy Optimisation (clipped objective, GAE, value loss, entropy bonus).

Read top to bottom: the config, the learner that turns fragments into a batch, the loss, the
update. Experience arrives as trajectory fragments from any source; a step collected by weights
more than ``max_policy_lag`` versions old is dropped and counted, a step one version old is
corrected by the importance ratio against its recorded behaviour log-probability (the clip keeps
that bounded). Steps logged with ``log_action`` have no behaviour log-probability; they take the
current policy's, so their first ratio is 1.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlserve.algorithms.advantages import gae
from rlserve.algorithms.base import Learner, WeightsPackage
from rlserve.algorithms.models import ActorCritic
from rlserve.algorithms.ppo_config import PPOConfig
from rlserve.durable import atomic_write_bytes
from rlserve.samples import Fragment


def clipped_policy_loss(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, clip_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate objective, as a loss to minimise.

    Returns:
        ``(loss, ratio)``: ``mean(max(-A * r, -A * clip(r, 1 - c, 1 + c)))`` with
        ``r = exp(logp - behaviour_logp)``, and ``r`` itself.
    """
    ratio = (logp - behaviour_logp).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)
    return torch.max(unclipped, clipped).mean(), ratio


def value_loss(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """Half the mean squared error between value estimates and returns."""
    return 0.5 * (values - returns).pow(2).mean()


def resolve_device(name: str) -> torch.device:
    """Map ``auto`` to cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class PPOLearner(Learner):
    """PPO on fragments of external or hosted experience.

    Args:
        observation_space: The policy's observation space.
        action_space: Discrete or 1-D Box.
        config: Hyper-parameters.
    """

    def __init__(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any], config: PPOConfig
    ):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        self.model = ActorCritic(observation_space, action_space, config.hidden, config.activation)
        self.model.to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, eps=1e-5)
        self._version = 0
        self._buffer: list[Fragment] = []
        self._buffered_steps = 0
        self._counters = {"updates": 0, "steps_trained": 0, "steps_dropped_stale": 0}

    @property
    def version(self) -> int:
        """Version of the current weights."""
        return self._version

    def continue_versions_from(self, version: int) -> None:
        """Number the next update's weights after ``version`` when it is ahead of ours."""
        self._version = max(self._version, version)

    def _fresh_mask(self, fragment: Fragment) -> np.ndarray:
        return fragment.weights_version >= self._version - self.config.max_policy_lag

    def ingest(self, fragments: list[Fragment]) -> None:
        """Buffer fragments; stale steps are counted as dropped at once."""
        for fragment in fragments:
            fresh = int(self._fresh_mask(fragment).sum())
            self._counters["steps_dropped_stale"] += len(fragment) - fresh
            if fresh:
                self._buffer.append(fragment)
                self._buffered_steps += fresh

    @property
    def buffered_steps(self) -> int:
        """Fresh steps buffered for the next update."""
        return self._buffered_steps

    def ready(self) -> bool:
        """Whether ``train_batch_size`` fresh steps are buffered."""
        return self._buffered_steps >= self.config.train_batch_size

    def _build_batch(self) -> dict[str, torch.Tensor]:
        fragments, self._buffer, self._buffered_steps = self._buffer, [], 0
        obs_all = torch.as_tensor(np.concatenate([f.obs for f in fragments]), device=self.device)
        with torch.no_grad():
            values_all = self.model.value(obs_all).cpu().numpy()
        obs_parts, act_parts, logp_parts, adv_parts, ret_parts, val_parts = [], [], [], [], [], []
        start = 0
        for f in fragments:
            steps = len(f)
            values = values_all[start : start + steps + 1]
            bootstrap = 0.0 if f.terminated else float(values[steps])
            advantages, returns = gae(
                f.rewards, values[:steps], bootstrap, self.config.gamma, self.config.gae_lambda
            )
            mask = self._fresh_mask(f)
            obs_parts.append(f.obs[:steps][mask])
            act_parts.append(f.actions[mask])
            logp_parts.append(f.behaviour_logp[mask])
            adv_parts.append(advantages[mask])
            ret_parts.append(returns[mask])
            val_parts.append(values[:steps][mask])
            start += steps + 1
        batch = {
            "obs": np.concatenate(obs_parts),
            "actions": np.concatenate(act_parts),
            "logp": np.concatenate(logp_parts),
            "advantages": np.concatenate(adv_parts),
            "returns": np.concatenate(ret_parts),
            "values": np.concatenate(val_parts),
        }
        tensors = {k: torch.as_tensor(v, device=self.device) for k, v in batch.items()}
        unknown = torch.isnan(tensors["logp"])
        if unknown.any():
            with torch.no_grad():
                current, _ = self.model.log_prob_entropy(
                    tensors["obs"][unknown], tensors["actions"][unknown]
                )
            tensors["logp"][unknown] = current
        return tensors

    def update(self) -> dict[str, float]:
        """One PPO update over the buffered steps."""
        started = time.perf_counter()
        cfg = self.config
        batch = self._build_batch()
        size = batch["obs"].shape[0]
        stats: dict[str, list[float]] = {
            "policy_loss": [],
            "value_loss": [],
            "entropy": [],
            "approx_kl": [],
            "clip_frac": [],
        }
        for _ in range(cfg.num_epochs):
            order = torch.randperm(size, device=self.device)
            for lo in range(0, size, cfg.minibatch_size):
                idx = order[lo : lo + cfg.minibatch_size]
                logp, entropy = self.model.log_prob_entropy(
                    batch["obs"][idx], batch["actions"][idx]
                )
                adv = batch["advantages"][idx]
                if cfg.norm_advantages and adv.numel() > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss, ratio = clipped_policy_loss(
                    logp, batch["logp"][idx], adv, cfg.clip_coef
                )
                v_loss = value_loss(self.model.value(batch["obs"][idx]), batch["returns"][idx])
                entropy_mean = entropy.mean()
                loss = policy_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy_mean
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                with torch.no_grad():
                    log_ratio = ratio.log()
                    stats["approx_kl"].append(float(((ratio - 1) - log_ratio).mean()))
                    stats["clip_frac"].append(
                        float(((ratio - 1).abs() > cfg.clip_coef).float().mean())
                    )
                stats["policy_loss"].append(policy_loss.item())
                stats["value_loss"].append(v_loss.item())
                stats["entropy"].append(entropy_mean.item())
            if cfg.target_kl is not None and np.mean(stats["approx_kl"][-1:]) > cfg.target_kl:
                break
        returns = batch["returns"].cpu().numpy()
        values = batch["values"].cpu().numpy()
        var = float(np.var(returns))
        explained = float("nan") if var == 0 else 1.0 - float(np.var(returns - values)) / var
        self._version += 1
        self._counters["updates"] += 1
        self._counters["steps_trained"] += size
        metrics = {f"learner/{k}": float(np.mean(v)) for k, v in stats.items()}
        metrics.update(
            {
                "learner/explained_variance": explained,
                "learner/batch_steps": float(size),
                "learner/update_seconds": time.perf_counter() - started,
                "learner/updates": float(self._counters["updates"]),
                "learner/steps_trained": float(self._counters["steps_trained"]),
                "learner/steps_dropped_stale": float(self._counters["steps_dropped_stale"]),
                "learner/weights_version": float(self._version),
            }
        )
        return metrics

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
            "torch_rng": torch.get_rng_state(),
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
        torch.set_rng_state(state["torch_rng"])
        return dict(state["extra"])
