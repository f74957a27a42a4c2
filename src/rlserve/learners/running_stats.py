"""Running statistics a learner keeps to normalise what it trains on: observations and rewards.

:class:`RunningMeanStd` holds the count, mean and (population) variance of every vector it has
seen, in float64, and takes each new batch with the parallel update of Chan, Golub and LeVeque
(1979): merging the batch's own count, mean and variance, which stays accurate however many
batches come and however large the values' offset from zero (no running sum of squares).

:class:`ReturnScaler` is Stable-Baselines3's ``VecNormalize`` reward scaling: it follows each
episode's discounted return ``R_t = gamma * R_(t-1) + r_t`` (reset when the episode ends), keeps
the running variance of those returns, and divides rewards by their standard deviation, so the
value function sees targets of order one whatever the reward's units.

Both save to plain float64 arrays (:meth:`RunningMeanStd.state`), which a checkpoint stores as
tensors and loads with ``torch.load(weights_only=True)``. Needs numpy only.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

NORM_EPSILON = 1e-8
"""Added to a variance before its square root: ``std = sqrt(var + NORM_EPSILON)``
(Stable-Baselines3's ``VecNormalize`` value), so a constant input divides by 1e-4, not 0."""

MAX_TRACKED_EPISODES = 65_536
"""Most episodes whose running discounted return :class:`ReturnScaler` keeps at once; beyond
it the least recently seen is forgotten (an episode that never ended), and starts again from 0
if it comes back."""


class RunningMeanStd:
    """Count, mean and variance of the vectors seen so far, per element, in float64.

    Before any data the mean is 0 and the variance 1 (normalising is then the identity).

    Args:
        shape: The shape of one vector (``()`` for scalars).
    """

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.shape = tuple(shape)
        self.count = 0.0
        self.mean = np.zeros(self.shape, dtype=np.float64)
        self.var = np.ones(self.shape, dtype=np.float64)

    def update(self, batch: np.ndarray) -> None:
        """Take in ``[N, *shape]`` values (N may be 0).

        Raises:
            ValueError: ``batch`` has another shape, or a value that is not finite.
        """
        values = np.asarray(batch, dtype=np.float64)
        if values.shape[1:] != self.shape or values.ndim != len(self.shape) + 1:
            raise ValueError(f"expected values of shape [N, *{self.shape}], got {values.shape}")
        if values.shape[0] == 0:
            return
        if not np.isfinite(values).all():
            raise ValueError("running statistics take finite values only")
        self.merge(float(values.shape[0]), values.mean(axis=0), values.var(axis=0))

    def merge(self, count: float, mean: np.ndarray, var: np.ndarray) -> None:
        """Take in the statistics of another set of ``count`` vectors (Chan et al.'s update).

        ``mean`` and ``var`` are that set's mean and population variance.
        """
        if count <= 0:
            return
        mean = np.asarray(mean, dtype=np.float64)
        var = np.asarray(var, dtype=np.float64)
        if self.count == 0:
            self.count, self.mean, self.var = float(count), mean.copy(), var.copy()
            return
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta * delta * (self.count * count / total)
        self.mean = np.asarray(self.mean + delta * (count / total), dtype=np.float64)
        self.var = np.asarray(m2 / total, dtype=np.float64)
        self.count = total

    def std(self, epsilon: float = NORM_EPSILON) -> np.ndarray:
        """``sqrt(var + epsilon)``, float64."""
        return np.sqrt(self.var + epsilon)

    def state(self) -> dict[str, np.ndarray]:
        """``count`` (``[]``), ``mean`` and ``var`` as float64 arrays."""
        return {
            "count": np.array(self.count, dtype=np.float64),
            "mean": np.array(self.mean, dtype=np.float64),
            "var": np.array(self.var, dtype=np.float64),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back :meth:`state` output (numpy arrays or CPU tensors).

        Raises:
            ValueError: A value is missing, misshapen, not finite, or negative where it cannot be.
        """
        try:
            count = float(np.asarray(state["count"], dtype=np.float64).reshape(()))
            mean = np.asarray(state["mean"], dtype=np.float64)
            var = np.asarray(state["var"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"running statistics state is malformed: {exc!r}") from exc
        if mean.shape != self.shape or var.shape != self.shape:
            raise ValueError(
                f"running statistics of shape {mean.shape} / {var.shape}; expected {self.shape} "
                "(were they saved for another observation space?)"
            )
        if not (np.isfinite(count) and count >= 0):
            raise ValueError(f"running statistics count {count} is not a count")
        if not (np.isfinite(mean).all() and np.isfinite(var).all() and (var >= 0).all()):
            raise ValueError("running statistics hold a non-finite mean or a negative variance")
        self.count, self.mean, self.var = count, mean.copy(), var.copy()


class ReturnScaler:
    """Rewards divided by the running standard deviation of the discounted return.

    Args:
        gamma: The discount of the return.
        clip: Scaled rewards are clipped to ``[-clip, clip]``.
        epsilon: Added to the variance before its square root.
    """

    def __init__(self, gamma: float, clip: float, epsilon: float = NORM_EPSILON) -> None:
        self.gamma = float(gamma)
        self.clip = float(clip)
        self.epsilon = float(epsilon)
        self.stats = RunningMeanStd(())
        self._returns: OrderedDict[tuple[str, str], float] = OrderedDict()

    def observe(self, key: tuple[str, str], rewards: np.ndarray, episode_ended: bool) -> None:
        """Take in the next ``[T]`` rewards of the episode (agent) ``key``, in order.

        The episode's running return goes on from where its previous rewards left it, and is
        forgotten when it ended (``episode_ended``: terminated or truncated).
        """
        values = np.asarray(rewards, dtype=np.float64).reshape(-1)
        running = self._returns.pop(key, 0.0)
        returns = np.empty_like(values)
        for i, reward in enumerate(values.tolist()):
            running = self.gamma * running + reward
            returns[i] = running
        self.stats.update(returns)
        if not episode_ended:
            self._returns[key] = running
            while len(self._returns) > MAX_TRACKED_EPISODES:
                self._returns.popitem(last=False)

    def scale(self) -> float:
        """The divisor the rewards get now: ``sqrt(var(returns) + epsilon)``."""
        return float(self.stats.std(self.epsilon))

    def state(self) -> dict[str, np.ndarray]:
        """The return statistics (:meth:`RunningMeanStd.state`); open episodes are not kept."""
        return self.stats.state()

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back :meth:`state` output."""
        self.stats.load_state(state)


def scale_rewards(rewards: np.ndarray, divisor: float, clip: float) -> np.ndarray:
    """``clip(rewards / divisor, -clip, clip)`` as float32 (computed in float64)."""
    scaled = np.asarray(rewards, dtype=np.float64) / divisor
    return np.clip(scaled, -clip, clip).astype(np.float32)
