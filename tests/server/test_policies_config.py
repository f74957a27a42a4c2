"""``[policies.<id>]`` and ``[mapping]`` in a ``--config`` file: what they declare, each mistake
as one line naming file, line and key, and the round trip through the run folder."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.config.fields import load_config_file
from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.registry import ALGORITHMS
from rlserve.run.run_folder import RunFolder
from rlserve.server.config import ServerConfig
from rlserve.server.policies import (
    check_same_algorithms,
    policies_from_run,
    policy_paths,
    run_folder_form,
    single_policy,
)
from rlserve.server.policies_config import check_policies, read_mapping, read_policies

GOOD = """\
[ppo]
lr = 0.001

[policies.red]
spaces_from = "CartPole-v1"

[policies.red.ppo]
lr = 0.0005
hidden = [32]

[policies.blue]
observation_space = { type = "Box", shape = [2], low = -1.0, high = 1.0 }
action_space = { type = "Discrete", n = 3 }
frozen = true

[mapping]
"red_*" = "red"
"blue_*" = "blue"
"boss" = "blue"
"""


def load(tmp_path: Path, text: str) -> tuple[dict[str, Any], Any, str]:
    path = tmp_path / "run.toml"
    path.write_text(text)
    tables = load_config_file(str(path), {"ppo": PPOSettings}, free_tables=("policies", "mapping"))
    return tables, read_policies(str(path), tables["policies"]), str(path)


def test_policies_and_mapping_are_read_in_file_order(tmp_path: Path) -> None:
    tables, policies, path = load(tmp_path, GOOD)
    assert list(policies) == ["red", "blue"]
    red, blue = policies["red"], policies["blue"]
    assert red.observation_space == gym.make("CartPole-v1").observation_space
    assert red.ppo == {"lr": 0.0005, "hidden": (32,)}
    assert red.ppo_table({"lr": 0.001, "gamma": 0.9}) == {
        "lr": 0.0005,
        "gamma": 0.9,
        "hidden": (32,),
    }
    assert not red.frozen and red.init_checkpoint is None
    assert blue.observation_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert blue.action_space == gym.spaces.Discrete(3)
    assert blue.frozen
    mapping = read_mapping(path, tables["mapping"], policies)
    assert [mapping.resolve(a) for a in ("red_1", "blue_2", "boss")] == ["red", "blue", "blue"]


def test_a_spaces_file_and_an_init_checkpoint(tmp_path: Path) -> None:
    spaces = {
        "observation_space": {"type": "Box", "shape": [4], "low": 0.0, "high": 1.0},
        "action_space": {"type": "Discrete", "n": 2},
    }
    (tmp_path / "s.json").write_text(json.dumps(spaces))
    (tmp_path / "ckpt_0000007.pt").write_bytes(b"")
    text = (
        f'[policies.only]\nspaces_file = "{tmp_path / "s.json"}"\n'
        f'init_checkpoint = "{tmp_path / "ckpt_0000007.pt"}"\n'
    )
    _, policies, _ = load(tmp_path, text)
    assert policies["only"].action_space == gym.spaces.Discrete(2)
    assert policies["only"].init_checkpoint == str(tmp_path / "ckpt_0000007.pt")


MISTAKES = {
    "unknown policy in the mapping": (
        GOOD.replace('"boss" = "blue"', '"boss" = "blu"'),
        ["run.toml, line 19", "[mapping]", "'blu'", "did you mean 'blue'"],
    ),
    "misspelt policy key": (
        GOOD.replace("frozen = true", "fozen = true"),
        ["run.toml, line 14", "[policies.blue]", "unknown key 'fozen'", "did you mean 'frozen'"],
    ),
    "misspelt PPO override": (
        GOOD.replace("lr = 0.0005", "learning_rte = 0.0005"),
        ["run.toml, line 8", "[policies.red.ppo]", "'learning_rte'"],
    ),
    "PPO override of the wrong type": (
        GOOD.replace("lr = 0.0005", 'lr = "slow"'),
        ["run.toml, line 8", "[policies.red.ppo]", "'lr' must be a number"],
    ),
    "frozen not a boolean": (
        GOOD.replace("frozen = true", 'frozen = "yes"'),
        ["run.toml, line 14", "'frozen' must be true or false"],
    ),
    "two ways of giving spaces": (
        GOOD.replace(
            'spaces_from = "CartPole-v1"', 'spaces_from = "CartPole-v1"\nspaces_file = "x"'
        ),
        ["line 4", "[policies.red]", "one way", "spaces_from, spaces_file"],
    ),
    "half of the inline spaces": (
        GOOD.replace('action_space = { type = "Discrete", n = 3 }\n', ""),
        ["line 12", "[policies.blue]", "both observation_space and action_space"],
    ),
    "a malformed inline space": (
        GOOD.replace('{ type = "Discrete", n = 3 }', '{ type = "Discrete" }'),
        ["line 13", "[policies.blue] action_space: malformed Discrete", "docs/protocol.md"],
    ),
    "an unknown env": (
        GOOD.replace("CartPole-v1", "NoSuchEnv-v0"),
        ["line 5", "[policies.red]", "spaces_from NoSuchEnv-v0"],
    ),
    "a policy id that is no folder name": (
        GOOD.replace("[policies.blue]", '[policies."blue team"]'),
        ["[policies.blue team]", "not allowed"],
    ),
    "a missing init checkpoint": (
        GOOD.replace("frozen = true", 'frozen = true\ninit_checkpoint = "nope/ckpt_0000001.pt"'),
        ["line 15", "init_checkpoint nope/ckpt_0000001.pt: no such readable file"],
    ),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_a_policies_mistake_is_one_line_naming_the_place(case: str, tmp_path: Path) -> None:
    text, fragments = MISTAKES[case]
    with pytest.raises(ConfigError) as caught:
        tables, policies, path = load(tmp_path, text)
        read_mapping(path, tables["mapping"], policies)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_each_policys_whole_ppo_table_and_spaces_are_checked(tmp_path: Path) -> None:
    _, policies, _ = load(tmp_path, GOOD.replace("hidden = [32]", "minibatch_size = 4096"))
    with pytest.raises(ConfigError, match=r"^policy 'red': minibatch_size 4096 is larger"):
        check_policies(policies, {"train_batch_size": 1024})
    blue = policies["blue"]
    check_policies(single_policy(blue.observation_space, blue.action_space), {})


def test_the_run_folder_keeps_the_policies_and_the_mapping(tmp_path: Path) -> None:
    tables, policies, path = load(tmp_path, GOOD)
    mapping = read_mapping(path, tables["mapping"], policies)
    run = RunFolder.create(str(tmp_path), "run")
    extra, spaces = run_folder_form(policies, mapping)
    run.save({"server": {}, "ppo": {"lr": 0.001}, **extra}, spaces)
    saved, saved_spaces = RunFolder.existing(run.path).load()
    again, again_mapping = policies_from_run(saved, saved_spaces)
    assert list(again) == ["red", "blue"]
    for pid, spec in policies.items():
        assert again[pid].spaces() == spec.spaces()
        assert (again[pid].frozen, again[pid].init_checkpoint) == (spec.frozen, None)
        assert again[pid].ppo_table({}) == {
            k: list(v) if isinstance(v, tuple) else v for k, v in spec.ppo.items()
        }
    assert again_mapping is not None and again_mapping.rules == mapping.rules
    # Each policy's files in its own folder.
    assert (
        policy_paths(run.path, "red", flat=False).weights == run.path / "policies/red/weights.npz"
    )


def test_a_single_policy_run_folder_is_saved_as_always(tmp_path: Path) -> None:
    policies = single_policy(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2))
    extra, spaces = run_folder_form(policies, None)
    assert extra == {}
    assert set(spaces) == {"observation_space", "action_space"}
    again, mapping = policies_from_run({"server": {}}, spaces)
    assert list(again) == ["default"] and mapping is None
    paths = policy_paths(tmp_path, "default", flat=True)
    assert paths.checkpoints == tmp_path / "checkpoints"
    assert paths.weights == tmp_path / "weights" / "policy.npz"


def assert_one_line_error(done: Any, *fragments: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_the_command_refuses_policies_mistakes_before_creating_anything(
    run_rlserve: Any, tmp_path: Path
) -> None:
    (tmp_path / "p.toml").write_text(GOOD.replace('"boss" = "blue"', '"boss" = "green"'))
    done = run_rlserve("serve", "--config", "p.toml", "--port", "0", "--http-port", "0")
    assert_one_line_error(done, "p.toml, line 19: [mapping]", "'green'", "red, blue")
    (tmp_path / "q.toml").write_text(GOOD)
    done = run_rlserve("serve", "--config", "q.toml", "--spaces-from", "CartPole-v1")
    assert_one_line_error(done, "[policies] gives each policy its spaces", "--spaces-from")
    assert not (tmp_path / "runs").exists()


def test_an_unimportable_mapping_function_is_refused_before_creating_anything(
    run_rlserve: Any, tmp_path: Path
) -> None:
    text = GOOD + '\n[mapping_function]\nname = "no_such_module_here:team_of"\n'
    (tmp_path / "f.toml").write_text(text)
    done = run_rlserve("serve", "--config", "f.toml", "--port", "0", "--http-port", "0")
    assert_one_line_error(done, "f.toml", "no_such_module_here:team_of", "cannot be imported")
    assert not (tmp_path / "runs").exists()


def test_the_shipped_example_declares_two_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).parents[2]
    monkeypatch.chdir(root)  # its paths are relative to the working folder, as documented
    example = root / "examples" / "policies.toml"
    classes = {"server": ServerConfig, "ppo": PPOSettings}
    tables = load_config_file(str(example), classes, ("policies", "mapping"))
    policies = read_policies(str(example), tables["policies"])
    assert list(policies) == ["red", "blue"]
    mapping = read_mapping(str(example), tables["mapping"], policies)
    assert mapping.resolve("blue_7") == "blue"
    check_policies(policies, tables["ppo"])


MIXED = """\
[ppo]
train_batch_size = 256
minibatch_size = 64

[dqn]
learning_starts = 300
lr = 0.002

[policies.red]
spaces_from = "CartPole-v1"

[policies.red.ppo]
lr = 0.0005

[policies.green]
spaces_from = "CartPole-v1"
algo = "dqn"

[policies.green.dqn]
buffer_size = 5000
"""


def load_mixed(tmp_path: Path, text: str, algo: str | None = None) -> Any:
    path = tmp_path / "mixed.toml"
    path.write_text(text)
    classes = {name: entry.settings for name, entry in ALGORITHMS.items()}
    tables = load_config_file(str(path), classes, free_tables=("policies", "mapping"))
    return tables, read_policies(str(path), tables["policies"], algo)


def test_a_policy_names_its_algorithm_and_overrides_that_algorithms_table(
    tmp_path: Path,
) -> None:
    tables, policies = load_mixed(tmp_path, MIXED)
    red, green = policies["red"], policies["green"]
    assert (red.algo, red.algorithm_of(None), red.config) == (None, "ppo", {"lr": 0.0005})
    assert (green.algo, green.config) == ("dqn", {"buffer_size": 5000})
    # A policy's settings: its algorithm's defaults, that algorithm's top table, its overrides.
    settings = green.settings_table(tables["dqn"])
    assert settings == {"learning_starts": 300, "lr": 0.002, "buffer_size": 5000}
    check_policies(policies, tables["ppo"], "ppo", {"dqn": tables["dqn"]})
    # The run's algorithm is that of a policy that names none.
    _, under_dqn = load_mixed(tmp_path, MIXED.replace("[policies.red.ppo]\nlr = 0.0005\n", ""))
    assert under_dqn["red"].algorithm_of("dqn") == "dqn"


MIXED_MISTAKES = {
    "an unknown algorithm": (
        MIXED.replace('algo = "dqn"', 'algo = "a2c"'),
        None,
        ["mixed.toml, line 17", "[policies.green]", "unknown algorithm 'a2c'", "ppo ("],
    ),
    "an algorithm that is no string": (
        MIXED.replace('algo = "dqn"', "algo = 3"),
        None,
        ["line 17", "[policies.green]", "'algo' must be a string"],
    ),
    "the table of another algorithm than the policy's own": (
        MIXED.replace("[policies.green.dqn]", "[policies.green.ppo]"),
        None,
        [
            "mixed.toml, line 19",
            "[policies.green.ppo] sets ppo settings",
            "trained by dqn (algo = 'dqn')",
            "rename the table [policies.green.dqn], or set algo = 'ppo' in [policies.green]",
        ],
    ),
    "a ppo table when the run's algorithm is dqn": (
        MIXED,
        "dqn",
        [
            "line 12",
            "[policies.red.ppo] sets ppo settings",
            "trained by dqn (the run's algorithm, dqn)",
            "[policies.red.dqn]",
        ],
    ),
    "a key the policy's algorithm does not have": (
        MIXED.replace("buffer_size = 5000", "clip_coef = 0.2"),
        None,
        ["line 20", "[policies.green.dqn]", "'clip_coef'"],
    ),
}


@pytest.mark.parametrize("case", sorted(MIXED_MISTAKES))
def test_a_mixed_policies_mistake_is_one_line_naming_the_fix(case: str, tmp_path: Path) -> None:
    text, algo, fragments = MIXED_MISTAKES[case]
    with pytest.raises(ConfigError) as caught:
        load_mixed(tmp_path, text, algo)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_each_policys_spaces_are_checked_against_its_own_algorithm(tmp_path: Path) -> None:
    text = MIXED.replace(
        'spaces_from = "CartPole-v1"\nalgo = "dqn"', 'spaces_from = "Pendulum-v1"\nalgo = "dqn"'
    )
    tables, policies = load_mixed(tmp_path, text)
    with pytest.raises(UnsupportedSpaceError) as caught:
        check_policies(policies, tables["ppo"], "ppo", {"dqn": tables["dqn"]})
    message = str(caught.value)
    assert message.startswith("policy 'green': dqn learns Discrete action spaces only"), message
    assert message.endswith("the algorithms that learn these spaces: ppo, sac"), message
    # Each policy's whole table of its own algorithm is checked too.
    _, policies = load_mixed(tmp_path, MIXED.replace("buffer_size = 5000", "buffer_size = 8"))
    batch = DQNSettings().batch_size
    with pytest.raises(ConfigError, match=rf"^policy 'green': batch_size {batch} is larger"):
        check_policies(policies, tables["ppo"], "ppo", {"dqn": {}})


def test_the_run_folder_records_each_policys_algorithm(tmp_path: Path) -> None:
    tables, policies = load_mixed(tmp_path, MIXED)
    run = RunFolder.create(str(tmp_path), "mixed")
    extra, spaces = run_folder_form(policies, None, "ppo")
    assert extra["policies"]["red"] == {"frozen": False, "algo": "ppo", "ppo": {"lr": 0.0005}}
    assert extra["policies"]["green"]["dqn"] == {"buffer_size": 5000}
    run.save({"server": {}, "ppo": tables["ppo"], "dqn": tables["dqn"], **extra}, spaces)
    saved, saved_spaces = RunFolder.existing(run.path).load()
    again, _ = policies_from_run(saved, saved_spaces)
    assert {pid: (s.algo, s.config) for pid, s in again.items()} == {
        "red": ("ppo", {"lr": 0.0005}),
        "green": ("dqn", {"buffer_size": 5000}),
    }
    check_same_algorithms(saved, again, "ppo")
    # A resumed policy whose algorithm changed is refused: its checkpoints are another's.
    changed = dict(again)
    changed["green"] = dataclasses.replace(again["green"], algo="sac")
    with pytest.raises(
        ConfigError,
        match=r"policy 'green' of this run is trained by dqn.*"
        r"declare it with algo = 'dqn'.*or start a new run",
    ):
        check_same_algorithms(saved, changed, "ppo")
    # A policy that names none takes the run's: resumed under another, it is refused too.
    again["red"].algo = None
    with pytest.raises(ConfigError, match="policy 'red' of this run is trained by ppo"):
        check_same_algorithms(saved, again, "dqn")


def test_an_older_run_folder_is_read_as_ppo_policies(tmp_path: Path) -> None:
    """Run folders from before policies named their algorithm: [policies.<id>.ppo] only."""
    tables = {
        "algorithm": {"name": "ppo"},
        "policies": {"red": {"frozen": False, "ppo": {"lr": 0.001}}},
    }
    box = {"type": "Box", "shape": [2], "low": -1.0, "high": 1.0}
    spaces = {
        "policies": {
            "red": {"observation_space": box, "action_space": {"type": "Discrete", "n": 2}}
        }
    }
    policies, _ = policies_from_run(tables, spaces)
    assert (policies["red"].algo, policies["red"].config) == ("ppo", {"lr": 0.001})


def test_a_frame_stack_the_image_cannot_hold_is_refused_before_serving() -> None:
    image = single_policy(gym.spaces.Box(0, 255, (6, 6, 1), np.uint8), gym.spaces.Discrete(2))
    check_policies(image, {"frame_stack": 4})
    with pytest.raises(ConfigError, match="stack at most 5 frames"):
        check_policies(image, {"frame_stack": 6})
    with pytest.raises(ConfigError, match=r"frame_stack must be a whole number from 1 \(off\)"):
        check_policies(image, {"frame_stack": 0})
