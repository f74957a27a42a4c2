"""ExternalEnv and ExternalMultiAgentEnv hosted by ExternalEnvSource, driven by a tiny loop."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.env import (
    ALL_AGENTS,
    SINGLE_AGENT,
    ExternalEnv,
    ExternalEnvSource,
    ExternalMultiAgentEnv,
    ExternalPoll,
)
from rlserve.errors import CapacityError, EnvError, EpisodeError, SpaceError

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACT = gym.spaces.Discrete(3)


def _obs(x: float) -> np.ndarray:
    return np.array([x, -x], np.float32)


def _drive(source: ExternalEnvSource, action: int = 2, max_polls: int = 2000) -> list[ExternalPoll]:
    """Poll until run() returned and nothing is left; answer every get_action with ``action``."""
    polls = []
    for _ in range(max_polls):
        poll = source.poll()
        if poll.is_empty():
            if not source.running:
                return polls
            continue
        polls.append(poll)
        actions: dict[Any, dict[Any, Any]] = {}
        for env_id, obs in poll.obs.items():
            done = {**poll.terminated.get(env_id, {}), **poll.truncated.get(env_id, {})}
            if env_id not in poll.off_policy_actions and not poll.episode_over(env_id):
                wanting = [a for a in obs if not done.get(a)]
                if wanting:
                    actions[env_id] = dict.fromkeys(wanting, action)
        source.send_actions(actions)
    raise AssertionError("run() did not finish")


class Scripted(ExternalEnv):
    """One training episode, then one with training disabled."""

    def __init__(self) -> None:
        super().__init__(ACT, OBS, max_concurrent=4)
        self.actions: list[Any] = []

    def run(self) -> None:
        eid = self.start_episode("e1")
        self.log_returns(eid, 5.0)  # before the first action: no step to belong to
        self.actions.append(self.get_action(eid, _obs(0.1)))
        self.log_returns(eid, 1.0)
        self.log_returns(eid, 0.5, {"k": 1})
        self.log_action(eid, _obs(0.2), 1)
        self.log_returns(eid, 2.0)
        self.end_episode(eid, _obs(0.3))
        eval_id = self.start_episode("e2", training_enabled=False)
        self.actions.append(self.get_action(eval_id, _obs(0.4)))
        self.end_episode(eval_id, _obs(0.5), truncated=True)


@pytest.mark.timeout(15)
def test_run_loop_produces_the_expected_polls() -> None:
    env = Scripted()
    source = ExternalEnvSource(env)
    assert source.observation_spaces == {SINGLE_AGENT: OBS} and not source.multi_agent
    polls = _drive(source, action=2)
    assert env.actions == [2, 2]
    # e1's end and e2's first call may share a poll: split the polls by episode.
    first, logged, end = [p for p in polls if "e1" in p.obs]
    eval_first, eval_end = [p for p in polls if "e2" in p.obs]
    np.testing.assert_array_equal(first.obs["e1"][SINGLE_AGENT], _obs(0.1))
    assert first.rewards["e1"] == {SINGLE_AGENT: 5.0} and not first.off_policy_actions
    assert not first.training_disabled
    assert logged.rewards["e1"] == {SINGLE_AGENT: 1.5}
    assert logged.infos["e1"] == {SINGLE_AGENT: {"k": 1}}
    assert logged.off_policy_actions["e1"] == {SINGLE_AGENT: 1}
    assert not logged.episode_over("e1")
    assert end.rewards["e1"] == {SINGLE_AGENT: 2.0}
    assert end.terminated["e1"] == {SINGLE_AGENT: True, ALL_AGENTS: True}
    assert end.truncated["e1"] == {SINGLE_AGENT: False, ALL_AGENTS: False}
    np.testing.assert_array_equal(end.obs["e1"][SINGLE_AGENT], _obs(0.3))
    assert eval_first.training_disabled == {"e2"} and eval_end.training_disabled == {"e2"}
    assert eval_end.truncated["e2"][ALL_AGENTS] and not eval_end.terminated["e2"][ALL_AGENTS]


class Idle(ExternalEnv):
    def __init__(self, max_concurrent: int = 100) -> None:
        super().__init__(ACT, OBS, max_concurrent)

    def run(self) -> None:
        return None


@pytest.mark.timeout(15)
def test_episode_errors_match_the_client() -> None:
    env = Idle(max_concurrent=2)
    with pytest.raises(EpisodeError, match="unknown episode 'nope'"):
        env.get_action("nope", _obs(0))
    with pytest.raises(EpisodeError, match="unknown episode"):
        env.log_returns("nope", 1.0)
    eid = env.start_episode("a")
    with pytest.raises(EpisodeError, match="already active"):
        env.start_episode("a")
    env.start_episode("b")
    with pytest.raises(CapacityError, match="max_concurrent"):
        env.start_episode("c")
    with pytest.raises(SpaceError, match=r"shape \(3,\)"):
        env.log_action(eid, np.zeros(3, np.float32), 0)
    with pytest.raises(SpaceError, match="action"):
        env.log_action(eid, _obs(0), 7)
    with pytest.raises(SpaceError, match="must be a number"):
        env.log_returns(eid, "1")  # type: ignore[arg-type]
    with pytest.raises(SpaceError, match="out of range"):
        env.log_returns(eid, float("nan"))
    env.end_episode(eid, _obs(0))
    with pytest.raises(EpisodeError, match="has ended"):
        env.end_episode(eid, _obs(0))
    with pytest.raises(EpisodeError, match="has ended"):
        env.log_action(eid, _obs(0), 1)
    with pytest.raises(EpisodeError, match="has ended"):
        env.get_action(eid, _obs(0))
    with pytest.raises(EpisodeError, match="used before"):
        env.start_episode("a")
    env.start_episode("c")  # 'a' ended, so there is room again


class Crashing(ExternalEnv):
    def __init__(self) -> None:
        super().__init__(ACT, OBS)

    def run(self) -> None:
        eid = self.start_episode()
        self.get_action(eid, _obs(0))
        raise RuntimeError("simulator exploded")


@pytest.mark.timeout(15)
def test_an_exception_in_run_surfaces_from_poll() -> None:
    source = ExternalEnvSource(Crashing())
    with pytest.raises(EnvError, match=r"Crashing.run\(\) raised RuntimeError: simulator") as info:
        _drive(source)
    assert isinstance(info.value.__cause__, RuntimeError)


class Threaded(ExternalEnv):
    """Several threads, each running episodes of a few steps with seeded lengths."""

    def __init__(self, threads: int, episodes: int) -> None:
        super().__init__(ACT, OBS, max_concurrent=threads)
        self.threads, self.episodes = threads, episodes
        self.returned: list[int] = []
        self.lock = threading.Lock()

    def worker(self, k: int) -> None:
        rng = np.random.default_rng(k)
        for e in range(self.episodes):
            eid = self.start_episode(f"w{k}-{e}")
            for _ in range(int(rng.integers(1, 6))):
                action = self.get_action(eid, _obs(float(rng.uniform(-1, 1))))
                with self.lock:
                    self.returned.append(action)
                self.log_returns(eid, 1.0)
            self.end_episode(eid, _obs(0.0))

    def run(self) -> None:
        workers = [threading.Thread(target=self.worker, args=(k,)) for k in range(self.threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()


@pytest.mark.timeout(15)
def test_concurrent_threads_each_get_their_answers() -> None:
    env = Threaded(threads=4, episodes=3)
    polls = _drive(ExternalEnvSource(env), action=1)
    asked = sum(
        1
        for p in polls
        for eid in p.obs
        if not p.episode_over(eid) and eid not in p.off_policy_actions
    )
    ends = {eid for p in polls for eid in p.obs if p.episode_over(eid)}
    assert asked == len(env.returned) and set(env.returned) == {1}
    assert len(ends) == 12
    # Rewards arrive with the episode's next call: one per action.
    total = sum(r[SINGLE_AGENT] for p in polls for r in p.rewards.values())
    assert total == len(env.returned)


@pytest.mark.timeout(15)
def test_send_actions_checks_and_close_unblocks_get_action() -> None:
    class Waiting(ExternalEnv):
        def __init__(self) -> None:
            super().__init__(ACT, OBS)
            self.error: BaseException | None = None

        def run(self) -> None:
            try:
                self.get_action(self.start_episode("x"), _obs(0))
            except EnvError as exc:
                self.error = exc

    env = Waiting()
    source = ExternalEnvSource(env)
    poll = source.poll()
    while not poll.obs:
        poll = source.poll()
    with pytest.raises(EnvError, match="did not ask"):
        source.send_actions({"y": {SINGLE_AGENT: 0}})
    with pytest.raises(EnvError, match="no action for episode 'x'"):
        source.send_actions({})
    source.close()
    assert source._thread is not None
    source._thread.join(5)
    assert isinstance(env.error, EnvError) and "closed" in str(env.error)


class Team(ExternalMultiAgentEnv):
    def __init__(self) -> None:
        super().__init__(
            gym.spaces.Dict({"red": ACT, "blue": ACT}),
            gym.spaces.Dict({"red": OBS, "blue": OBS}),
        )
        self.answers: list[dict[str, Any]] = []

    def run(self) -> None:
        eid = self.start_episode("m")
        self.answers.append(self.get_action(eid, {"red": _obs(0.1), "blue": _obs(0.2)}))
        self.log_returns(eid, {"red": 1.0, "blue": -1.0}, multiagent_done_dict={"blue": True})
        self.answers.append(self.get_action(eid, {"red": _obs(0.3)}))
        self.log_action(eid, {"red": _obs(0.4)}, {"red": 0})
        self.log_returns(eid, {"red": 3.0}, multiagent_done_dict={ALL_AGENTS: True})
        self.end_episode(eid, {})  # a no-op after '__all__', as with the client


@pytest.mark.timeout(15)
def test_external_multi_agent_episode() -> None:
    env = Team()
    source = ExternalEnvSource(env)
    assert source.multi_agent and set(source.observation_spaces) == {"red", "blue"}
    polls = _drive(source, action=1)
    assert env.answers == [{"red": 1, "blue": 1}, {"red": 1}]
    first, blue_done, second, logged, end = polls
    assert set(first.obs["m"]) == {"red", "blue"}
    assert blue_done.obs["m"] == {} and blue_done.terminated["m"] == {"blue": True}
    assert blue_done.rewards["m"] == {"red": 1.0, "blue": -1.0}
    assert set(second.obs["m"]) == {"red"} and "m" not in second.rewards
    assert logged.off_policy_actions["m"] == {"red": 0}
    assert end.terminated["m"] == {"red": True, ALL_AGENTS: True}
    assert end.rewards["m"] == {"red": 3.0}


@pytest.mark.timeout(15)
def test_external_multi_agent_errors() -> None:
    env = ExternalMultiAgentEnv(ACT, OBS)  # one space shared by every agent
    eid = env.start_episode()
    with pytest.raises(SpaceError, match="dict of observations"):
        env.get_action(eid, _obs(0))
    with pytest.raises(SpaceError, match="different agents"):
        env.log_action(eid, {"a": _obs(0)}, {"b": 0})
    with pytest.raises(SpaceError, match=r"observation\['a'\]"):
        env.log_action(eid, {"a": np.zeros(5)}, {"a": 0})
    env.log_action(eid, {"a": _obs(0)}, {"a": 0})
    env.log_returns(eid, {"a": 1.0}, multiagent_done_dict={"a": True})
    with pytest.raises(EpisodeError, match="agent 'a' is done"):
        env.log_action(eid, {"a": _obs(0)}, {"a": 0})
    with pytest.raises(EpisodeError, match="agent 'a' is done"):
        env.log_returns(eid, {"a": 1.0})
    env.end_episode(eid, {})
    with pytest.raises(EpisodeError, match="has ended"):
        env.end_episode(eid, {})
