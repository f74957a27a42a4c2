"""The serving process's own durable state in the run folder (no torch needed to read it).

* ``server_state.json``: the run's counters (env steps, episodes, reported steps...) and the
  experience-log seq they include, written at every metrics interval and at shutdown;
* ``weights/policy.npz``: the newest published actor (arrays, its ``ModelSpec`` as JSON and its
  version), written before the version is published to any client, so a restarted server serves
  at once, and weights versions never go backwards (a server with several policies keeps each
  policy's in ``policies/<id>/weights.npz``, see :mod:`rlserve.server.policies`);
* ``reported_batches.msgpack``: ids of accepted ``report_samples`` batches whose log records were
  deleted (the log itself holds the ids of the rest).

Every file is replaced atomically (:mod:`rlserve.run.durable`). Arrays load with
``allow_pickle=False``.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.errors import ProtocolError
from rlserve.policy import ModelSpec
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.run.durable import atomic_write_bytes
from rlserve.run.experience_log import LOG_LIMITS

logger = logging.getLogger("rlserve.server")

_SPEC_KEY = "__model_spec_json__"
_VERSION_KEY = "__version__"


class StateStore:
    """Reads and writes the serving process's files in a run folder.

    Args:
        run_path: The run folder.
        weights_files: Where each policy's published actor goes (default: the single policy
            ``default`` in ``weights/policy.npz``).
    """

    def __init__(self, run_path: Path, weights_files: Mapping[str, Path] | None = None):
        self.path = run_path
        self.state_file = run_path / "server_state.json"
        self.weights_file = run_path / "weights" / "policy.npz"
        self.weights_files = dict(weights_files or {DEFAULT_POLICY_ID: self.weights_file})
        self.ledger_file = run_path / "reported_batches.msgpack"

    # -- counters --------------------------------------------------------------------------

    def save_state(self, state: dict[str, Any]) -> None:
        """Write the counters (atomically)."""
        atomic_write_bytes(self.state_file, json.dumps(state).encode())

    def load_state(self) -> dict[str, Any]:
        """The counters last written ({} when none or unreadable, with a warning)."""
        if not self.state_file.exists():
            return {}
        try:
            value = json.loads(self.state_file.read_text())
        except (OSError, ValueError) as exc:
            logger.warning("rlserve: cannot read %s (%s); counters restart", self.state_file, exc)
            return {}
        return value if isinstance(value, dict) else {}

    # -- weights ---------------------------------------------------------------------------

    def save_weights(self, package: WeightsPackage, policy_id: str = DEFAULT_POLICY_ID) -> None:
        """Write a policy's published actor (atomically)."""
        path = self.weights_files[policy_id]
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        spec = np.frombuffer(json.dumps(package.spec.to_wire()).encode(), dtype=np.uint8)
        arrays: dict[str, Any] = {f"a_{name}": array for name, array in package.arrays.items()}
        arrays[_SPEC_KEY] = spec
        arrays[_VERSION_KEY] = np.asarray(package.version, dtype=np.int64)
        np.savez(buffer, **arrays)
        atomic_write_bytes(path, buffer.getvalue())

    def load_weights(self, policy_id: str = DEFAULT_POLICY_ID) -> WeightsPackage | None:
        """A policy's newest published actor; None when there is none (or it is unreadable)."""
        path = self.weights_files[policy_id]
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                spec = ModelSpec.from_wire(json.loads(bytes(data[_SPEC_KEY]).decode()))
                version = int(data[_VERSION_KEY])
                arrays = {
                    key[2:]: np.asarray(data[key], dtype=np.float32)
                    for key in data.files
                    if key.startswith("a_")
                }
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning(
                "rlserve: cannot read the published weights %s (%s); waiting for the learner's",
                path,
                exc,
            )
            return None
        return WeightsPackage(version, spec, arrays)

    # -- reported batch ids ----------------------------------------------------------------

    def save_ledger(self, entries: list[list[Any]]) -> None:
        """Write ``[batch_id, steps]`` pairs (atomically)."""
        atomic_write_bytes(self.ledger_file, encode({"batches": entries}))

    def load_ledger(self) -> list[list[Any]]:
        """The pairs last written ([] when none or unreadable, with a warning)."""
        if not self.ledger_file.exists():
            return []
        try:
            batches = decode(self.ledger_file.read_bytes(), LOG_LIMITS)["batches"]
            return [[str(b), int(s)] for b, s in batches]
        except (OSError, ProtocolError, KeyError, TypeError, ValueError) as exc:
            logger.warning("rlserve: cannot read %s (%s)", self.ledger_file, exc)
            return []
