"""The package a learner publishes: a model spec, its named float32 arrays and a version.

It is what the server stores, serves with ``get_weights`` and runs in its
:class:`~rlserve.policy.numpy_policy.NumpyPolicy`, so it lives with the numpy inference it feeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.policy.model_spec import ModelSpec


@dataclass(slots=True)
class WeightsPackage:
    """A published actor: its architecture, its named float32 arrays and their version."""

    version: int
    spec: ModelSpec
    arrays: dict[str, np.ndarray]

    def to_wire(self) -> dict[str, Any]:
        """Return the package as a map for the codec."""
        return {"version": self.version, "spec": self.spec.to_wire(), "arrays": self.arrays}

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> WeightsPackage:
        """Rebuild a package from :meth:`to_wire` output."""
        return cls(
            version=int(raw["version"]),
            spec=ModelSpec.from_wire(raw["spec"]),
            arrays={str(k): np.asarray(v, dtype=np.float32) for k, v in raw["arrays"].items()},
        )
