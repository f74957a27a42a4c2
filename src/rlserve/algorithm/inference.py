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

from rlserve.errors import ConfigError
from rlserve.policy import NumpyPolicy
from rlserve.policy.distributions import actions_to_space
from rlserve.protocol.messages import DEFAULT_POLICY_ID
from rlserve.protocol.spaces import check_batch

if TYPE_CHECKING:
    from rlserve.server.policies import PolicySpec


class ActingMixin:
    """``compute_single_action`` and ``compute_actions`` of an Algorithm's policies."""

    specs: dict[str, PolicySpec]
    """The policies, by id."""

    def compute_single_action(
        self, observation: Any, *, explore: bool = False, policy_id: str | None = None
    ) -> Any:
        """The action of one observation (greedy unless ``explore``), as the env takes it."""
        spec = self.specs.get(policy_id or self._default_policy)
        if spec is None:
            raise ConfigError(f"no policy '{policy_id}'; the policies are {sorted(self.specs)}")
        batch = single_batch(spec.observation_space, observation)
        return self._compute(batch, 1, explore, policy_id)[0]

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
        checked = observation_batch(spec.observation_space, observations, count)
        return env_actions(self._acting_policy(pid), spec.action_space, checked, explore)

    def _acting_policy(self, policy_id: str) -> NumpyPolicy:
        """The policy copy that computes actions for :meth:`compute_actions`."""
        raise NotImplementedError

    @property
    def _default_policy(self) -> str:
        return DEFAULT_POLICY_ID if DEFAULT_POLICY_ID in self.specs else next(iter(self.specs))


def single_batch(space: gym.Space[Any], observation: Any) -> Any:
    """One observation as a batch of one (an array for a Box, else a list)."""
    return np.asarray(observation)[None] if isinstance(space, gym.spaces.Box) else [observation]


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
    out = policy.compute_actions(batch, explore)
    sent = policy.to_env_actions(out.actions)
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
