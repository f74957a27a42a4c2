"""What :class:`~rlserve.PolicyClient` asks of an inference engine, and what the server told it.

``PolicyClient`` checks its arguments and hands each call to one engine, chosen once when it
is made: :class:`~rlserve.client.remote.RemoteEngine` (the server acts, a round trip per step)
or :class:`~rlserve.client.local.LocalInference` (the client acts with numpy and ships its
experience in batches). :class:`Engine` is the interface both implement; :class:`ServerView` is
the server's ``welcome`` as the client and its engine read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gymnasium import spaces

from rlserve.experience.agent_values import PolicyTable
from rlserve.policy.distributions import action_from_wire
from rlserve.protocol.messages import DEFAULT_POLICY_ID
from rlserve.protocol.replies import Welcome


class ServerView:
    """The server's policies and spaces, as its latest ``welcome`` declares them.

    The client and its engine share one view; a reconnection re-reads it in place.

    Args:
        welcome: The server's ``welcome`` reply.
        policy_ids: Agent id -> policy id choices of this client (they win over the mapping).
        multiagent: Whether dict observations are one per agent; None: as the server declares.
    """

    def __init__(self, welcome: Welcome, policy_ids: Mapping[str, str], multiagent: bool | None):
        self._policy_ids = dict(policy_ids)
        self._multiagent = multiagent
        self.instance_id: Any = None
        """The server process's id: another one after a reconnection means it restarted."""
        self.read(welcome)

    def read(self, welcome: Welcome) -> bool:
        """Take a (re)connection's ``welcome``; True when it comes from a restarted server."""
        restarted = self.instance_id not in (None, welcome.instance_id)
        self.instance_id = welcome.instance_id
        self.policies = PolicyTable(welcome.to_wire(), self._policy_ids)
        """The server's policies (spaces by id) and agent -> policy mapping."""
        self.multiagent = (
            self.policies.multi_agent if self._multiagent is None else bool(self._multiagent)
        )
        """Whether dict observations are read as one per agent (multi-agent episodes)."""
        served = self.policies.policies
        policy = served.get(DEFAULT_POLICY_ID) or next(iter(served.values()))
        self.observation_space: spaces.Space[Any] = policy.observation_space
        """The observation space of the default policy (single-agent episodes)."""
        self.action_space: spaces.Space[Any] = policy.action_space
        """The action space of the default policy (single-agent episodes)."""
        self.discrete = isinstance(self.action_space, spaces.Discrete)
        """Whether :attr:`action_space` is Discrete (its actions are ints)."""
        return restarted

    def action(self, value: Any) -> Any:
        """An action as decoded from the wire, in :attr:`action_space`'s own form."""
        return int(value) if self.discrete else action_from_wire(self.action_space, value)

    def by_episode(self, episode_ids: list[str], actions: Any) -> dict[str, Any]:
        """The actions of a batched ``get_action``, keyed by episode id."""
        return {eid: self.action(actions[i]) for i, eid in enumerate(episode_ids)}


class Engine(Protocol):
    """The episode calls behind :class:`~rlserve.PolicyClient`, with checked arguments.

    The client holds its lock around every call, checks rewards, ``info`` maps and done marks,
    and sends multi-agent calls (dict observations) to the ``*_agent_*`` methods.
    """

    def start_episode(
        self, episode_id: str | None, training_enabled: bool, policy_id: str | None = None
    ) -> str:
        """Open an episode (a random id for None); single-agent calls act with ``policy_id``."""
        ...

    def get_one_action(self, episode_id: str, observation: Any) -> Any:
        """Record one observation and return its action (the per-step hot path)."""
        ...

    def get_actions(self, episode_ids: list[str], observations: Any, keyed: bool) -> Any:
        """Act in several episodes at once: a dict keyed by id when ``keyed``, else stacked."""
        ...

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an observation and the action someone else took."""
        ...

    def log_returns(
        self, episode_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Add a checked reward (and a plain ``info`` map) to the previous action."""
        ...

    def end_episode(self, episode_id: str, observation: Any, truncated: bool) -> None:
        """Finish a single-agent episode with its final observation."""
        ...

    def get_agent_actions(self, episode_id: str, observation: Any) -> dict[str, Any]:
        """Record each agent's observation (a dict keyed by agent id) and return its action."""
        ...

    def log_agent_actions(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record the actions someone else took for several agents (dicts, the same keys)."""
        ...

    def log_agent_returns(
        self,
        episode_id: str,
        rewards: dict[str, float],
        infos: dict[str, dict[str, Any]],
        done: dict[str, bool],
    ) -> None:
        """Add each agent's reward and info; mark agents done (True: terminated)."""
        ...

    def end_agent_episode(self, episode_id: str, observation: Any, truncated: bool) -> None:
        """Finish a multi-agent episode with the final observations of any of its agents."""
        ...

    def update_weights(self) -> None:
        """Fetch the newest weights now, where the client acts itself."""
        ...

    def stop_waiting(self) -> None:
        """Let a call that waits for room return: :meth:`close` follows, from another thread.

        Called without the client's lock, which the waiting call holds.
        """
        ...

    def close(self, timeout: float) -> None:
        """Settle or ship what is outstanding, within ``timeout`` seconds, and disconnect."""
        ...

    @property
    def weights_version(self) -> int | None:
        """Version of the weights acting in the client; None where the server acts."""
        ...
