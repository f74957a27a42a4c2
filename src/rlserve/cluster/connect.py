"""Connecting ``rlserve serve --ray ADDRESS`` to a running Ray cluster, or saying why not."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from rlserve.cluster.ray_import import import_ray
from rlserve.cluster.resources import check_resources
from rlserve.errors import ConfigError

__all__ = ["CONNECT_TIMEOUT_S", "LearnerPlacement", "connect"]

CONNECT_TIMEOUT_S = 10.0
"""Seconds a cluster address gets to answer before ``--ray`` gives up."""


def connect(address: str, node_ip: str | None = None, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
    """The ``ray`` module, connected to the cluster at ``address`` (``HOST:PORT`` or ``auto``).

    Args:
        address: The head node's GCS address (``ray start --head --port=PORT`` prints it).
        node_ip: This machine's address as the cluster knows it (``_node_ip_address``).
        timeout_s: How long the address gets to answer.

    Raises:
        ConfigError: Ray is not installed, the address is malformed or does not answer.
    """
    ray: ModuleType = import_ray("--ray")
    if ray.is_initialized():
        return ray
    if address != "auto":
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"--ray {address}: give the head node's address as HOST:PORT (ray start --head "
                "prints it), or auto for the cluster this machine belongs to"
            )
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
        except OSError as exc:
            raise ConfigError(
                f"the Ray cluster at {address} does not answer ({exc.strerror or exc}): start it "
                f"(ray start --head --port={port} on {host}) or pass its address with --ray "
                "HOST:PORT"
            ) from None
    options: dict[str, Any] = {"address": address, "logging_level": "ERROR"}
    if node_ip:
        options["_node_ip_address"] = node_ip
    ray.init(**options)
    return ray


@dataclass(frozen=True)
class LearnerPlacement:
    """What the learner actor holds: CPUs, GPUs and custom resources (the node it lands on)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None, flag: str = "--ray-learner-resources") -> LearnerPlacement:
        """From a JSON map such as ``{"GPU": 1, "CPU": 2, "sim": 1}`` (None or empty: defaults).

        Raises:
            ConfigError: Not a JSON map of names to non-negative numbers.
        """
        if not text:
            return cls()
        try:
            table = json.loads(text)
            if not isinstance(table, dict):
                raise ValueError("not a map")
            amounts = {str(k): float(v) for k, v in table.items()}
            if any(v < 0 for v in amounts.values()):
                raise ValueError("a negative amount")
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"{flag} {text}: give a JSON map of resource names to amounts, e.g. "
                f"'{{\"GPU\": 1}}' ({exc})"
            ) from None
        return cls(
            num_cpus=amounts.pop("CPU", 1.0),
            num_gpus=amounts.pop("GPU", 0.0),
            resources=amounts,
        )

    def need(self) -> dict[str, float]:
        """Every resource asked for, by Ray's name."""
        return {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}

    def options(self) -> dict[str, Any]:
        """The actor options that ask for them."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            options["resources"] = dict(self.resources)
        return options

    def check(self, ray: Any, flag: str = "--ray-learner-resources") -> None:
        """Refuse, before anything starts, resources no live node has.

        Raises:
            ConfigError: No node has them (the message names the resource and the fix).
        """
        check_resources(ray, self.need(), what="learner", setting=flag)
