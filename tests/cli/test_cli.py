"""A user's mistakes on the command line get one line naming the file, line or key and the fix:
no traceback, a non-zero exit, and no run folder left behind."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlserve import __version__
from rlserve.cli.status import http_url
from rlserve.config.spaces_file import load_spaces_file
from rlserve.errors import ConfigError

EXAMPLES = Path(__file__).parents[2] / "examples"
GOOD_SPACES = {
    "observation_space": {"type": "Box", "low": -1.0, "high": 1.0, "shape": [3]},
    "action_space": {"type": "Discrete", "n": 2},
}

SPACES_MISTAKES = {
    "trailing comma": (
        '{"observation_space": {"type": "Box", "shape": [3]},\n "action_space": '
        '{"type": "Discrete", "n": 2,}}',
        ["spaces.json, line 2 column", "not valid JSON"],
    ),
    "misspelt top-level key": (
        json.dumps({**GOOD_SPACES, "action_spce": GOOD_SPACES["action_space"]}, indent=1),
        ["unknown key 'action_spce'", "did you mean 'action_space'"],
    ),
    "missing space": (
        json.dumps({"observation_space": GOOD_SPACES["observation_space"]}),
        ["'action_space' is missing", "examples/spaces.json"],
    ),
    "unknown key in a description": (
        """{
  "observation_space": {
    "type": "Dict",
    "spaces": {
      "pos": {"type": "Box", "shape": [2],
              "dtyp": "float32"}
    }
  },
  "action_space": {"type": "Discrete", "n": 2}
}""",
        ["line 6", "observation_space.spaces.pos has the unknown key 'dtyp'", "'dtype'"],
    ),
    "malformed description": (
        json.dumps({**GOOD_SPACES, "action_space": {"type": "Discrete"}}),
        ["action_space", "malformed Discrete", "section 6.2"],
    ),
}

CONFIG_MISTAKES = {
    "unknown table": ("[servr]\nport = 9000\n", ["rlserve.toml, line 1", "[servr]", "[server]"]),
    "unknown key": (
        "[server]\nport = 0\nidle_timeot = 5\n",
        ["rlserve.toml, line 3", "'idle_timeot'", "did you mean 'idle_timeout'"],
    ),
    "address not a string": (
        "[server]\nhost = 127\n",
        ["rlserve.toml, line 2", "'host' must be a string, got 127"],
    ),
    "bad TOML": ("[server]\nhost = 0.0.0.0\n", ["not valid TOML", "line 2", "need quotes"]),
    "wrong type in [ppo]": ('[ppo]\nlr = "fast"\n', ["line 2", "[ppo]", "'lr' must be a number"]),
}


def assert_one_line_error(done: Any, *fragments: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("rlserve: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(SPACES_MISTAKES))
def test_a_spaces_file_mistake_is_one_clear_line(
    case: str, run_rlserve: Any, tmp_path: Path
) -> None:
    text, fragments = SPACES_MISTAKES[case]
    (tmp_path / "spaces.json").write_text(text)
    done = run_rlserve("serve", "--spaces-file", "spaces.json", "--port", "0", "--http-port", "0")
    assert_one_line_error(done, *fragments)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("case", sorted(CONFIG_MISTAKES))
def test_a_config_file_mistake_is_one_clear_line(
    case: str, run_rlserve: Any, tmp_path: Path
) -> None:
    text, fragments = CONFIG_MISTAKES[case]
    (tmp_path / "rlserve.toml").write_text(text)
    done = run_rlserve(
        "serve", "--config", "rlserve.toml", "--spaces-from", "CartPole-v1", "--http-port", "0"
    )
    assert_one_line_error(done, *fragments)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag", ["--port", "--http-port"])
def test_a_port_in_use_is_one_clear_line_and_leaves_no_run_folder(
    flag: str, run_rlserve: Any, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        ports = {"--port": "0", "--http-port": "0", flag: port}
        done = run_rlserve(
            "serve", "--spaces-from", "CartPole-v1", "--name", "x", *sum(ports.items(), ())
        )
    assert_one_line_error(done, f"port {port} on 127.0.0.1 is in use", f"{flag} 0")
    assert not (tmp_path / "runs").exists()


def test_missing_files_are_named(run_rlserve: Any) -> None:
    done = run_rlserve("serve", "--spaces-file", "nope.json")
    assert_one_line_error(done, "--spaces-file nope.json: no such file", "examples/spaces.json")
    done = run_rlserve("serve", "--config", "nope.toml", "--spaces-from", "CartPole-v1")
    assert_one_line_error(done, "--config nope.toml: no such file", "examples/rlserve.toml")


def test_version_and_help(run_rlserve: Any) -> None:
    done = run_rlserve("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"rlserve {__version__}"
    shown = run_rlserve("--help")
    assert shown.returncode == 0
    for command in ("serve", "status", "demo", "export", "check-env"):
        # argparse puts the help of a name longer than 8 characters on the next line
        assert re.search(rf"\n    {command}(\n| )", shown.stdout), shown.stdout
    assert "``" not in shown.stdout and "{serve" not in shown.stdout


def test_status_of_a_folder_without_a_server(run_rlserve: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = run_rlserve("status", "empty")
    assert_one_line_error(done, "empty is not a run folder", "runs/<name>")
    never = tmp_path / "runs" / "never"
    never.mkdir(parents=True)
    (never / "config.toml").write_text("[server]\n")
    assert_one_line_error(run_rlserve("status", "runs/never"), "has no endpoints.json")
    assert_one_line_error(run_rlserve("status", "runs"), "a folder of runs", "runs/never")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    done = run_rlserve("status", f"127.0.0.1:{free}")
    assert_one_line_error(done, f"no rlserve server answers at http://127.0.0.1:{free}")


def test_the_shipped_spaces_example_loads() -> None:
    observation_space, action_space = load_spaces_file(EXAMPLES / "spaces.json")
    assert observation_space.shape is not None
    assert action_space is not None


def test_the_readme_shows_the_shipped_spaces_example() -> None:
    readme = (EXAMPLES.parent / "README.md").read_text()
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", readme, re.S)]
    shipped = json.loads((EXAMPLES / "spaces.json").read_text())
    assert shipped in blocks
    assert "examples/spaces.json" in readme


BROKEN_ENV = """
import gymnasium as gym
import numpy as np


class WrongShape(gym.Env):
    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, True, False, {}
"""


@pytest.mark.timeout(60)
def test_check_env_exit_codes(run_rlserve: Any, tmp_path: Path) -> None:
    corridor = str(EXAMPLES / "corridor.py")
    done = run_rlserve(
        "check-env", f"{corridor}:SimpleCorridor", "--env-config", '{"corridor_length": 3}'
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("env SimpleCorridor: 3 episodes")
    assert done.stdout.strip().endswith("OK: 0 problems, 0 warnings")
    done = run_rlserve("check-env", "CartPole-v1", "--episodes", "1", "--seed", "7")
    assert done.returncode == 0 and "env CartPole-v1: 1 episode," in done.stdout

    (tmp_path / "broken.py").write_text(BROKEN_ENV)
    done = run_rlserve("check-env", "broken.py:WrongShape", "--max-steps", "5")
    assert done.returncode == 1, done.stdout + done.stderr
    problems = [line for line in done.stdout.splitlines() if line.startswith("problem ")]
    assert problems == [
        "problem [obs_shape] step() returned an observation of shape (3,) for a Box of shape "
        "(4,): return arrays of the declared shape, or fix observation_space (seen 3 times)"
    ]
    assert run_rlserve("check-env", "broken:WrongShape").returncode == 1  # a module name


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["NoSuchEnv-v0"], ["'NoSuchEnv-v0' is not a registered gymnasium id", "CartPole-v1"]),
        (["missing.py:Env"], ["missing.py: no such file", "examples/corridor.py:SimpleCorridor"]),
        (["nosuchmodule:Env"], ["no module named 'nosuchmodule'", "PYTHONPATH"]),
        (["CartPole-v1", "--env-config", "[1]"], ["--env-config must be a JSON object"]),
        (["CartPole-v1", "--env-config", "{x"], ["--env-config is not valid JSON"]),
        (["CartPole-v1", "--episodes", "0"], ["--episodes must be at least 1"]),
    ],
)
def test_check_env_usage_errors_are_one_line(
    args: list[str], fragments: list[str], run_rlserve: Any
) -> None:
    done = run_rlserve("check-env", *args)
    assert done.returncode == 2
    assert_one_line_error(done, *fragments)


WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # as on a client-only install: importing torch fails
from rlserve.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_server_command_without_the_server_extra_names_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, "export", "runs/none"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 2
    assert_one_line_error(
        done, "'rlserve export' needs the server extra", "pip install -e '.[server]'"
    )


@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("localhost:9901", "http://localhost:9901"),
        ("tcp://127.0.0.1:9900", "http://127.0.0.1:9900"),  # endpoints.json's binary URL
        ("tls://example.org:9900", "https://example.org:9900"),
        ("http://127.0.0.1:9901/v1/health", "http://127.0.0.1:9901"),
        ("https://[::1]:9901/", "https://[::1]:9901"),
    ],
)
def test_status_takes_either_port_in_any_url_form(given: str, base: str) -> None:
    assert http_url(given) == (base, base)


def test_status_refuses_an_address_it_cannot_read() -> None:
    with pytest.raises(ConfigError, match="reads the server's HTTP API"):
        http_url("ftp://127.0.0.1:9901")
