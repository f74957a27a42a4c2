"""Unit tests of the multi-agent bookkeeping of EpisodeTable.

The main test is differential: random multi-agent episodes (agents of two policies joining,
acting at their own pace, rewarded, marked done, ended or left idle, with refused calls mixed in)
must produce, agent by agent, exactly the fragments that one single-agent episode per agent
produces with the same calls: a multi-agent episode is the single-agent rules applied per agent.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from rlserve.errors import EpisodeError, SpaceError
from rlserve.experience.agent_columns import AgentTick
from rlserve.experience.episode_records import Episode
from rlserve.experience.episodes import EpisodeTable
from rlserve.protocol.fragment import Fragment

OBS_DIM = {"p": 2, "q": 3}
"""Observation width of each policy; p acts with Discrete actions, q with 2 floats."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _policy(agent_id: str) -> str:
    return "p" if int(agent_id[1:]) % 2 == 0 else "q"


# -- the table's multi-agent calls -------------------------------------------------------------


def observe_only(
    table: EpisodeTable,
    episode: Episode,
    agent_ids: list[str],
    policy_ids: list[str],
    obs: list[np.ndarray],
    rewards: list[float] | None = None,
    infos: list[dict[str, Any] | None] | None = None,
    call: str = "get_action",
) -> tuple[AgentTick, list[tuple[str, np.ndarray]]]:
    """The observation half of a multi-agent get_action: its tick and its policy groups."""
    positions: dict[str, list[int]] = {}
    for i, policy_id in enumerate(policy_ids):
        positions.setdefault(policy_id, []).append(i)
    groups = [(policy_id, np.asarray(idx)) for policy_id, idx in positions.items()]
    blocks = [np.stack([obs[i] for i in idx]) for _, idx in groups]
    tick = table.observe_agents(
        episode, agent_ids, policy_ids, groups, blocks, rewards, infos, call
    )
    return tick, groups


def observe_and_act(
    table: EpisodeTable,
    episode: Episode,
    agent_ids: list[str],
    obs: list[np.ndarray],
    rewards: list[float] | None,
    infos: list[dict[str, Any] | None] | None,
    actions: list[Any],
    logps: list[float],
    chosen: bool,
    versions: dict[str, int],
    call: str = "get_action",
) -> None:
    """One multi-agent get_action (or log_action) answered: observe, act per policy, finish."""
    policy_ids = [_policy(a) for a in agent_ids]
    tick, groups = observe_only(table, episode, agent_ids, policy_ids, obs, rewards, infos, call)
    for g, (policy_id, idx) in enumerate(groups):
        table.act_agents(
            episode,
            tick,
            g,
            np.asarray([actions[i] for i in idx]),
            np.asarray([logps[i] for i in idx], np.float32),
            chosen,
            versions[policy_id],
        )
    table.finish_tick(episode)


# -- the reference: one single-agent episode per agent -----------------------------------------


class Reference:
    """What a multi-agent episode must hand on: one single-agent episode per agent."""

    def __init__(self, fragment_length: int, training: bool):
        self.fragment_length = fragment_length
        self.training = training
        self.tables: dict[str, tuple[EpisodeTable, FakeClock, list[Fragment]]] = {}
        self.last_obs: dict[str, np.ndarray] = {}
        self.done: set[str] = set()
        self.returns: dict[str, float] = {}

    def _table(self, agent_id: str) -> tuple[EpisodeTable, Episode]:
        if agent_id not in self.tables:
            sink: list[Fragment] = []
            clock = FakeClock()
            table = EpisodeTable(self.fragment_length, 10, 10, sink.append, clock)
            table.start(agent_id, self.training, _policy(agent_id), "ref")
            self.tables[agent_id] = (table, clock, sink)
        table = self.tables[agent_id][0]
        return table, table.get(agent_id)

    def acted(self, agent_id: str) -> bool:
        return agent_id in self.tables and self._table(agent_id)[1].length > 0

    def step(
        self,
        agent_id: str,
        obs: np.ndarray,
        reward: float,
        info: Any,
        action: Any,
        logp: float,
        chosen: bool,
        version: int,
    ) -> None:
        table, episode = self._table(agent_id)
        table.observe(episode, obs, reward or None, info)
        table.act(episode, action, logp, chosen, version)
        self.last_obs[agent_id] = obs
        self.returns[agent_id] = self.returns.get(agent_id, 0.0) + reward

    def reward(self, agent_id: str, reward: float, info: Any) -> None:
        table, episode = self._table(agent_id)
        table.log_returns(episode, reward, info)
        self.returns[agent_id] = self.returns.get(agent_id, 0.0) + reward

    def finish(self, agent_id: str, final_obs: np.ndarray | None, terminated: bool) -> None:
        """End the agent: with a final observation, terminated, or cut short without one."""
        self.done.add(agent_id)
        table, episode = self._table(agent_id)
        if final_obs is not None:
            table.end(episode, final_obs, truncated=not terminated, reward=None)
        elif terminated:
            table.end(episode, self.last_obs[agent_id], truncated=False, reward=None)
        else:
            self.tables[agent_id][1].now += 1000.0  # no next observation: as an idle episode
            table.expire_idle(1.0)

    def pending(self, agent_id: str) -> float:
        """The reward logged for the agent's last action so far."""
        return self._table(agent_id)[1].agent.pending_reward

    def fragments(self, agent_id: str) -> list[Fragment]:
        return self.tables[agent_id][2] if agent_id in self.tables else []


def _same_fragment(got: Fragment, want: Fragment) -> None:
    assert got.policy_id == _policy(got.agent_id)
    np.testing.assert_array_equal(got.obs, want.obs)
    np.testing.assert_array_equal(got.actions, want.actions)
    assert got.actions.dtype == want.actions.dtype
    np.testing.assert_array_equal(got.rewards, want.rewards)
    np.testing.assert_array_equal(got.behaviour_logp, want.behaviour_logp)  # NaN == NaN here
    np.testing.assert_array_equal(got.policy_chosen, want.policy_chosen)
    np.testing.assert_array_equal(got.weights_version, want.weights_version)
    assert (got.terminated, got.truncated) == (want.terminated, want.truncated)
    assert got.infos == want.infos
    Fragment.from_wire(got.to_wire())


def _play(seed: int, fragment_length: int, training: bool, ending: str) -> None:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    clock = FakeClock()
    sink: list[Fragment] = []
    table = EpisodeTable(fragment_length, 10, 10, sink.append, clock)
    table.start("ep", training, "", "me")
    episode = table.get("ep")
    ref = Reference(fragment_length, training)
    pool = [f"a{i}" for i in range(7)]
    ticks = 0
    refused = 0
    for _ in range(rng.randint(5, 40)):
        live = [a for a in pool if a not in ref.done]
        if not live:
            break
        kind = rng.random()
        if kind < 0.65:
            agents = rng.sample(live, rng.randint(1, len(live)))
            obs = [nrng.uniform(-1, 1, OBS_DIM[_policy(a)]).astype(np.float32) for a in agents]
            rewards = [
                round(rng.uniform(-2, 2), 3) if ref.acted(a) and rng.random() < 0.7 else 0.0
                for a in agents
            ]
            infos = None
            if rng.random() < 0.2:
                infos = [
                    {"tick": ticks, "agent": a} if rng.random() < 0.5 else None for a in agents
                ]
            actions = [
                rng.randrange(3) if _policy(a) == "p" else nrng.uniform(-1, 1, 2).astype(np.float32)
                for a in agents
            ]
            chosen = rng.random() < 0.8
            logps = [round(-rng.random(), 3) if chosen else math.nan for _ in agents]
            versions = {"p": rng.randrange(5), "q": rng.randrange(5)}
            observe_and_act(
                table,
                episode,
                agents,
                obs,
                rewards,
                infos,
                actions,
                logps,
                chosen,
                versions,
                "get_action" if chosen else "log_action",
            )
            for i, a in enumerate(agents):
                ref.step(
                    a,
                    obs[i],
                    rewards[i],
                    None if infos is None else infos[i],
                    actions[i],
                    logps[i],
                    chosen,
                    versions[_policy(a)],
                )
            ticks += 1
        elif kind < 0.85:
            acted = [a for a in live if ref.acted(a)]
            if not acted:
                continue
            agents = rng.sample(acted, rng.randint(1, len(acted)))
            rewards = [round(rng.uniform(-3, 3), 3) for _ in agents]
            infos = [{"r": r} for r in rewards] if rng.random() < 0.3 else None
            done = {
                a: rng.random() < 0.5 for a in rng.sample(acted, rng.randint(0, min(2, len(acted))))
            }
            table.log_returns_agents(episode, agents, rewards, infos, dict(done))
            for i, a in enumerate(agents):
                ref.reward(a, rewards[i], None if infos is None else infos[i])
            for a, terminated in done.items():
                ref.finish(a, None, terminated)
        else:
            refused += _refused_call(rng, nrng, table, episode, ref, live)
    assert refused >= 0
    if ending == "idle":
        clock.now += 1000.0
        [summary] = table.expire_idle(10.0)
        assert summary.reason == "idle_timeout"
        for a in pool:
            if a in ref.tables and a not in ref.done:
                ref.finish(a, None, False)
    else:
        truncated = ending == "truncated"
        live = [a for a in pool if a not in ref.done]
        named = rng.sample(live, rng.randint(0, len(live)))
        final = [nrng.uniform(-1, 1, OBS_DIM[_policy(a)]).astype(np.float32) for a in named]
        rewards = [round(rng.uniform(-1, 1), 3) if ref.acted(a) else 0.0 for a in named]
        summary = table.end_agents(episode, named, final, rewards, None, truncated)
        assert summary.reason == ending
        for i, a in enumerate(named):
            if ref.acted(a) and rewards[i]:
                ref.reward(a, rewards[i], None)
        for a in live:
            if a in ref.tables:
                given = named.index(a) if a in named else None
                ref.finish(a, None if given is None else final[given], not truncated)
    by_agent: dict[str, list[Fragment]] = {}
    for fragment in sink:
        assert fragment.episode_id == "ep"
        by_agent.setdefault(fragment.agent_id, []).append(fragment)
    for a in pool:
        want = ref.fragments(a)
        got = by_agent.pop(a, [])
        assert len(got) == len(want), (a, len(got), len(want))
        for g, w in zip(got, want, strict=True):
            _same_fragment(g, w)
    assert not by_agent
    assert summary.length == ticks
    total = sum(ref.returns.values())
    assert summary.episode_return == pytest.approx(total, rel=1e-12, abs=1e-9)
    per_policy: dict[str, float] = {}
    for a, value in ref.returns.items():
        per_policy[_policy(a)] = per_policy.get(_policy(a), 0.0) + value
    assert summary.policy_returns is not None
    assert set(summary.policy_returns) == set(per_policy)
    for policy_id, value in per_policy.items():
        assert summary.policy_returns[policy_id] == pytest.approx(value, rel=1e-12, abs=1e-9)


def _refused_call(
    rng: random.Random,
    nrng: np.random.Generator,
    table: EpisodeTable,
    episode: Episode,
    ref: Reference,
    live: list[str],
) -> int:
    """Make a call the table must refuse, changing nothing; 1 when one was made."""
    ok = [a for a in live if rng.random() < 0.5]
    choice = rng.randrange(5)

    def tick(agents: list[str], rewards: list[float]) -> None:
        obs = [np.zeros(OBS_DIM[_policy(a)], np.float32) for a in agents]
        actions = [0 if _policy(a) == "p" else np.zeros(2, np.float32) for a in agents]
        observe_and_act(
            table,
            episode,
            agents,
            obs,
            rewards,
            None,
            actions,
            [0.0] * len(agents),
            True,
            {"p": 0, "q": 0},
        )

    if choice == 0 and ref.done:
        gone = rng.choice(sorted(ref.done))
        with pytest.raises(EpisodeError, match=rf"agent '{gone}' \(policy '{_policy(gone)}'\)"):
            tick([*ok, gone], [0.0] * (len(ok) + 1))
        return 1
    if choice == 1:
        with pytest.raises(EpisodeError, match=r"agent 'a99' \(policy 'q'\).*has not acted"):
            tick([*ok, "a99"], [0.0] * len(ok) + [1.0])
        return 1
    acted = [a for a in live if ref.acted(a)]
    if choice == 2 and acted:
        a = rng.choice(acted)
        with pytest.raises(SpaceError, match=rf"agent '{a}'.*reward 2000000000\.0 is out of range"):
            tick([*[b for b in ok if b != a], a], [0.0] * len([b for b in ok if b != a]) + [2e9])
        return 1
    if choice == 3 and acted:
        a = rng.choice(acted)
        with pytest.raises(EpisodeError, match=r"agent 'a98' \(policy '\?'\), which has not"):
            table.log_returns_agents(episode, [a, "a98"], [1.0, 1.0], None, {})
        with pytest.raises(EpisodeError, match=r"marks agent 'a97' done, but it has not acted"):
            table.log_returns_agents(episode, [a], [1.0], None, {"a97": True})
        return 1
    if choice == 4 and acted:
        a = rng.choice(acted)
        if abs(ref.pending(a)) > 1e3:
            return 0
        table.log_returns_agents(episode, [a], [6e8], None, {})
        ref.reward(a, 6e8, None)
        with pytest.raises(
            SpaceError, match=rf"agent '{a}': reward 600000000\.0 makes.* up to 1200"
        ):
            table.log_returns_agents(episode, [a], [6e8], None, {})
        return 1
    return 0


@pytest.mark.parametrize("seed", range(60))
def test_a_multi_agent_episode_is_single_agent_episodes_per_agent(seed: int) -> None:
    fragment_length = (1, 2, 3, 5, 100)[seed % 5]
    ending = ("terminated", "truncated", "idle")[seed % 3]
    _play(seed, fragment_length, training=seed % 7 != 3, ending=ending)


# -- the rules, one by one ---------------------------------------------------------------------


def _table(fragment_length: int = 100) -> tuple[EpisodeTable, Episode, list[Fragment]]:
    sink: list[Fragment] = []
    table = EpisodeTable(fragment_length, 10, 10, sink.append, FakeClock())
    table.start("ep", True, "", "me")
    return table, table.get("ep"), sink


def _act(table: EpisodeTable, episode: Episode, agents: list[str], reward: float = 0.0) -> None:
    obs = [np.full(OBS_DIM[_policy(a)], 0.5, np.float32) for a in agents]
    actions = [1 if _policy(a) == "p" else np.ones(2, np.float32) for a in agents]
    rewards = [reward] * len(agents) if reward else None
    observe_and_act(
        table,
        episode,
        agents,
        obs,
        rewards,
        None,
        actions,
        [-0.5] * len(agents),
        True,
        {"p": 3, "q": 4},
    )


def test_the_agents_of_one_tick_are_one_step_of_the_episode() -> None:
    table, episode, sink = _table()
    _act(table, episode, ["a0", "a1", "a2"])
    _act(table, episode, ["a0"], reward=1.0)
    summary = table.end_agents(episode, [], [], None, None, truncated=False)
    assert summary.length == 2
    assert summary.episode_return == 1.0
    assert summary.policy_returns == {"p": 1.0, "q": 0.0}
    assert sorted((f.agent_id, len(f)) for f in sink) == [("a0", 2), ("a1", 1), ("a2", 1)]
    assert {f.agent_id: f.policy_id for f in sink} == {"a0": "p", "a1": "q", "a2": "p"}
    assert all(f.terminated and not f.truncated for f in sink)


def test_an_episode_is_single_or_multi_agent_not_both() -> None:
    table, episode, _ = _table()
    table.observe(episode, np.zeros(2, np.float32), None)
    table.act(episode, 0, -0.5, True, 0)
    with pytest.raises(EpisodeError, match="names agents, but the episode is single-agent"):
        _act(table, episode, ["a0"])
    table2, episode2, _ = _table()
    _act(table2, episode2, ["a0"])
    with pytest.raises(EpisodeError, match="names no agent, but the episode is multi-agent"):
        table2.observe(episode2, np.zeros(2, np.float32), None)


def test_an_agent_keeps_its_policy() -> None:
    table, episode, _ = _table()
    _act(table, episode, ["a0"])
    with pytest.raises(EpisodeError, match=r"agent 'a0' acts for policy 'p'.*not 'q'"):
        observe_only(table, episode, ["a0"], ["q"], [np.zeros(3, np.float32)])
    _act(table, episode, ["a0"])  # nothing changed


def test_a_call_while_the_actions_are_computed_is_refused() -> None:
    table, episode, _ = _table()
    observe_only(table, episode, ["a0"], ["p"], [np.zeros(2, np.float32)])
    with pytest.raises(EpisodeError, match="still being answered"):
        table.log_returns_agents(episode, ["a0"], [0.0], None, {})
    with pytest.raises(EpisodeError, match="still being answered"):
        table.end_agents(episode, [], [], None, None, truncated=False)


def test_a_done_agent_cannot_act_be_rewarded_or_be_done_again() -> None:
    table, episode, sink = _table()
    _act(table, episode, ["a0", "a1"])
    table.log_returns_agents(episode, ["a0"], [1.0], None, {"a0": True})
    assert [f.agent_id for f in sink] == ["a0"] and sink[0].terminated
    for call in (
        lambda: _act(table, episode, ["a1", "a0"]),
        lambda: table.log_returns_agents(episode, ["a0"], [1.0], None, {}),
        lambda: table.log_returns_agents(episode, [], [], None, {"a0": False}),
    ):
        with pytest.raises(EpisodeError, match=r"agent 'a0' \(policy 'p'\) is done"):
            call()
    _act(table, episode, ["a1"], reward=2.0)
    summary = table.end_agents(episode, [], [], None, None, truncated=True)
    assert summary.episode_return == 3.0
    assert [f.agent_id for f in sink] == ["a0", "a1"]


def test_an_info_for_an_agent_that_has_not_acted_is_not_kept() -> None:
    table, episode, sink = _table()
    _act(table, episode, ["a0"])
    # 'a2' has not acted: its zero reward and its info have no step to go with.
    table.log_returns_agents(episode, ["a0", "a2"], [1.0, 0.0], [{"x": 1}, {"y": 2}], {})
    _act(table, episode, ["a0", "a2"])
    table.end_agents(episode, [], [], None, None, truncated=False)
    infos = {f.agent_id: f.infos for f in sink}
    assert infos == {"a0": [{"x": 1}, None], "a2": None}


def test_end_names_agents_that_never_acted_without_keeping_them() -> None:
    table, episode, sink = _table()
    _act(table, episode, ["a0"])
    summary = table.end_agents(
        episode,
        ["a0", "a4"],
        [np.ones(2, np.float32), np.ones(2, np.float32)],
        None,
        None,
        truncated=True,
    )
    assert summary.length == 1
    [f] = sink
    assert f.agent_id == "a0" and f.truncated
    np.testing.assert_array_equal(f.obs[-1], np.ones(2, np.float32))


def test_many_agents_in_lockstep_cut_their_fragments_together() -> None:
    table, episode, sink = _table(fragment_length=4)
    agents = [f"a{2 * i}" for i in range(50)]  # all of policy p
    for tick in range(9):
        _act(table, episode, agents, reward=0.5 if tick else 0.0)
    assert len(sink) == 2 * len(agents)
    assert all(len(f) == 4 for f in sink)
    table.end_agents(episode, agents, [np.zeros(2, np.float32)] * 50, None, None, False)
    assert len(sink) == 3 * len(agents)
    last = sink[-1]
    assert len(last) == 1 and last.terminated
    np.testing.assert_array_equal(last.rewards, [0.0])
    np.testing.assert_array_equal(sink[0].rewards, [0.5, 0.5, 0.5, 0.5])
