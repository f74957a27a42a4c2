"""Experiment tracking on the callbacks: Weights & Biases and MLflow loggers (opt-in).

``config.callbacks(MLflowLoggerCallback(experiment_name="cartpole"))``, or ``rlserve serve
--callbacks rlserve.algorithm.tracking:MLflowLoggerCallback`` (settings then from the tools'
own environment variables: ``WANDB_PROJECT``, ``WANDB_MODE``, ``MLFLOW_TRACKING_URI``,
``MLFLOW_EXPERIMENT_NAME``...). Each logger opens its run when the Algorithm is built, logs the
config's plain settings as parameters, every result's numbers as metrics (``a/b`` for
``result["a"]["b"]``, at the step ``training_iteration``), each checkpoint as an artifact when
``log_checkpoints``, and closes the run when the Algorithm stops. Episodes are not logged one by
one: the results carry their statistics.

wandb and mlflow are imported only when a logger is made: ``pip install -e '.[tracking]'``.
"""

from __future__ import annotations

import importlib
import math
import threading
import time
from typing import Any

from rlserve.errors import ConfigError
from rlserve.run.callbacks import Callbacks

TRACKING_EXTRA = "pip install -e '.[tracking]' in the checkout (or add [tracking] to the wheel)"


def _require(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{package} is not installed ({exc}); install it with {TRACKING_EXTRA}"
        ) from exc


def flat_metrics(result: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a (nested) result, keyed ``a/b`` for ``result["a"]["b"]``."""
    flat: dict[str, float] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_metrics(value, f"{name}/"))
        elif (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        ):
            flat[name] = float(value)
    return flat


def config_params(algorithm: Any) -> dict[str, Any]:
    """The Algorithm's config as flat plain parameters (its algorithm's settings included)."""
    config = algorithm.config
    params: dict[str, Any] = {"algo": config.algo_name}
    for key, value in vars(config).items():
        if isinstance(value, str | int | float | bool) and not key.startswith("_"):
            params[key] = value
    if isinstance(config.env, str):
        params["env"] = config.env
    settings = config.algo_settings()
    for key, value in vars(settings).items():
        if isinstance(value, str | int | float | bool | tuple):
            params[f"{config.algo_name}/{key}"] = str(value) if isinstance(value, tuple) else value
    return params


class WandbLoggerCallback(Callbacks):
    """Logs the run to Weights & Biases.

    Args:
        project: The W&B project (None: ``WANDB_PROJECT``, else wandb's default).
        log_checkpoints: Log each checkpoint file as a ``model`` artifact.
        init_kwargs: More arguments for ``wandb.init`` (``entity``, ``group``, ``mode``,
            ``dir``, ``name``, ``tags``...).

    Raises:
        ConfigError: wandb is not installed.
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        log_checkpoints: bool = False,
        **init_kwargs: Any,
    ):
        self._wandb = _require("wandb", "wandb")
        self.project = project
        self.log_checkpoints = log_checkpoints
        self.init_kwargs = init_kwargs
        self.run: Any = None
        """The wandb run, once the Algorithm is built."""
        self._lock = threading.Lock()

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        """Open the wandb run with the config as its config."""
        with self._lock:
            self.run = self._wandb.init(
                project=self.project, config=config_params(algorithm), **self.init_kwargs
            )

    def on_train_result(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any) -> None:
        """Log the result's numbers at step ``training_iteration``."""
        with self._lock:
            if self.run is not None:
                self.run.log(flat_metrics(result), step=int(result["training_iteration"]))

    def on_checkpoint(
        self, *, algorithm: Any, path: str, policy_id: str, version: int, **kwargs: Any
    ) -> None:
        """Log the checkpoint file as an artifact (with ``log_checkpoints``)."""
        if not self.log_checkpoints:
            return
        with self._lock:
            if self.run is None:
                return
            artifact = self._wandb.Artifact(
                f"{self.run.id}-{policy_id}", type="model", metadata={"version": version}
            )
            artifact.add_file(path)
            self.run.log_artifact(artifact)

    def on_algorithm_stop(self, *, algorithm: Any, **kwargs: Any) -> None:
        """Finish the wandb run."""
        with self._lock:
            if self.run is not None:
                self.run.finish()
                self.run = None


class MLflowLoggerCallback(Callbacks):
    """Logs the run to MLflow (``mlflow-skinny`` is enough).

    Args:
        tracking_uri: Where MLflow keeps runs (None: ``MLFLOW_TRACKING_URI``, else ``./mlruns``
            as mlflow has it), e.g. ``file:///path/mlruns`` or an MLflow server's URL.
        experiment_name: The experiment (created if missing; None: MLflow's default one).
        run_name: The run's name (None: MLflow picks one).
        log_checkpoints: Log each checkpoint file as an artifact under ``checkpoints/<policy>``.
        tags: Tags of the run.

    Raises:
        ConfigError: mlflow is not installed.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        *,
        run_name: str | None = None,
        log_checkpoints: bool = False,
        tags: dict[str, str] | None = None,
    ):
        tracking = _require("mlflow.tracking", "mlflow")
        self._client = tracking.MlflowClient(tracking_uri=tracking_uri)
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.log_checkpoints = log_checkpoints
        self.tags = dict(tags or {})
        self.run_id: str | None = None
        """The MLflow run's id, once the Algorithm is built."""
        self._lock = threading.Lock()

    def _experiment_id(self) -> str:
        if self.experiment_name is None:
            return "0"
        found = self._client.get_experiment_by_name(self.experiment_name)
        if found is not None:
            return str(found.experiment_id)
        return str(self._client.create_experiment(self.experiment_name))

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        """Start the MLflow run; log the config as its parameters."""
        with self._lock:
            run = self._client.create_run(
                self._experiment_id(), run_name=self.run_name, tags=self.tags
            )
            self.run_id = run.info.run_id
            entities = _require("mlflow.entities", "mlflow")
            params = [entities.Param(k, str(v)) for k, v in config_params(algorithm).items()]
            self._client.log_batch(self.run_id, params=params)

    def on_train_result(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any) -> None:
        """Log the result's numbers at step ``training_iteration``."""
        with self._lock:
            if self.run_id is None:
                return
            entities = _require("mlflow.entities", "mlflow")
            step = int(result["training_iteration"])
            stamp = int(time.time() * 1000)
            metrics = [
                entities.Metric(_mlflow_name(k), v, stamp, step)
                for k, v in flat_metrics(result).items()
            ]
            self._client.log_batch(self.run_id, metrics=metrics)

    def on_checkpoint(
        self, *, algorithm: Any, path: str, policy_id: str, version: int, **kwargs: Any
    ) -> None:
        """Log the checkpoint file as an artifact (with ``log_checkpoints``)."""
        if not self.log_checkpoints:
            return
        with self._lock:
            if self.run_id is not None:
                self._client.log_artifact(self.run_id, path, f"checkpoints/{policy_id}")

    def on_algorithm_stop(self, *, algorithm: Any, **kwargs: Any) -> None:
        """End the MLflow run."""
        with self._lock:
            if self.run_id is not None:
                self._client.set_terminated(self.run_id)
                self.run_id = None


def _mlflow_name(name: str) -> str:
    """A metric name MLflow accepts (letters, digits, ``_-./`` and spaces)."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)
