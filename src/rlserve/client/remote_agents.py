"""Multi-agent episodes in remote inference: per-agent rewards, infos and done marks.

Each agent's rewards and info maps are kept until its next action and travel with it (no round
trip of their own); a call that marks agents done, or ends the episode with ``__all__``, is sent
at once. An agent's reward belongs to its previous action, so an agent that has not acted may
only get 0, and an agent marked done cannot act again. When the server maps agents with a
function of its own, a new agent no rule maps is asked about once per episode (``map_agents``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlserve.client.arguments import agent_keys
from rlserve.client.engine import ServerView
from rlserve.client.remote_session import RemoteSession, remember
from rlserve.errors import EpisodeError, SpaceError
from rlserve.protocol.episode_requests import EndEpisode, GetAction, LogAction, LogReturns
from rlserve.protocol.info import merged_info
from rlserve.protocol.mapping import ALL_AGENTS
from rlserve.protocol.multi_agent_requests import MapAgents
from rlserve.protocol.replies import AgentsMapped, actions_of
from rlserve.protocol.values import MAX_ABS_REWARD


class RemoteAgents:
    """The multi-agent calls of a remote-mode client.

    Args:
        session: Sends the calls (shared with the single-agent calls).
        view: The server's welcome (policies and agent mapping).
        check_observations: Check observations against their policies' spaces before sending.
    """

    def __init__(self, session: RemoteSession, view: ServerView, check_observations: bool):
        self._session = session
        self._view = view
        self._check_observations = check_observations
        # Per episode: the rewards and infos logged for each agent since its previous action,
        # the agents that acted, and the agents that are done.
        self._rewards: dict[str, dict[str, float]] = {}
        self._infos: dict[str, dict[str, dict[str, Any]]] = {}
        self._acted: dict[str, set[str]] = {}
        self._done: dict[str, set[str]] = {}
        self._mapped: dict[str, dict[str, str]] = {}
        """Per episode: the policies the server's mapping function gave its agents."""
        self._ended_by_all: OrderedDict[str, None] = OrderedDict()

    def forget(self) -> None:
        """The server restarted: drop what was kept for its episodes."""
        for per_episode in (self._rewards, self._infos, self._acted, self._done, self._mapped):
            per_episode.clear()

    def drop(self, episode_id: str) -> None:
        """``episode_id`` never opened on the server: drop what was kept for it."""
        for per_episode in (self._rewards, self._infos, self._acted, self._done, self._mapped):
            per_episode.pop(episode_id, None)

    def get_actions(self, episode_id: str, observation: Mapping[str, Any]) -> dict[str, Any]:
        """One ``get_action`` round trip for the agents observed; their actions by agent id."""
        agent_ids, reply = self._step("get_action", episode_id, observation, None)
        return self._view.policies.actions(
            agent_ids, actions_of(reply), self._mapped.get(episode_id)
        )

    def log_actions(
        self, episode_id: str, observation: Mapping[str, Any], action: Mapping[str, Any]
    ) -> None:
        """One ``log_action`` round trip: actions someone else took for these agents."""
        self._step("log_action", episode_id, observation, action)

    def log_returns(
        self,
        episode_id: str,
        rewards: dict[str, float],
        infos: dict[str, dict[str, Any]],
        done: dict[str, bool],
    ) -> None:
        """Keep each agent's reward and info for its next action; send done marks at once.

        ``done`` maps agent id -> True (terminated) or False (truncated); ``__all__`` in it ends
        the episode.
        """
        if episode_id in self._ended_by_all:
            raise EpisodeError(
                f"log_returns for episode '{episode_id}', which '__all__' ended; start a new "
                "episode"
            )
        self._session.check_not_lost([episode_id])
        all_done = done.pop(ALL_AGENTS, None)
        acted = self._acted.get(episode_id, set())
        self._check_usable(episode_id, [*rewards, *infos, *done], "log_returns")
        pending = self._rewards.setdefault(episode_id, {})
        # The common case, one reward dict per tick for agents that acted: nothing to refuse
        # (each value was checked) and nothing pending to add to.
        fresh = not pending and (episode_id not in self._session.open or acted.issuperset(rewards))
        for agent_id, value in () if fresh else rewards.items():
            if value and agent_id not in acted and episode_id in self._session.open:
                policy = self._policy_id(episode_id, agent_id)
                raise EpisodeError(
                    f"log_returns for episode '{episode_id}': a reward for agent '{agent_id}' "
                    f"(policy '{policy}'), which has not acted in this episode; a reward "
                    "belongs to the agent's previous action"
                )
            total = pending.get(agent_id, 0.0) + value
            if not -MAX_ABS_REWARD <= total <= MAX_ABS_REWARD:
                raise SpaceError(
                    f"log_returns for episode '{episode_id}', agent '{agent_id}': reward "
                    f"{value!r} makes the rewards logged since its last action add up to "
                    f"{total!r}; a step's reward must be within "
                    f"-{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
                )
        for agent_id in done:
            if agent_id not in acted and episode_id in self._session.open:
                raise EpisodeError(
                    f"log_returns for episode '{episode_id}' marks agent '{agent_id}' done, but "
                    "it has not acted in this episode; mark only agents that acted"
                )
        kept_infos = self._infos.get(episode_id, {})
        merged_infos = {
            agent_id: merged_info(
                kept_infos.get(agent_id),
                info,
                self._session.conn.limits.max_info_bytes,
                f"log_returns for episode '{episode_id}', agent '{agent_id}'",
            )
            for agent_id, info in infos.items()
        }
        if fresh:
            # Kept whole (zeros too: every agent in it has acted), so that the next get_action
            # with the same agents sends the values as they are.
            self._rewards[episode_id] = rewards
        else:
            for agent_id, value in rewards.items():
                if value:
                    pending[agent_id] = pending.get(agent_id, 0.0) + value
        if merged_infos:
            self._infos.setdefault(episode_id, {}).update(merged_infos)
        if episode_id not in self._session.open or done or all_done is not None:
            # Finishing agents (or an episode another client object started): send it now.
            self._flush_returns(episode_id, done)
        if all_done is not None:
            truncated = not all_done
            self.end_episode(episode_id, {}, truncated)
            remember(self._ended_by_all, episode_id)

    def end_episode(self, episode_id: str, observation: Mapping[str, Any], truncated: bool) -> None:
        """Send ``end_episode`` pipelined: every agent not yet done ends with the episode."""
        if episode_id in self._ended_by_all:
            return  # '__all__' ended it already (RLlib's clients call end_episode after it)
        self._session.check_not_lost([episode_id])
        agent_ids = [str(a) for a in observation]
        done = self._done.get(episode_id, set())
        agent_ids = [a for a in agent_ids if a not in done]
        pending = self._rewards.get(episode_id, {})
        infos = self._infos.get(episode_id, {})
        named = set(agent_ids)
        if any(v and a not in named for a, v in pending.items()) or any(
            a not in named for a in infos
        ):
            # Rewards of agents without a final observation go first, on their own.
            self._flush_returns(episode_id, {})
        seq = self._session.next_seq(episode_id)
        end = EndEpisode(0, episode_id, [], bool(truncated), seq=seq, agent_ids=agent_ids)
        if agent_ids:
            end.observation = self._view.policies.observations(
                agent_ids,
                [observation[a] for a in agent_ids],
                self._check_observations,
                self._assign(episode_id, agent_ids),
            )
            end.rewards, end.infos = self._pending(episode_id, agent_ids)
        self._session.send_nowait(end.to_wire())
        # Pipelined: its error, if any, is raised by the next call; the episode is over here.
        for per_episode in (
            self._rewards,
            self._infos,
            self._acted,
            self._done,
            self._mapped,
        ):
            per_episode.pop(episode_id, None)
        self._session.ended(episode_id, seq)

    def _step(
        self,
        call: str,
        episode_id: str,
        observation: Mapping[str, Any],
        action: Mapping[str, Any] | None,
    ) -> tuple[list[str], dict[str, Any]]:
        """Send one multi-agent ``get_action`` or ``log_action``; return its agents and reply."""
        self._session.check_not_lost([episode_id])
        agent_ids = agent_keys(observation)
        if not agent_ids:
            raise SpaceError(
                f"{call} for episode '{episode_id}': the observation dict names no agent; "
                "pass the observations of the agents that act now"
            )
        self._check_usable(episode_id, agent_ids, call)
        assigned = self._assign(episode_id, agent_ids)
        seq = self._session.next_seq(episode_id)
        observations = self._view.policies.observations(
            agent_ids, list(observation.values()), self._check_observations, assigned
        )
        rewards, infos = self._pending(episode_id, agent_ids)
        policy_ids = self._view.policies.explicit_ids(agent_ids)
        message: GetAction | LogAction
        if action is None:
            message = GetAction(
                0, [episode_id], observations, rewards, False, [seq], infos, agent_ids, policy_ids
            )
        else:
            taken = self._view.policies.taken_actions(agent_ids, action, assigned)
            message = LogAction(
                0,
                episode_id,
                observations,
                taken,
                seq=seq,
                agent_ids=agent_ids,
                rewards=rewards,
                infos=infos,
                policy_ids=policy_ids,
            )
        reply = self._session.request(message.to_wire())
        self._delivered(episode_id, agent_ids, seq)
        return agent_ids, reply

    def _flush_returns(self, episode_id: str, done: dict[str, bool]) -> None:
        """Send every pending reward and info of the episode, and the done marks, now."""
        pending = self._rewards.get(episode_id, {})
        infos = self._infos.get(episode_id, {})
        agent_ids = sorted({a for a, v in pending.items() if v} | set(infos))
        if not agent_ids and not done:
            return
        seq = self._session.next_seq(episode_id)
        returns = LogReturns(
            0,
            episode_id,
            0.0,
            seq=seq,
            agent_ids=agent_ids,
            rewards=np.array([pending.get(a, 0.0) for a in agent_ids], dtype=np.float64),
            infos=[infos.get(a) for a in agent_ids] if infos else None,
            done=done,
        )
        self._session.request(returns.to_wire())
        self._rewards.pop(episode_id, None)
        self._infos.pop(episode_id, None)
        self._session.seq[episode_id] = seq
        self._done.setdefault(episode_id, set()).update(done)

    def _check_usable(self, episode_id: str, agent_ids: Any, call: str) -> None:
        done = self._done.get(episode_id)
        if done and not done.isdisjoint(agent_ids):
            for agent_id in agent_ids:
                if agent_id in done:
                    policy = self._policy_id(episode_id, agent_id)
                    raise EpisodeError(
                        f"{call} for episode '{episode_id}': agent '{agent_id}' (policy "
                        f"'{policy}') is done (marked in multiagent_done_dict) and cannot act "
                        "again; use a new agent id for a new agent"
                    )

    def _assign(self, episode_id: str, agent_ids: list[str]) -> dict[str, str] | None:
        """The server function's policies of the episode's agents; new ones asked about first.

        None when the server has no mapping function (the rules and this client's choices
        decide).
        """
        table = self._view.policies
        if not table.map_agents:
            return None
        mapped = self._mapped.setdefault(episode_id, {})
        new = table.unmapped(agent_ids, mapped)
        if new:
            reply = self._session.request(MapAgents(0, episode_id, new).to_wire())
            mapped.update(zip(new, AgentsMapped.from_wire(reply, len(new)).policy_ids, strict=True))
        return mapped

    def _policy_id(self, episode_id: str, agent_id: str) -> str:
        """The policy an agent of the episode acts for (for error messages)."""
        return self._view.policies.policy_of(agent_id, self._mapped.get(episode_id)).policy_id

    def _pending(
        self, episode_id: str, agent_ids: list[str]
    ) -> tuple[np.ndarray | None, list[dict[str, Any] | None] | None]:
        """The rewards and infos logged for these agents since their previous action, if any."""
        listed: np.ndarray | None = None
        rewards = self._rewards.get(episode_id)
        if rewards:
            # One typed array on the wire: the server checks it with a few numpy operations.
            if _same_keys(rewards, agent_ids):
                listed = np.fromiter(rewards.values(), np.float64, len(agent_ids))
            else:
                listed = np.array([rewards.get(a, 0.0) for a in agent_ids], dtype=np.float64)
            if not listed.any():
                listed = None
        infos = self._infos.get(episode_id)
        if infos and any(a in infos for a in agent_ids):
            return listed, [infos.get(a) for a in agent_ids]
        return listed, None

    def _delivered(self, episode_id: str, agent_ids: list[str], seq: int) -> None:
        rewards = self._rewards.get(episode_id)
        infos = self._infos.get(episode_id)
        if rewards or infos:
            delivered: set[str] | None = None
            for pending in (rewards, infos):
                if not pending:
                    continue
                if _same_keys(pending, agent_ids):
                    pending.clear()
                    continue
                if delivered is None:
                    delivered = set(agent_ids)
                if pending.keys() <= delivered:
                    pending.clear()  # the common case: every agent logged for has acted now
                else:
                    for agent_id in agent_ids:
                        pending.pop(agent_id, None)
        acted = self._acted.get(episode_id)
        if acted is None:
            self._acted[episode_id] = set(agent_ids)
        elif len(acted) < len(agent_ids) or not acted.issuperset(agent_ids):
            acted.update(agent_ids)
        self._session.seq[episode_id] = seq


_STR_ONLY = {str}


def _same_keys(values: dict[str, Any], agent_ids: list[str]) -> bool:
    """Whether a dict is keyed by exactly these agents, in this order (checked in C)."""
    return len(values) == len(agent_ids) and list(values) == agent_ids
