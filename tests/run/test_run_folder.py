"""The run folder never holds the token."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

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


def test_runs_started_in_the_same_second_get_folders_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "strftime", lambda fmt, *args: "20261128-120000")
    names = [RunFolder.create(str(tmp_path), None).path.name for _ in range(3)]
    assert names == ["20261128-120000", "20261128-120000-2", "20261128-120000-3"]
