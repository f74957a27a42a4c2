"""The serving process's own files: weights, counters and batch ids, written atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlserve.policy import ModelSpec
from rlserve.policy.weights import WeightsPackage
from rlserve.run.state_store import StateStore


def package(version: int) -> WeightsPackage:
    spec = ModelSpec(
        obs_dim=3,
        actor_layers=("actor.0",),
        activation="tanh",
        distribution="categorical",
        action_dim=2,
    )
    rng = np.random.default_rng(version)
    arrays = {
        "actor.0.weight": rng.normal(size=(4, 3)).astype(np.float32),
        "actor.0.bias": np.zeros(4, np.float32),
    }
    return WeightsPackage(version, spec, arrays)


def test_weights_round_trip_without_pickle(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.load_weights() is None
    store.save_weights(package(7))
    store.save_weights(package(8))
    loaded = store.load_weights()
    assert loaded is not None and loaded.version == 8
    assert loaded.spec == package(8).spec
    for name, array in package(8).arrays.items():
        np.testing.assert_array_equal(loaded.arrays[name], array)
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["policy.npz"]


def test_damaged_files_read_as_absent(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.weights_file.parent.mkdir()
    store.weights_file.write_bytes(b"not a zip")
    store.state_file.write_text("{")
    store.ledger_file.write_bytes(b"\xc1")
    assert store.load_weights() is None
    assert store.load_state() == {}
    assert store.load_ledger() == []


def test_counters_and_ledger_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save_state({"env_steps": 5, "log_seq": 3})
    store.save_ledger([["a", 3], ["b", 4]])
    assert store.load_state() == {"env_steps": 5, "log_seq": 3}
    assert store.load_ledger() == [["a", 3], ["b", 4]]
