"""The run folder never holds the token."""

from __future__ import annotations

from pathlib import Path

from rlserve.config.fields import to_table
from rlserve.run.run_folder import RunFolder
from rlserve.server.config import ServerConfig

SPACES = {"observation_space": {}, "action_space": {}}


def test_the_token_is_not_saved_but_its_existence_is(tmp_path: Path) -> None:
    run = RunFolder.create(str(tmp_path), "r")
    run.save({"server": to_table(ServerConfig(token="t0ps3cret")), "ppo": {}}, SPACES)
    assert "t0ps3cret" not in run.config_file.read_text()
    loaded = RunFolder.existing(run.path)
    tables, _ = loaded.load()
    assert loaded.token_required
    assert "token" not in tables["server"]
    assert "token_required" not in tables["server"]
    # Saved again on resume (the token is given again): still not written.
    loaded.save({"server": to_table(ServerConfig(token="t0ps3cret")), "ppo": {}}, SPACES)
    assert "t0ps3cret" not in run.config_file.read_text()


def test_a_run_without_a_token_does_not_require_one(tmp_path: Path) -> None:
    run = RunFolder.create(str(tmp_path), "r")
    run.save({"server": to_table(ServerConfig()), "ppo": {}}, SPACES)
    loaded = RunFolder.existing(run.path)
    loaded.load()
    assert not loaded.token_required
