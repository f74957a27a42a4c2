"""A served Algorithm with RLlib's ``policy_mapping_fn`` (``unity3d_server.py``'s form).

The function runs in the server: asked once per agent per episode, for remote inference when the
agent first appears, for local inference through ``map_agents``; rules stay the fast path.
"""

from __future__ import annotations

import math
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import PolicyClient
from rlserve.algorithm import PPOConfig
from rlserve.algorithm.network import NetworkAlgorithm
from rlserve.algorithm.network_config import mapping_function_of, run_folder_config
from rlserve.client.local import LocalConfig
from rlserve.errors import ConfigError, SpaceError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.framing import FrameDecoder, frame

RED = (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2))
BLUE = (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(3))


class MappingFn:
    """``red*`` agents act for ``red``, the others for ``blue``; ``bad*`` agents make it raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, agent_id: str, episode: Any, **kwargs: Any) -> str:
        with self.lock:
            self.calls.append((episode.episode_id, agent_id))
        if agent_id.startswith("bad"):
            raise ValueError("no policy for bad agents")
        return "red" if agent_id.startswith("red") else "blue"

    def taken(self) -> list[tuple[str, str]]:
        """The calls so far, forgotten here."""
        with self.lock:
            calls, self.calls = self.calls, []
        return calls


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NetworkAlgorithm, MappingFn]]:
    fn = MappingFn()
    algo = (
        PPOConfig()
        .multi_agent(
            policies={"red": (None, *RED, {}), "blue": (None, *BLUE, {})},
            policy_mapping_fn=fn,
            policy_mapping={"boss": "red"},  # a rule: "boss" would be blue by the function
        )
        .training(train_batch_size=64, minibatch_size=32, num_epochs=1)
        .serving(host="127.0.0.1", port=0)
        .reporting(run_dir=str(tmp_path_factory.mktemp("runs")), name="fn")
        .debugging(seed=3)
        .build()
    )
    assert isinstance(algo, NetworkAlgorithm) and algo.address is not None
    yield algo, fn
    algo.stop()


def observations(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One tick of a team: red agents see 4 numbers, blue ones 2, the boss (red by rule) 4."""
    return {
        "red_1": rng.uniform(-1, 1, 4).astype(np.float32),
        "blue_1": rng.uniform(-1, 1, 2).astype(np.float32),
        "boss": rng.uniform(-1, 1, 4).astype(np.float32),
    }


def play(client: PolicyClient, episode_id: str, rng: np.random.Generator) -> None:
    """Three ticks and the end of one episode; every action in its agent's policy's space."""
    client.start_episode(episode_id)
    for _ in range(3):
        actions = client.get_action(episode_id, observations(rng))
        assert set(actions) == {"red_1", "blue_1", "boss"}
        assert actions["red_1"] in (0, 1) and actions["boss"] in (0, 1)
        assert actions["blue_1"] in (0, 1, 2)
        client.log_returns(episode_id, {"red_1": 1.0, "blue_1": 0.5, "boss": 0.0})
    client.end_episode(episode_id, observations(rng))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["remote", "local"])
def test_the_function_is_asked_once_per_agent_per_episode(
    served: tuple[NetworkAlgorithm, MappingFn], mode: str
) -> None:
    algo, fn = served
    assert algo.address is not None
    fn.taken()
    rng = np.random.default_rng(0)
    local = LocalConfig(batch_steps=4, batch_interval=0.1) if mode == "local" else None
    client = PolicyClient(algo.address, mode, update_interval=None, local=local, seed=1)
    try:
        for episode_id in (f"{mode}-1", f"{mode}-2"):
            play(client, episode_id, rng)
        if client.local is not None:
            assert client.local.flush(60.0)
            assert client.local.shipped_steps > 0 and client.local.rejected_steps == 0
    finally:
        client.close()
    calls = fn.taken()
    # Each new agent once per episode; "boss" never: its rule decides.
    assert Counter(calls) == {
        (f"{mode}-1", "red_1"): 1,
        (f"{mode}-1", "blue_1"): 1,
        (f"{mode}-2", "red_1"): 1,
        (f"{mode}-2", "blue_1"): 1,
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["remote", "local"])
def test_an_error_of_the_function_names_the_agent_and_the_server_goes_on(
    served: tuple[NetworkAlgorithm, MappingFn], mode: str
) -> None:
    algo, _ = served
    assert algo.address is not None
    rng = np.random.default_rng(1)
    client = PolicyClient(algo.address, mode, update_interval=None, seed=2)
    try:
        client.start_episode(f"bad-{mode}")
        with pytest.raises(
            SpaceError, match=r"policy_mapping_fn raised .*'bad_1'.*fix the function"
        ):
            client.get_action(f"bad-{mode}", {"bad_1": np.zeros(2, np.float32)})
        # The episode, the connection and the server go on.
        actions = client.get_action(f"bad-{mode}", observations(rng))
        assert set(actions) == {"red_1", "blue_1", "boss"}
    finally:
        client.close()


def _hello(port: int, **fields: Any) -> dict[str, Any]:
    """One raw ``hello`` on a new binary connection, and its reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(frame(encode({"type": "hello", "id": 1, "protocol_version": 1, **fields})))
        decoder = FrameDecoder(1 << 24)
        while True:
            data = sock.recv(65536)
            assert data, "the server closed the connection without a reply"
            bodies = decoder.feed(data)
            if bodies:
                return decode(bodies[0])


@pytest.mark.timeout(60)
def test_a_local_client_that_cannot_ask_is_refused_with_the_fix(
    served: tuple[NetworkAlgorithm, MappingFn],
) -> None:
    algo, _ = served
    port = algo.policy_server.port
    old = _hello(port, inference_mode="local")
    assert old["type"] == "error" and old["code"] == "version_mismatch"
    assert "map_agents" in old["message"] and "inference_mode='remote'" in old["message"]
    new = _hello(port, inference_mode="local", map_agents=True)
    assert new["type"] == "welcome" and new["map_agents"] is True
    assert new["mapping"] == [["boss", "red"]] and new["multi_agent"] is True
    remote = _hello(port)  # remote clients need nothing: the server maps their agents
    assert remote["type"] == "welcome"


def team_of(agent_id: str, episode: Any, **kwargs: Any) -> str:
    """A module-level mapping function: saved in the run folder by its name."""
    return "red" if agent_id.startswith("red") else "blue"


def test_a_run_folder_keeps_the_function_by_name(tmp_path: Path) -> None:
    algo = (
        PPOConfig()
        .multi_agent(
            policies={"red": (None, *RED, {}), "blue": (None, *BLUE, {})},
            policy_mapping_fn=team_of,
        )
        .serving(host="127.0.0.1", port=0)
        .reporting(run_dir=str(tmp_path), name="named")
    )
    served = NetworkAlgorithm(algo, background=False)  # writes the run folder, serves nothing
    try:
        folder = served.folder.path
        saved = (folder / "config.toml").read_text()
        assert f'name = "{team_of.__module__}:team_of"' in saved
        assert run_folder_config(folder, trust_code=True).policy_mapping_fn is team_of
        # A folder may come from anyone: without the caller's word its function is not taken.
        with pytest.raises(ConfigError, match="trust_code=True"):
            run_folder_config(folder)
    finally:
        served.stop()


def test_a_lambda_cannot_be_found_again_and_the_error_says_what_to_pass(
    served: tuple[NetworkAlgorithm, MappingFn],
) -> None:
    algo, _ = served
    with pytest.raises(
        ConfigError, match=r"pass config=\.\.\. with it to Algorithm.from_checkpoint"
    ):
        run_folder_config(algo.folder.path)


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"name": "team_of"}, 'name = "module:function"'),
        ({"name": "no_such_module_here:fn"}, "cannot be imported"),
        ({"name": "math:pi"}, "not callable"),
        ("math:floor", 'name = "module:function"'),
    ],
)
def test_a_bad_mapping_function_table_names_the_fix(table: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        mapping_function_of({"mapping_function": table}, "serve.toml", trust_code=True)
    assert mapping_function_of({}, "serve.toml", trust_code=False) is None
    floor = {"mapping_function": {"name": "math:floor"}}
    assert mapping_function_of(floor, "x", trust_code=True) is math.floor


def test_a_run_folder_naming_a_command_is_refused() -> None:
    """The audit's case: ``shutil:rmtree`` as the function the server calls with agent ids."""
    table = {"mapping_function": {"name": "shutil:rmtree"}}
    with pytest.raises(ConfigError, match=r"shutil:rmtree, a function.*--trust-code"):
        mapping_function_of(table, "runs/sent", trust_code=False)
