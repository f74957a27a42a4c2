"""Legal-move masks end to end: a real server, remote and local clients, a changing legal set.

The environment's observation is RLlib's action-mask form, ``Dict(action_mask, observations)``,
and its legal actions change every step. Neither inference mode may ever return an illegal
action; an observation whose mask has no legal action is refused (the server answers the call
with an error, the local policy raises) and the episode carries on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from e2e_support import small_ppo
from gymnasium import spaces

from rlserve import PolicyClient, SpaceError
from rlserve.client.local import LocalConfig
from rlserve.protocol.spaces import describe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ACTIONS = 5
OBSERVATION_SPACE = spaces.Dict(
    {
        "action_mask": spaces.MultiBinary(ACTIONS),
        "observations": spaces.Box(-1.0, 1.0, (2,), np.float32),
    }
)
ACTION_SPACE = spaces.Discrete(ACTIONS)
SMALL_PPO = small_ppo()
QUICK = LocalConfig(batch_steps=32, batch_interval=0.1)
STEPS = 300


class ShiftingLegalMoves:
    """Each step a random non-empty set of the 5 actions is legal; an illegal move is a bug."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def observe(self, legal_moves: int | None = None) -> dict[str, np.ndarray]:
        mask = (self.rng.random(ACTIONS) < 0.3).astype(np.int8)
        mask[self.rng.integers(0, ACTIONS)] = 1
        if legal_moves == 0:
            mask[:] = 0
        self.mask = mask
        return {"action_mask": mask, "observations": self.rng.uniform(-1, 1, 2).astype(np.float32)}


def _play(client: PolicyClient, seed: int) -> tuple[int, list[int]]:
    """Play episodes of 20 steps; return the steps and the actions taken when few were legal."""
    env = ShiftingLegalMoves(seed)
    steps, constrained = 0, []
    while steps < STEPS:
        eid = client.start_episode()
        for _ in range(20):
            obs = env.observe()
            action = int(client.get_action(eid, obs))
            assert env.mask[action] == 1, f"illegal action {action} for mask {env.mask}"
            if env.mask.sum() == 1:
                constrained.append(action)
            client.log_returns(eid, 1.0 if action == ACTIONS - 1 else 0.0)
            steps += 1
        # A finished game often leaves no legal move: a final observation is never acted on.
        client.end_episode(eid, env.observe(legal_moves=0), truncated=True)
    return steps, constrained


def _spaces_file(tmp_path: Path, observation_space: spaces.Space[Any]) -> Path:
    path = tmp_path / "spaces.json"
    path.write_text(
        json.dumps(
            {
                "observation_space": describe(observation_space),
                "action_space": describe(ACTION_SPACE),
            }
        )
    )
    return path


def _no_legal_move_is_refused_and_the_episode_carries_on(client: PolicyClient) -> None:
    env = ShiftingLegalMoves(7)
    eid = client.start_episode()
    client.get_action(eid, env.observe())
    with pytest.raises(SpaceError, match="no legal action; mark at least one legal action"):
        client.get_action(eid, env.observe(legal_moves=0))
    action = int(client.get_action(eid, env.observe()))
    assert env.mask[action] == 1
    if client.local is None:  # the server checks logged actions against the mask
        obs = env.observe()
        obs["action_mask"][:] = [0, 1, 1, 0, 1]
        with pytest.raises(SpaceError, match="took action 3, which its observation's"):
            client.log_action(eid, obs, 3)
        client.log_action(eid, obs, 4)
    client.end_episode(eid, env.observe(), truncated=True)


def _multi_agent_turns(client: PolicyClient) -> None:
    """Two players, each with its own legal set, in turns and together; a bad mask refused."""
    players = {"p1": ShiftingLegalMoves(11), "p2": ShiftingLegalMoves(12)}
    eid = client.start_episode()
    for turn in range(30):
        acting = ["p1", "p2"] if turn % 3 == 2 else [("p1", "p2")[turn % 2]]
        actions = client.get_action(eid, {p: players[p].observe() for p in acting})
        for player, action in actions.items():
            assert players[player].mask[int(action)] == 1, (player, action)
    with pytest.raises(SpaceError, match="no legal action"):
        client.get_action(
            eid, {"p1": players["p1"].observe(), "p2": players["p2"].observe(legal_moves=0)}
        )
    actions = client.get_action(eid, {"p2": players["p2"].observe()})
    assert players["p2"].mask[int(actions["p2"])] == 1
    if client.local is None:
        obs = players["p1"].observe()
        obs["action_mask"][:] = [1, 0, 1, 1, 1]
        with pytest.raises(SpaceError, match="took action 1"):
            client.log_action(eid, {"p1": obs}, {"p1": 1})
        client.log_action(eid, {"p1": obs}, {"p1": 2})
    client.end_episode(eid, {p: env.observe() for p, env in players.items()}, truncated=True)


def test_no_illegal_action_in_either_mode(launch_server: Any, tmp_path: Path) -> None:
    spaces_file = _spaces_file(tmp_path, OBSERVATION_SPACE)
    server = launch_server(*SMALL_PPO, "--seed", "3", spaces=("--spaces-file", str(spaces_file)))
    server.wait_for_weights(0)
    total = 0
    for mode, seed in (("remote", 1), ("local", 2)):
        local = QUICK if mode == "local" else None
        with PolicyClient(server.address, inference_mode=mode, local=local, timeout=30) as client:
            steps, constrained = _play(client, seed)
            assert constrained, "some steps had a single legal action"
            _no_legal_move_is_refused_and_the_episode_carries_on(client)
            total += steps
    for mode in ("remote", "local"):
        with PolicyClient(
            server.address, inference_mode=mode, multiagent=True, seed=4, timeout=30
        ) as client:
            _multi_agent_turns(client)
    metrics = server.wait_until(
        lambda m: m.get("learner/steps_trained", 0) > 0 and m["server/weights_version"] >= 1,
        what="an update trained on the masked steps",
    )
    assert metrics["learner/fragments_excluded_invalid"] == 0  # every action was legal


def test_a_mask_that_does_not_fit_is_refused_before_listening(
    run_rlserve: Any, tmp_path: Path
) -> None:
    wrong = spaces.Dict(
        {"action_mask": spaces.MultiBinary(4), "observations": spaces.Box(-1.0, 1.0, (2,))}
    )
    runs = tmp_path / "runs"
    done = run_rlserve(
        "serve",
        "--spaces-file",
        str(_spaces_file(tmp_path, wrong)),
        "--run-dir",
        str(runs),
        "--port",
        "0",
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "'action_mask' has 4 values but the action space" in done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stdout
