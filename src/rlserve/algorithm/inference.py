"""Actions for observations outside training: RLlib's ``compute_single_action``.

:class:`ActingMixin` gives an Algorithm ``compute_single_action`` and ``compute_actions`` over
whichever policy copy acts for it (:meth:`ActingMixin._acting_policy`). Observations are checked
against the policy's observation space (Box observations in another float dtype are cast first,
as RLlib accepts float64 for float32), and actions come back as the environment takes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlserve.errors import ConfigError, SpaceError
from rlserve.policy import NumpyPolicy
from rlserve.policy.distributions import actions_to_space
from rlserve.policy.frame_stacking import stacked_space
from rlserve.protocol.messages import DEFAULT_POLICY_ID
from rlserve.protocol.spaces import batch_of_one, check_batch

if TYPE_CHECKING:
    from rlserve.server.policies import PolicySpec


class ActingMixin:
    """``compute_single_action`` and ``compute_actions`` of an Algorithm's policies."""

    specs: dict[str, PolicySpec]
    """The policies, by id."""
    frame_stacks: dict[str, int] = {}
    """Each policy's ``frame_stack`` (missing: 1): it acts on that many stacked frames, so its
    observations here are stacks (``rlserve.env.FrameStacker`` builds them)."""

    def compute_single_action(
        self,
        observation: Any,
        state: Any = None,
        *,
        explore: bool = False,
        policy_id: str | None = None,
    ) -> Any:
        """The action of one observation (greedy unless ``explore``), as the env takes it.

        A policy with memory (``use_lstm``) needs ``state``, the recurrent state of the
        episode: RLlib's form, a list ``[h, c]`` of ``cell_size`` values each (zeros at an
        episode's start), or one array of ``2 * cell_size`` values ``concat(h, c)``; the answer
        is then ``(action, state_out, extra)``, ``state_out`` in the form given (pass it to the
        episode's next call) and ``extra`` with the action's ``action_logp``. A policy without
        memory answers the action alone, or ``(action, [], extra)`` for ``state=[]``.

        Raises:
            ConfigError: Unknown policy.
            SpaceError: The observation is not in the space; ``state`` is missing for a policy
                with memory, or does not fit it.
        """
        pid = policy_id or self._default_policy
        spec = self.specs.get(pid)
        if spec is None:
            raise ConfigError(f"no policy '{pid}'; the policies are {sorted(self.specs)}")
        space = self._observation_space(pid)
        batch = batch_of_one(space, observation)
        policy = self._acting_policy(pid)
        checked = observation_batch(space, batch, 1)
        if state is None and not policy.state_size:
            return env_actions(policy, spec.action_space, checked, explore)[0]
        rows = recurrent_state(state, policy.state_size, pid)
        out = policy.compute_actions(checked, explore, rows)
        action = to_env(policy, spec.action_space, out.actions)[0]
        extra = {"action_logp": float(out.logp[0])}
        if out.state is None:
            return action, [], extra
        state_out = out.state[0]
        if isinstance(state, (list, tuple)):
            half = policy.state_size // 2
            return action, [state_out[:half].copy(), state_out[half:].copy()], extra
        return action, state_out, extra

    def compute_actions(
        self, observations: Any, *, explore: bool = False, policy_id: str | None = None
    ) -> Any:
        """The actions of a batch of observations (an array ``[N, ...]`` for a Box, else a list)."""
        count = len(observations)
        return self._compute(observations, count, explore, policy_id)

    def _compute(self, observations: Any, count: int, explore: bool, policy_id: str | None) -> Any:
        pid = policy_id or self._default_policy
        if pid not in self.specs:
            raise ConfigError(f"no policy '{pid}'; the policies are {sorted(self.specs)}")
        spec = self.specs[pid]
        checked = observation_batch(self._observation_space(pid), observations, count)
        return env_actions(self._acting_policy(pid), spec.action_space, checked, explore)

    def _observation_space(self, policy_id: str) -> gym.Space[Any]:
        """What the policy reads: its space, stacked with ``frame_stack`` > 1."""
        space = self.specs[policy_id].observation_space
        frames = self.frame_stacks.get(policy_id, 1)
        return space if frames == 1 else stacked_space(space, frames)

    def _acting_policy(self, policy_id: str) -> NumpyPolicy:
        """The policy copy that computes actions for :meth:`compute_actions`."""
        raise NotImplementedError

    @property
    def _default_policy(self) -> str:
        return DEFAULT_POLICY_ID if DEFAULT_POLICY_ID in self.specs else next(iter(self.specs))


def observation_batch(space: gym.Space[Any], observations: Any, count: int) -> Any:
    """``count`` observations, checked against ``space``.

    Raises:
        SpaceError: An observation is not in ``space``.
    """
    return check_batch(space, _cast_box(space, observations), count, "observation")


def env_actions(
    policy: NumpyPolicy, action_space: gym.Space[Any], batch: Any, explore: bool
) -> Any:
    """The actions of ``policy`` for a checked batch, as the environment takes them."""
    return to_env(policy, action_space, policy.compute_actions(batch, explore).actions)


def recurrent_state(state: Any, state_size: int, policy_id: str) -> np.ndarray | None:
    """``compute_single_action``'s ``state`` as the ``[1, state_size]`` rows a policy reads.

    Raises:
        SpaceError: Missing for a policy with memory, given for one without, or another width.
    """
    if not state_size:
        if state is None or (isinstance(state, (list, tuple)) and not state):
            return None
        raise SpaceError(
            f"policy '{policy_id}' has no memory: call compute_single_action without state"
        )
    fix = (
        f"pass state=[h, c] ({state_size // 2} values each; zeros at an episode's start, then "
        "the state_out of the episode's previous call)"
    )
    if state is None:
        raise SpaceError(f"policy '{policy_id}' has memory (use_lstm): {fix}")
    try:
        parts = state if isinstance(state, (list, tuple)) else [state]
        flat = np.concatenate([np.asarray(p, dtype=np.float32).reshape(-1) for p in parts])
    except (TypeError, ValueError) as exc:
        raise SpaceError(f"state is not numbers ({exc}); {fix}") from exc
    if flat.shape != (state_size,) or not np.isfinite(flat).all():
        raise SpaceError(
            f"state has {flat.size} values (finite: {bool(np.isfinite(flat).all())}); policy "
            f"'{policy_id}' has a recurrent state of {state_size}: {fix}"
        )
    return flat[None]


def to_env(policy: NumpyPolicy, action_space: gym.Space[Any], actions: np.ndarray) -> Any:
    """A policy's actions as the environment takes them."""
    sent = policy.to_env_actions(actions)
    if isinstance(action_space, gym.spaces.Discrete):
        return [int(a) for a in sent]
    return actions_to_space(action_space, sent)


def _cast_box(space: gym.Space[Any], observations: Any) -> Any:
    """Box observations in the space's float dtype (RLlib accepts float64 for float32)."""
    if isinstance(space, gym.spaces.Box):
        array = np.asarray(observations)
        if array.dtype != space.dtype and array.dtype.kind == "f":
            return array.astype(space.dtype)
        return array
    return observations
