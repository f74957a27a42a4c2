"""``make demo-cpp``: the C++ CartPole's server file holds ``rlserve demo cartpole``'s settings.

The training itself runs in the ctest ``e2e_cartpole`` (clients/cpp/tests/e2e/test_cartpole.cpp).
"""

from __future__ import annotations

from pathlib import Path

from rlserve.cli.demo import TASKS
from rlserve.config.fields import load_config_file
from rlserve.learners.ppo_config import PPOSettings
from rlserve.server.config import ServerConfig

SERVER_FILE = Path(__file__).parents[2] / "clients" / "cpp" / "examples" / "cartpole_server.toml"


def test_the_cpp_cartpole_server_has_the_python_demos_settings() -> None:
    tables = load_config_file(str(SERVER_FILE), {"server": ServerConfig, "ppo": PPOSettings})
    task = TASKS["cartpole"]
    assert tables["ppo"] == task.settings["ppo"]
    server = tables["server"]
    assert server["spaces_from"] == task.env_id
    assert {key: server[key] for key in task.server["ppo"]} == task.server["ppo"]
