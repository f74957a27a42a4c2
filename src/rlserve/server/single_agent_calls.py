"""The episode calls of single-agent episodes: calls that name no agent.

A single-agent episode acts with its own policy, the one named in ``start_episode`` (or the only
one served). One ``get_action`` may name several episodes of the same policy (a batched call,
one observation each); its observations are recorded at once and the call waits in the policy's
slot for the next flush (:mod:`~rlserve.server.batching`). A retry gets the actions of the call
it repeats, or joins that call while it still waits.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlserve.errors import EpisodeError
from rlserve.experience.episode_records import Episode, EpisodeSummary
from rlserve.experience.recurrent_states import advance, log_steps
from rlserve.policy.distributions import encode_action
from rlserve.protocol.messages import EndEpisode, GetAction, LogAction, LogReturns
from rlserve.protocol.replies import action_reply, actions_reply
from rlserve.protocol.spaces import check_batch, check_one, check_value
from rlserve.protocol.values import check_float32
from rlserve.server.batching import Pending, PolicySlot
from rlserve.server.episode_calls import EpisodeCalls
from rlserve.server.replies import Respond
from rlserve.server.sessions import Session


class SingleAgentCalls(EpisodeCalls):
    """The calls of single-agent episodes (see :class:`EpisodeCalls` for the arguments)."""

    def get_action(self, request: GetAction, session: Session, respond: Respond) -> bool:
        """Record a ``get_action`` and queue it for the next flush, or answer a retry.

        Returns:
            True when ``respond`` will be called later.
        """
        if not request.batched:
            return self._get_one_action(request, session, respond)
        episodes = [self._episode(eid, session) for eid in request.episode_ids]
        # The others are checked against it; check_observe refuses a multi-agent one.
        slot = self._slot(episodes[0], "get_action")
        if any(e.policy_id != slot.policy_id for e in episodes):
            raise EpisodeError("one get_action may only name episodes of the same policy")
        if request.seqs is not None:
            retried = [
                self.episodes.check_seq(e, seq, "get_action")
                for e, seq in zip(episodes, request.seqs, strict=True)
            ]
            if any(retried):
                return self._retry(request, episodes, retried, slot, respond)
        if request.batched:
            obs = check_batch(
                slot.observation_space, request.observations, len(episodes), "observations"
            )
        else:
            obs = check_one(slot.observation_space, request.observations[0], "observation")
        if slot.legal_moves is not None:
            slot.legal_moves.check(obs, "get_action 'observations'")
        rewards, infos = request.rewards, request.infos
        # Check every episode before changing any, so a bad batch leaves all of them untouched.
        for i, episode in enumerate(episodes):
            self.episodes.check_observe(
                episode,
                None if rewards is None else rewards[i],
                info=None if infos is None else infos[i],
            )
        if slot.frames is not None:
            obs = slot.frames.stack(episodes, obs)
        for i, episode in enumerate(episodes):
            self.episodes.observe(
                episode,
                obs[i],
                None if rewards is None else rewards[i],
                None if infos is None else infos[i],
            )
            if request.seqs is not None:
                self.episodes.record_seq(episode, request.seqs[i], "get_action")
        slot.pending.append(Pending(request, episodes, respond))
        if slot.policy is not None:
            self._schedule_flush()
        return True

    def _get_one_action(self, request: GetAction, session: Session, respond: Respond) -> bool:
        """:meth:`get_action` of one episode (every remote step): the same checks, in order."""
        episode = self._episode(request.episode_ids[0], session)
        slot = self._slot(episode, "get_action")
        seqs = request.seqs
        if seqs is not None and self.episodes.check_seq(episode, seqs[0], "get_action"):
            return self._retry(request, [episode], [True], slot, respond)
        obs = check_one(slot.observation_space, request.observations[0], "observation")
        if slot.legal_moves is not None:
            slot.legal_moves.check(obs, "get_action 'observation'")
        reward = None if request.rewards is None else request.rewards[0]
        episodes = self.episodes
        episodes.check_observe(episode, reward)
        if slot.frames is not None:
            obs = slot.frames.stack([episode], obs)
        episodes.observe(
            episode, obs[0], reward, None if request.infos is None else request.infos[0]
        )
        if seqs is not None:
            episodes.record_seq(episode, seqs[0], "get_action")
        slot.pending.append(Pending(request, [episode], respond))
        if slot.policy is not None:
            self._schedule_flush()
        return True

    def _retry(
        self,
        request: GetAction,
        episodes: list[Episode],
        retried: list[bool],
        slot: PolicySlot,
        respond: Respond,
    ) -> bool:
        """Answer a repeated ``get_action`` with the first answer, or join it while pending."""
        if not all(retried):
            raise EpisodeError(
                "get_action 'seqs' mix retries (the episode's last number) and new calls; "
                "re-send a batched call exactly as it was, or number every episode's next call"
            )
        if any(e.answer is None for e in episodes):
            # The call it repeats is still waiting for its actions (record_seq cleared the
            # answer). A pending call without seq is another call: the retry gets its answer.
            for item in slot.pending:
                if len(item.episodes) == len(episodes) and all(
                    a is b for a, b in zip(item.episodes, episodes, strict=True)
                ):
                    item.joined.append((request, respond))
                    return True
            raise EpisodeError(
                "get_action retry names other episodes than the call it repeats, which is still "
                "being answered; re-send a call exactly as it was"
            )
        if request.batched:
            actions = np.asarray([e.answer for e in episodes])
            respond(actions_reply(request.id, actions))
        else:
            respond(action_reply(request.id, episodes[0].answer))
        return False

    def _log_action(self, request: LogAction, episode: Episode) -> int:
        slot = self._slot(episode, "log_action")
        obs = check_one(slot.observation_space, request.observation, "observation")
        action = check_value(slot.action_space, request.action, "action")
        if isinstance(slot.action_space, gym.spaces.Discrete):
            action -= int(slot.action_space.start)  # the learner works with choice indices
        else:
            # The flat layout the learner trains on (docs/protocol.md §6.3).
            action = check_float32(encode_action(slot.action_space, action), "log_action 'action'")
        if slot.legal_moves is not None:
            slot.legal_moves.check_actions(obs, np.asarray([action]), "log_action")
        rule, frames = slot.frames, None
        if rule is not None:
            frames, obs = rule.next([episode], obs)
        policy = slot.policy
        states = None
        if policy is not None and policy.state_size:
            # The LSTM reads every observation: a logged step advances the state too.
            states = log_steps([episode], obs, policy)
        self.episodes.observe(episode, obs[0], request.reward, request.info, "log_action")
        version = policy.version if policy is not None else 0
        self.episodes.act(episode, action, float("nan"), False, version)
        if states is not None:
            advance([episode], *states)
        if rule is not None and frames is not None:
            rule.keep([episode], frames)
        return 1

    def _log_returns(self, request: LogReturns, episode: Episode) -> None:
        self.episodes.log_returns(episode, request.reward, request.info)

    def _end(self, request: EndEpisode, episode: Episode) -> EpisodeSummary:
        slot = self._slot(episode, "end_episode")
        obs = check_one(slot.observation_space, request.observation, "observation")
        if slot.frames is not None:
            obs = slot.frames.next([episode], obs)[1]  # the frames end with the episode
        return self.episodes.end(
            episode, obs[0], request.truncated, request.reward, request.seq, request.info
        )

    def _slot(self, episode: Episode, call: str) -> PolicySlot:
        """The policy slot of a single-agent call's episode.

        Raises:
            EpisodeError: The episode is multi-agent, or has no policy of its own (a server of
                several policies, started without naming one).
        """
        if episode.agents is not None:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' names no agent, but the episode is "
                "multi-agent (its calls name agents): pass a dict keyed by agent id "
                "(agent_ids on the wire)"
            )
        slot = self.slots.get(episode.policy_id)
        if slot is None:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' names no agent and the episode has "
                f"no policy: this server serves several ({sorted(self.slots)}); name one in "
                "start_episode (policy_id) or name the agents of each call"
            )
        return slot
