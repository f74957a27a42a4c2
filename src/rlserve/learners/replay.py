"""A bounded replay buffer of n-step transitions, fed with trajectory fragments.

Off-policy learners (DQN, SAC) store every step they are given as the action actually taken,
whoever chose it: the policy on the server or in a local-mode client, a hosted environment's
runner, or another controller through ``log_action``. How stale the acting weights were means
nothing here.

A fragment of ``T`` steps becomes ``T`` transitions ``(obs, action, reward, next_obs, discount)``:

* ``reward`` is the n-step discounted sum ``sum_{i<k} gamma^i r[t+i]`` with
  ``k = min(n_step, T - t, j - t)``: the sum stops at the fragment's end (the steps after it are
  in another fragment, or there are none) and before the first step ``j > t`` whose action the
  policy did not choose (``policy_chosen`` false: ``log_action``), so it never follows another
  controller's actions (a transition that starts at one is that action's, which is what
  ``Q(s, a)`` needs);
* ``next_obs`` is ``obs[t+k]``, the observation the target bootstraps from;
* ``discount`` is ``gamma^k``, or 0 when the episode terminated at ``t+k`` (a terminal state has
  no value to bootstrap). A time-limit truncation, or a fragment cut mid-episode, keeps
  ``gamma^k``: the episode's value goes on past ``obs[T]``.

What remains is the usual n-step bias: the policy's own actions in a sum include its exploration
(epsilon-greedy, or a stochastic actor's samples) and older weights' choices, not the greedy or
current policy's, so the target leans towards the value of the policy that acted (less so with
a smaller ``n_step``; none with 1).

Data that is all logged gets one-step targets, which can learn slowly. A buffer built
``through_logged`` (a learner's ``n_step_through_logged``) lets the sums run through logged
actions instead: its targets then follow the logged controller, biased towards that controller's
values, but learn fast from one controller's data (the greedy policy improves on that controller).

Given the fragments' episode (``add(..., key=(episode_id, agent_id))``), the buffer joins the
sums across a cut: the last ``n_step - 1`` transitions of a fragment whose episode goes on are
kept open (those a logged action has not ended), and when the episode's next fragment arrives (it
must start in the observation the last one ended in) their sums are extended in place with its
first rewards, up to its first logged action, as if the episode had come in one piece. Until
then they are sampled with their shorter sums (valid targets, only fewer rewards before the
bootstrap). At most :data:`MAX_OPEN_EPISODES` episodes are kept open (the one continued longest
ago is let go first); the open sums are not part of :meth:`state`.

The target of a transition is then ``reward + discount * V(next_obs)``. The buffer is a ring of
``capacity`` transitions (the oldest are overwritten), sampled uniformly with its own seeded
numpy generator. :meth:`ReplayBuffer.state` gives its contents as plain numpy arrays (oldest
first) for a checkpoint, and :meth:`ReplayBuffer.load_state` takes them back. Needs numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.errors import ConfigError
from rlserve.protocol.fragment import Fragment

STATE_FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")
"""The transition arrays of :meth:`ReplayBuffer.state`, each oldest first."""

MAX_OPEN_EPISODES = 4096
"""Episodes whose last transitions a :class:`ReplayBuffer` keeps open for the next fragment."""


@dataclass(slots=True)
class ReplayBatch:
    """Sampled transitions (numpy arrays of one length ``B``).

    Attributes:
        obs: ``[B, D]`` float32 observations the action was taken in.
        actions: ``[B]`` int64 choice indices or ``[B, A]`` float32 actions.
        rewards: ``[B]`` float32 n-step discounted reward sums.
        next_obs: ``[B, D]`` float32 observations to bootstrap from.
        discounts: ``[B]`` float32 ``gamma^k`` (0 after a terminal state).
        indices: ``[B]`` int64 positions in the ring (for priority updates, say).
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    discounts: np.ndarray
    indices: np.ndarray


def storage_dtype(low: np.ndarray, high: np.ndarray, dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype a replay buffer stores a flattened observation space's values in.

    ``low``, ``high`` and ``dtype`` are the flattened space's (``gymnasium.spaces.flatten_space``):
    uint8 when every value is a whole number within [0, 255] (a uint8 image, a legal-move mask,
    a one-hot choice), which holds every such value exactly; float32 otherwise.
    """
    if (
        np.issubdtype(dtype, np.integer)
        and low.size > 0
        and float(np.min(low)) >= 0
        and float(np.max(high)) <= 255
    ):
        return np.dtype(np.uint8)
    return np.dtype(np.float32)


def check_warm_up(learning_starts: int, buffer_size: int) -> None:
    """Refuse a warm-up the replay buffer cannot hold (off-policy settings' check).

    Training starts once ``learning_starts`` transitions are stored, which never happens when
    the buffer holds fewer: the learner would never train, and pacing would hold the clients.

    Raises:
        ConfigError: ``learning_starts`` is larger than ``buffer_size``.
    """
    if learning_starts > buffer_size:
        raise ConfigError(
            f"learning_starts {learning_starts} is larger than buffer_size {buffer_size}: the "
            "replay buffer never holds that many transitions, so training would never start "
            "(and the clients would be held for it); lower learning_starts or raise buffer_size"
        )


def n_step_transitions(
    obs: np.ndarray,
    rewards: np.ndarray,
    terminated: bool,
    gamma: float,
    n_step: int,
    chosen: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The n-step rewards, bootstrap observations and discounts of one fragment's steps.

    Args:
        obs: ``[T + 1, D]`` observations (``obs[T]`` follows the last action).
        rewards: ``[T]`` rewards.
        terminated: The episode ended in a terminal state after the last step.
        gamma: Discount factor.
        n_step: Rewards summed per transition at most.
        chosen: ``[T]`` bool, whether the policy chose each step's action (``policy_chosen``);
            no sum runs through a step it did not choose. None: it chose them all.

    Returns:
        ``(returns [T] float32, next_obs [T, D], discounts [T] float32)`` as the module doc
        defines them.
    """
    steps = int(rewards.shape[0])
    t = np.arange(steps)
    ahead = np.minimum(t + n_step, steps)
    if chosen is not None:
        # Per step, the first later one whose action was logged (T when there is none).
        logged_at = np.where(chosen, steps, t)
        later = np.append(np.minimum.accumulate(logged_at[::-1])[::-1][1:], steps)
        ahead = np.minimum(ahead, later)
    k = ahead - t
    padded = np.zeros(steps + n_step, dtype=np.float64)
    padded[:steps] = rewards
    returns = np.zeros(steps, dtype=np.float64)
    for i in range(n_step):
        returns += np.where(i < k, gamma**i * padded[i : i + steps], 0.0)
    discounts = np.power(float(gamma), k.astype(np.float64))
    if terminated:
        discounts[ahead == steps] = 0.0
    with np.errstate(over="ignore"):
        return returns.astype(np.float32), obs[ahead], discounts.astype(np.float32)


def checked_chosen(policy_chosen: Any, steps: int) -> tuple[np.ndarray | None, str]:
    """A fragment's ``policy_chosen`` as ``[T]`` bool (non-zero: chosen), or None and why not.

    The off-policy learners' check of the field (its sums stop at the steps it marks false).
    """
    try:
        chosen = np.asarray(policy_chosen)
    except (ValueError, TypeError) as exc:
        return None, f"policy_chosen is not an array ({exc})"
    if chosen.shape != (steps,):
        return None, f"policy_chosen has shape {chosen.shape}, expected {(steps,)}"
    if chosen.dtype.kind not in "biuf":
        return None, f"policy_chosen has dtype {chosen.dtype}"
    return (chosen if chosen.dtype == np.bool_ else chosen != 0), ""


@dataclass(slots=True)
class _OpenSums:
    """The transitions of an episode's last fragment whose n-step sums stopped at its end."""

    serials: list[int]
    """Each transition's number (:attr:`ReplayBuffer.added` before it was written)."""
    rows: list[int]
    """Its row in the ring."""
    steps: list[int]
    """Rewards its sum holds (fewer than ``n_step``)."""
    last_obs: np.ndarray
    """The observation the fragment ended in: the next fragment must start there."""


class ReplayBuffer:
    """A ring of ``capacity`` n-step transitions with uniform, seeded sampling.

    Args:
        capacity: Most transitions held; the oldest are overwritten first.
        obs_dim: Width ``D`` of a flattened observation.
        gamma: Discount factor of the n-step sums.
        n_step: Rewards summed per transition at most.
        action_shape: ``()`` for ``[T]`` choice indices (stored int64), ``(A,)`` for ``[T, A]``
            actions (stored float32).
        seed: Seed of the sampling generator.
        through_logged: :meth:`add_fragment` lets the sums run through logged actions as
            through the policy's (the learners' ``n_step_through_logged``).
        obs_dtype: How observations are stored: float32, or uint8 for spaces whose every
            flattened value is a whole number in [0, 255] (:func:`storage_dtype`: images,
            masks, one-hot choices). An 84x84x4 frame then takes 28 KB of the ring instead of
            113 KB; :meth:`sample` gives float32 either way, with the same values.
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        gamma: float,
        n_step: int = 1,
        action_shape: tuple[int, ...] = (),
        seed: int = 0,
        through_logged: bool = False,
        obs_dtype: np.dtype[Any] | type = np.float32,
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if n_step < 1:
            raise ValueError(f"n_step must be positive, got {n_step}")
        self.capacity = int(capacity)
        self.obs_dim = int(obs_dim)
        self.gamma = float(gamma)
        self.n_step = int(n_step)
        self.action_shape = tuple(action_shape)
        self.through_logged = bool(through_logged)
        action_dtype = np.int64 if not self.action_shape else np.float32
        self.obs_dtype = np.dtype(obs_dtype)
        if self.obs_dtype not in (np.dtype(np.float32), np.dtype(np.uint8)):
            raise ValueError(f"obs_dtype must be float32 or uint8, got {self.obs_dtype}")
        self._obs = np.zeros((self.capacity, self.obs_dim), dtype=self.obs_dtype)
        self._next_obs = np.zeros((self.capacity, self.obs_dim), dtype=self.obs_dtype)
        self._actions = np.zeros((self.capacity, *self.action_shape), dtype=action_dtype)
        self._rewards = np.zeros(self.capacity, dtype=np.float32)
        self._discounts = np.zeros(self.capacity, dtype=np.float32)
        self._position = 0
        self._size = 0
        self.added = 0
        """Transitions added since the start (kept by :meth:`load_state`)."""
        self._rng = np.random.default_rng(seed)
        self._open: dict[Any, _OpenSums] = {}
        """Per episode key, the transitions whose sums the next fragment extends."""

    def __len__(self) -> int:
        return self._size

    def add_fragment(self, fragment: Fragment) -> int:
        """Store a (sanitised) fragment's steps as transitions; return how many.

        Its n-step sums are joined to the episode's last fragment (``episode_id``, ``agent_id``)
        and stop before its logged actions (``policy_chosen`` false), unless the buffer lets
        them run through (``through_logged``). The off-policy learners store what they take in
        this way.
        """
        return self.add(
            fragment.obs,
            fragment.actions,
            fragment.rewards,
            bool(fragment.terminated),
            key=(fragment.episode_id, fragment.agent_id),
            truncated=bool(fragment.truncated),
            chosen=None if self.through_logged else fragment.policy_chosen,
        )

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: bool,
        key: Any = None,
        truncated: bool = False,
        chosen: np.ndarray | None = None,
    ) -> int:
        """Store ``T`` consecutive steps of one episode (``obs`` holds ``T + 1`` rows).

        With ``key`` (the episode, e.g. ``(episode_id, agent_id)``) the n-step sums are joined
        across fragments (see the module doc): this fragment extends the sums the episode's
        last fragment left open, when it starts in the observation that one ended in, and
        unless it ends the episode (``terminated`` or ``truncated``) its own last transitions
        stay open for the next. ``chosen`` (``[T]`` bool, None: all) says which actions the
        policy chose: no sum runs through one it did not.

        Raises:
            ValueError: The shapes disagree with each other or with the buffer.
        """
        steps = int(rewards.shape[0])
        if obs.shape != (steps + 1, self.obs_dim):
            raise ValueError(f"obs has shape {obs.shape}, expected {(steps + 1, self.obs_dim)}")
        if actions.shape != (steps, *self.action_shape):
            raise ValueError(
                f"actions has shape {actions.shape}, expected {(steps, *self.action_shape)}"
            )
        if chosen is not None and np.shape(chosen) != (steps,):
            raise ValueError(f"chosen has shape {np.shape(chosen)}, expected {(steps,)}")
        if steps == 0:
            return 0
        if chosen is not None:
            chosen = np.asarray(chosen, dtype=bool)
        returns, next_obs, discounts = n_step_transitions(
            obs, rewards, terminated, self.gamma, self.n_step, chosen
        )
        first = self.added
        self._write(
            {
                "obs": obs[:steps],
                "actions": actions,
                "rewards": returns,
                "next_obs": next_obs,
                "discounts": discounts,
            }
        )
        if key is not None:
            self._join(key, obs, rewards, terminated, truncated, first, chosen)
        return steps

    def _join(
        self,
        key: Any,
        obs: np.ndarray,
        rewards: np.ndarray,
        terminated: bool,
        truncated: bool,
        first: int,
        chosen: np.ndarray | None,
    ) -> None:
        """Extend the sums ``key``'s last fragment left open; keep this one's open."""
        steps = int(rewards.shape[0])
        gamma, n = self.gamma, self.n_step
        logged = np.flatnonzero(~chosen) if chosen is not None else np.zeros(0, np.int64)
        # The open sums run up to the first logged action; this fragment's own sums that reach
        # its end are those from its last logged action on (one may start at it).
        reach = int(logged[0]) if logged.size else steps
        own_from = int(logged[-1]) if logged.size else 0
        previous = self._open.pop(key, None)
        still_open = _OpenSums([], [], [], obs[steps])
        if previous is not None and np.array_equal(previous.last_obs, obs[0]):
            for serial, row, k in zip(previous.serials, previous.rows, previous.steps, strict=True):
                if self.added - serial > self.capacity:
                    continue  # overwritten meanwhile
                extra = min(n - k, reach)
                more = sum(gamma**i * float(rewards[i]) for i in range(extra))
                with np.errstate(over="ignore"):
                    self._rewards[row] = np.float32(float(self._rewards[row]) + gamma**k * more)
                    ends = terminated and extra == steps
                    self._discounts[row] = 0.0 if ends else np.float32(gamma ** (k + extra))
                self._next_obs[row] = obs[extra]
                if k + extra < n and extra == steps:
                    still_open.serials.append(serial)
                    still_open.rows.append(row)
                    still_open.steps.append(k + extra)
        if terminated or truncated:
            return
        for t in range(max(0, steps - n + 1, own_from), steps):
            serial = first + t
            if self.added - serial > self.capacity:
                continue  # a fragment longer than the ring: only its newest rows fit
            still_open.serials.append(serial)
            still_open.rows.append((self._position - (self.added - serial)) % self.capacity)
            still_open.steps.append(steps - t)
        if still_open.serials:
            if len(self._open) >= MAX_OPEN_EPISODES:
                del self._open[next(iter(self._open))]
            self._open[key] = still_open

    def _arrays(self) -> dict[str, np.ndarray]:
        return {
            "obs": self._obs,
            "actions": self._actions,
            "rewards": self._rewards,
            "next_obs": self._next_obs,
            "discounts": self._discounts,
        }

    def _write(self, columns: dict[str, np.ndarray]) -> None:
        count = len(columns["rewards"])
        self.added += count
        if count > self.capacity:  # only the newest fit
            columns = {k: v[count - self.capacity :] for k, v in columns.items()}
            count = self.capacity
        rows = (self._position + np.arange(count)) % self.capacity
        for name, store in self._arrays().items():
            store[rows] = columns[name]
        self._position = int((self._position + count) % self.capacity)
        self._size = min(self._size + count, self.capacity)

    def sample(self, batch_size: int) -> ReplayBatch:
        """``batch_size`` transitions drawn uniformly with replacement.

        Raises:
            ValueError: The buffer is empty.
        """
        if self._size == 0:
            raise ValueError("the replay buffer is empty; add experience before sampling")
        idx = self._rng.integers(0, self._size, size=batch_size)
        return ReplayBatch(
            obs=np.asarray(self._obs[idx], dtype=np.float32),
            actions=self._actions[idx],
            rewards=self._rewards[idx],
            next_obs=np.asarray(self._next_obs[idx], dtype=np.float32),
            discounts=self._discounts[idx],
            indices=idx.astype(np.int64),
        )

    def _chronological(self) -> np.ndarray:
        """Ring rows oldest first."""
        if self._size < self.capacity:
            return np.arange(self._size)
        return (self._position + np.arange(self.capacity)) % self.capacity

    def state(self) -> dict[str, np.ndarray]:
        """The contents and sampling state as plain numpy arrays (no object arrays).

        Transitions come oldest first; ``meta`` holds ``[added, n_step]`` (int64), ``gamma`` the
        discount (float64) and ``rng`` the sampling generator's state as UTF-8 JSON bytes, so
        ``np.savez`` / ``np.load(allow_pickle=False)`` carries it, and so does ``torch.save`` /
        ``torch.load(weights_only=True)`` once each array is a tensor (``torch.from_numpy``;
        :meth:`load_state` takes CPU tensors as they are).
        """
        rows = self._chronological()
        state = {name: array[rows].copy() for name, array in self._arrays().items()}
        state["meta"] = np.array([self.added, self.n_step], dtype=np.int64)
        state["gamma"] = np.array([self.gamma], dtype=np.float64)
        rng = json.dumps(self._rng.bit_generator.state).encode()
        state["rng"] = np.frombuffer(rng, dtype=np.uint8).copy()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back :meth:`state` output; only the newest ``capacity`` transitions fit.

        Raises:
            ValueError: The arrays are missing or misshapen, or they were built with another
                ``gamma`` or ``n_step`` (their sums would not be this learner's targets).
        """
        missing = [name for name in (*STATE_FIELDS, "meta", "gamma", "rng") if name not in state]
        if missing:
            raise ValueError(f"the replay state lacks {', '.join(missing)}")
        arrays = {name: np.asarray(state[name]) for name in STATE_FIELDS}
        count = int(arrays["rewards"].shape[0])
        expected = {
            "obs": (count, self.obs_dim),
            "actions": (count, *self.action_shape),
            "rewards": (count,),
            "next_obs": (count, self.obs_dim),
            "discounts": (count,),
        }
        for name, shape in expected.items():
            if arrays[name].shape != shape:
                raise ValueError(
                    f"the replay state's {name} has shape {arrays[name].shape}, expected {shape} "
                    "(was it saved for other spaces?)"
                )
        meta = np.asarray(state["meta"]).astype(np.int64)
        gamma = float(np.asarray(state["gamma"]).reshape(-1)[0])
        if int(meta[1]) != self.n_step or gamma != self.gamma:
            raise ValueError(
                f"the replay state holds {int(meta[1])}-step sums with gamma {gamma}, this "
                f"learner wants {self.n_step}-step sums with gamma {self.gamma}; keep n_step "
                "and gamma when resuming with the replay buffer, or resume without it"
            )
        self._position = 0
        self._size = 0
        self._open.clear()
        self._write(arrays)
        self.added = int(meta[0])
        rng = bytes(np.asarray(state["rng"], dtype=np.uint8)).decode()
        self._rng.bit_generator.state = json.loads(rng)
