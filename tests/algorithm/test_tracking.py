"""The W&B and MLflow loggers, in their offline/file modes only (nothing reaches a network)."""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rlserve.algorithm import PPOConfig
from rlserve.algorithm.tracking import (
    MLflowLoggerCallback,
    WandbLoggerCallback,
    config_params,
    flat_metrics,
)

SMALL = {
    "train_batch_size": 128,
    "minibatch_size": 64,
    "num_epochs": 1,
    "min_env_steps_per_iteration": 128,
    "model": {"fcnet_hiddens": [8]},
}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every setting that keeps wandb and mlflow off the network."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow 3.x keeps the file store (a file:// URI) in maintenance: allowed explicitly.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "unused-mlruns").as_uri())


def train_with(callbacks: Any, run_dir: Path) -> list[dict[str, Any]]:
    algo = (
        PPOConfig()
        .environment("CartPole-v1")
        .training(**SMALL)
        .debugging(seed=5)
        .callbacks(callbacks)
        .build()
    )
    with algo:
        results = [algo.train(), algo.train()]
        algo.save(run_dir)
    return results


def test_flat_metrics_keep_finite_numbers_by_path() -> None:
    result = {"a": {"b": 1, "c": float("nan"), "d": "x"}, "e": 2.5, "f": True}
    assert flat_metrics(result) == {"a/b": 1.0, "e": 2.5}


@pytest.mark.timeout(120)
def test_mlflow_logs_params_metrics_and_checkpoints_to_a_file_store(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    logger = MLflowLoggerCallback(uri, "cartpole", run_name="ppo", log_checkpoints=True)
    results = train_with(logger, tmp_path / "run")
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("cartpole").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "ppo"
    assert run.data.params["algo"] == "ppo"
    assert run.data.params["ppo/train_batch_size"] == "128"
    history = client.get_metric_history(run.info.run_id, "env_runners/num_env_steps_sampled")
    assert [m.step for m in history] == [1, 2]
    assert [m.value for m in history] == [
        float(r["env_runners"]["num_env_steps_sampled"]) for r in results
    ]
    (folder,) = client.list_artifacts(run.info.run_id, "checkpoints")
    (artifact,) = client.list_artifacts(run.info.run_id, folder.path)
    assert artifact.path.endswith(".pt") and artifact.file_size > 0


def wandb_records(run_file: Path) -> list[Any]:
    """The records of a ``.wandb`` file: a 7-byte header, then LevelDB-log style blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, chunk, position = [], b"", 7
    block = 32 * 1024
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:  # a block's tail too short for a header is padding
            position += room
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
        chunk += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
        elif kind == 0:
            break
    return records


@pytest.mark.timeout(120)
def test_wandb_logs_config_and_metrics_to_an_offline_run(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    logger = WandbLoggerCallback("rlserve-test", log_checkpoints=True)
    results = train_with(logger, tmp_path / "run")
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb's service process may still be writing the file after finish() returned: wait
    # for the run's last record.
    deadline = time.monotonic() + 60
    records = wandb_records(run_file)
    while not any(r.HasField("exit") for r in records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = wandb_records(run_file)
    logged: list[dict[str, str]] = [
        {item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    steps = [row["env_runners/num_env_steps_sampled"] for row in logged]
    assert steps == [str(r["env_runners"]["num_env_steps_sampled"]) for r in results]
    config = {
        item.key: item.value_json
        for r in records
        if r.WhichOneof("record_type") in ("run", "config")
        for item in (r.run.config.update if r.HasField("run") else r.config.update)
    }
    assert config["algo"] == '"ppo"'
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert [a.type for a in artifacts] == ["model"]


def test_config_params_are_plain_values() -> None:
    class Holder:
        config = PPOConfig().environment("CartPole-v1").training(lr=0.01)

    params = config_params(Holder())
    assert params["env"] == "CartPole-v1" and params["ppo/lr"] == 0.01
    assert all(isinstance(v, str | int | float | bool) for v in params.values())


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlserve.errors import ConfigError

    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # makes the import fail
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[tracking\]' in the checkout"):
        MLflowLoggerCallback()
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[tracking\]' in the checkout"):
        WandbLoggerCallback()
