"""How an Algorithm's network server listens and queues its clients' experience (``serving()``).

:class:`ServingSettings` is what :meth:`~rlserve.algorithm.config.AlgorithmConfig.serving` takes;
it checks the settings at once (the :class:`~rlserve.server.config.ServerConfig` they make
included), so a bad one is refused when the config is built, not when the server starts.
Torch-free.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from rlserve.config.fields import TOKEN_ENV, option
from rlserve.errors import ConfigError
from rlserve.server.config import ServerConfig

ELSEWHERE = {
    "run_dir": "set it with reporting(run_dir=...)",
    "name": "set it with reporting(name=...)",
    "checkpoint_every": "set it with reporting(checkpoint_every=...)",
    "keep_checkpoints": "set it with reporting(keep_checkpoints=...)",
    "progress": "set it with reporting(progress=...)",
    "spaces_from": "give the spaces with environment(observation_space=..., action_space=...)",
    "spaces_file": "give the spaces with environment(observation_space=..., action_space=...)",
}
"""ServerConfig fields an AlgorithmConfig sets elsewhere, and where."""

RAY_SETTINGS = ("ray_address", "ray_node_ip", "replicas")
"""Settings that place the server on Ray (:mod:`rlserve.algorithm.network_ray`), not its own."""


@dataclass
class ServingSettings:
    """How an Algorithm's network server listens and queues the experience of its clients."""

    host: str = option("127.0.0.1", "Address to bind; anything but loopback requires a token.")
    port: int = option(
        0, "Port of the binary carrier (answers HTTP too); 0 picks a free one (see address)."
    )
    http_port: int = option(
        -1, "A separate HTTP/JSON port; 0 picks a free one, -1: none (the binary port serves it)."
    )
    token: str | None = dataclasses.field(
        default=None,
        repr=False,
        metadata={
            "help": "Shared secret clients must present (also RLSERVE_TOKEN); required to bind "
            "anything but loopback. Never written to the run folder."
        },
    )
    tls_cert: str | None = option(None, "PEM certificate (chain) file: serve TLS (needs tls_key).")
    tls_key: str | None = option(None, "PEM private key file of tls_cert.")
    max_queued_steps_per_source: int = option(
        50_000,
        "Steps queued per client identity until the Algorithm takes them; past it that "
        "client's own oldest steps are dropped (whole fragments for a policy with memory).",
    )
    idle_timeout: float = option(60.0, "Seconds without a call after which an episode is closed.")
    sync_reports: bool = option(
        False, "Acknowledge a report only once the experience log is fsynced (power-loss safe)."
    )
    metrics_interval: float = option(
        2.0, "Seconds between housekeeping rounds (idle episodes, metrics, state saves)."
    )
    ray_address: str | None = option(
        None,
        "A Ray cluster's address (HOST:PORT, or auto): the learner runs there as an actor, "
        "placed by learners(num_gpus_per_learner=..., custom_resources_per_learner=...).",
    )
    ray_node_ip: str | None = option(
        None, "This machine's address as the Ray cluster knows it (None: Ray's guess)."
    )
    replicas: int = option(
        1,
        "Serving front-ends on Ray, one per node, all on the same port (not 0), one learner "
        "(docs/scaling.md); more than 1 needs ray_address.",
    )
    server: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata={
            "help": "Further ServerConfig fields by name (limits, connection hygiene, allowed "
            "origins...)."
        },
    )

    def __post_init__(self) -> None:
        if self.token is None:
            self.token = os.environ.get(TOKEN_ENV) or None
        if self.max_queued_steps_per_source < 1:
            raise ConfigError("max_queued_steps_per_source must be at least 1")
        if not isinstance(self.replicas, int) or isinstance(self.replicas, bool):
            raise ConfigError(f"replicas must be a whole number >= 1, got {self.replicas!r}")
        if self.replicas < 1:
            raise ConfigError(f"replicas must be at least 1, got {self.replicas}")
        if self.replicas > 1 and self.ray_address is None:
            raise ConfigError(
                f"replicas={self.replicas}: front-ends on several nodes run on a Ray cluster; "
                "pass ray_address='HOST:PORT' (the head node's, or 'auto')"
            )
        if self.replicas > 1 and self.port <= 0:
            raise ConfigError(
                f"replicas={self.replicas}: every front-end listens on the same port; pass "
                "port=N (not 0) with a port free on every node"
            )
        owned = {f.name for f in dataclasses.fields(self)} | {"fragment_length", "seed"}
        known = {f.name for f in dataclasses.fields(ServerConfig)}
        for key in self.server:
            if key in ELSEWHERE:
                raise ConfigError(f"serving 'server' option '{key}': {ELSEWHERE[key]}")
            if key in owned or key not in known:
                raise ConfigError(
                    f"serving 'server' option '{key}' is not a further ServerConfig field; "
                    f"pass one of {sorted(known - owned)}"
                    + (f" (set '{key}' on ServingSettings itself)" if key in owned else "")
                )
        self.server_config(200, 0)  # refuse a bad combination now (e.g. 0.0.0.0 without token)

    def server_config(self, fragment_length: int, seed: int) -> ServerConfig:
        """The :class:`ServerConfig` of the attached server.

        Raises:
            ConfigError: As :class:`ServerConfig` does, e.g. a non-loopback host without a token.
        """
        return ServerConfig(
            host=self.host,
            port=self.port,
            http_port=self.http_port,
            token=self.token,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            fragment_length=fragment_length,
            seed=seed,
            idle_timeout=self.idle_timeout,
            sync_reports=self.sync_reports,
            metrics_interval=self.metrics_interval,
            progress=False,  # the Algorithm reports progress itself
            **self.server,
        )
