"""Configuration of the server (one dataclass; each field documents itself)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import ssl
from dataclasses import dataclass
from typing import Any, ClassVar

from rlserve.config.fields import TOKEN_ENV, option
from rlserve.errors import ConfigError
from rlserve.protocol.limits import DEFAULT_LIMITS, MAX_FRAME_BYTES_CEILING, Limits
from rlserve.server.pacing import DEFAULT_MAX_HOLD_SECONDS


@dataclass
class ServerConfig:
    """How the server listens, tracks episodes, queues samples and checkpoints."""

    EXCLUSIVE: ClassVar[tuple[tuple[str, ...], ...]] = (("spaces_from", "spaces_file"),)
    """Settings of which one is used: a flag replaces the file's other one."""

    host: str = option("127.0.0.1", "Address to bind; anything but loopback requires a token.")
    port: int = option(
        9900,
        "Port of the binary (msgpack over TCP) carrier, which answers HTTP requests too; 0 picks "
        "a free one.",
    )
    http_port: int = option(
        9901,
        "A separate port of the HTTP/JSON carrier; 0 picks a free one, -1: none (the binary "
        "port serves HTTP too, always).",
    )
    token: str | None = dataclasses.field(
        default=None,
        # Never shown: not in repr (tracebacks, logs), never saved in the run folder.
        repr=False,
        metadata={
            "help": "Shared secret clients must present (hello or Bearer header); also "
            "RLSERVE_TOKEN. Never written to the run folder."
        },
    )
    spaces_from: str | None = option(
        None,
        "Env whose spaces the policy uses: a Gymnasium id, module:Name or file.py:Name "
        "(as rlserve train --env).",
    )
    spaces_file: str | None = option(
        None, "JSON file with {observation_space, action_space} descriptions."
    )
    run_dir: str = option("runs", "Folder that holds run folders.")
    name: str | None = option(
        None, "Run name (default: a timestamp); the run folder is run_dir/name."
    )
    fragment_length: int = option(200, "Steps of an episode per fragment sent to the learner.")
    idle_timeout: float = option(60.0, "Seconds without a call after which an episode is closed.")
    max_sample_queue_steps: int = option(
        20_000, "Steps waiting for the learner; past it the oldest fragments are dropped."
    )
    max_learner_lag_steps: int | None = option(
        None,
        "Hold the clients' next steps while the learner is this many env steps behind (unread "
        "plus owed training; fragments are cut at half of it); 0: never hold; default: an "
        "off-policy policy's train_every (DQN, SAC), 256 for PPO with memory (use_lstm), 0 for "
        "other PPO.",
    )
    max_hold_seconds: float = option(
        DEFAULT_MAX_HOLD_SECONDS,
        "Longest time a reply is held for a lagging learner (--max-learner-lag-steps); past it "
        "the reply is sent anyway, so that a stuck learner does not stall the clients (keep it "
        "under their reply timeouts: the reference client's is 60 s).",
    )
    learner_niceness: int = option(
        0,
        "Niceness added to the learner process (POSIX). With simulators on other machines, 5 "
        "puts serving first at little cost to training (more of the CPU and a lower p99 of "
        "get_action while the learner trains); where simulators or other work share the "
        "machine, it also puts them first and an on-policy learner may train on less of their "
        "experience.",
    )
    checkpoint_every: int = option(20, "Learner updates between checkpoints (0: only at shutdown).")
    keep_checkpoints: int = option(3, "How many checkpoints to keep in the run folder.")
    metrics_interval: float = option(2.0, "Seconds between metric writes and progress lines.")
    seed: int = option(0, "Seed of the server's action sampling and the learner.")
    progress: bool = option(True, "Show a one-line progress display on the terminal.")
    callbacks: str | None = option(
        None,
        "Callbacks class to tell of results, episodes and checkpoints, as module:Class "
        "(imported; e.g. rlserve.algorithm.tracking:MLflowLoggerCallback); see docs/tracking.md.",
    )
    max_frame_bytes: int = option(DEFAULT_LIMITS.max_frame_bytes, "Largest message in bytes.")
    max_array_elements: int = option(
        DEFAULT_LIMITS.max_array_elements, "Largest array (elements) in a message."
    )
    max_episodes_per_client: int = option(
        DEFAULT_LIMITS.max_episodes_per_client,
        "Concurrent episodes per client identity (its hello's client_id; its connections "
        "together).",
    )
    max_episodes_per_server: int = option(
        DEFAULT_LIMITS.max_episodes_per_server, "Concurrent episodes on the server."
    )
    tls_cert: str | None = option(
        None, "PEM certificate (chain) file: serve TLS on both carriers (needs tls_key)."
    )
    tls_key: str | None = option(None, "PEM private key file of tls_cert.")
    max_connections: int = option(
        512, "Open binary connections; one more gets a capacity error (fits ulimit -n 1024)."
    )
    hello_timeout: float = option(10.0, "Seconds a new binary connection has to say hello.")
    pre_hello_frame_bytes: int = option(65536, "Largest binary frame before a successful hello.")
    connection_idle_timeout: float = option(
        600.0, "Seconds without traffic before a binary connection is closed (0: never)."
    )
    http_max_connections: int = option(
        256, "Concurrent HTTP connections and requests; more get HTTP 503."
    )
    http_idle_timeout: float = option(30.0, "Seconds an idle HTTP keep-alive connection stays.")
    http_request_timeout: float = option(
        30.0, "Seconds an HTTP client has to send a whole request (headers and body)."
    )
    http_allowed_origins: tuple[str, ...] = option(
        (), "Browser origins (e.g. https://app.example) allowed to call the HTTP carrier."
    )
    sync_reports: bool = option(
        False,
        "Acknowledge a report only once fsynced (survives power loss, not only a crash; "
        "adds a disk flush to every report).",
    )

    def __post_init__(self) -> None:
        if self.token == "":
            raise ConfigError("the token is empty; pass a long random secret or none at all")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(
                "TLS needs both --tls-cert FILE and --tls-key FILE (got only "
                f"{'--tls-cert' if self.tls_cert else '--tls-key'})"
            )
        # Absolute, so a resumed run (saved config, maybe another working folder) finds them.
        if self.tls_cert is not None and self.tls_key is not None:
            self.tls_cert = os.path.abspath(self.tls_cert)
            self.tls_key = os.path.abspath(self.tls_key)
        for flag, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if path is not None and not os.access(path, os.R_OK):
                raise ConfigError(
                    f"{flag} {path}: the file does not exist or is not readable by this user"
                )
        if not self.token and not _is_loopback(self.host):
            raise ConfigError(
                f"refusing to listen on {self.host} without a token: anyone who can reach it "
                "could feed the learner. Pass --token SECRET or set RLSERVE_TOKEN (clients then "
                "pass token=SECRET or set RLSERVE_TOKEN), or bind 127.0.0.1"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be from 0 (a free one) to 65535, got {self.port}")
        if not -1 <= self.http_port <= 65535:
            raise ConfigError(
                f"http_port must be from -1 (none) or 0 (a free one) to 65535, got {self.http_port}"
            )
        if self.fragment_length < 1:
            raise ConfigError("fragment_length must be at least 1")
        if self.checkpoint_every < 0:
            raise ConfigError(
                f"checkpoint_every must be 0 (only at shutdown) or more, got "
                f"{self.checkpoint_every}"
            )
        if self.keep_checkpoints < 1:
            raise ConfigError(
                f"keep_checkpoints must be at least 1 (the newest), got {self.keep_checkpoints}"
            )
        if not 0 < self.metrics_interval < float("inf"):
            raise ConfigError(
                f"metrics_interval must be a positive number of seconds, got "
                f"{self.metrics_interval}"
            )
        if self.max_learner_lag_steps is not None and self.max_learner_lag_steps < 0:
            raise ConfigError(
                f"max_learner_lag_steps must be >= 0 (0: never hold clients), got "
                f"{self.max_learner_lag_steps}"
            )
        if not 0 < self.max_hold_seconds < float("inf"):
            raise ConfigError(
                f"max_hold_seconds must be a positive number of seconds, got "
                f"{self.max_hold_seconds}"
            )
        if not 0 <= self.learner_niceness <= 19:
            raise ConfigError(
                f"learner_niceness must be from 0 (share the CPU equally) to 19, got "
                f"{self.learner_niceness}"
            )
        if self.idle_timeout <= 0:
            raise ConfigError("idle_timeout must be positive")
        for name in ("max_connections", "http_max_connections", "pre_hello_frame_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if not 1 <= self.max_frame_bytes <= MAX_FRAME_BYTES_CEILING:
            raise ConfigError(
                f"max_frame_bytes is {self.max_frame_bytes}; it must be between 1 and "
                f"{MAX_FRAME_BYTES_CEILING} (1 GiB): send larger data in several messages"
            )
        for name in ("hello_timeout", "http_idle_timeout", "http_request_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if 0 < self.connection_idle_timeout < self.idle_timeout:
            # A connection cut while one of its episodes is alive could lose a pipelined call.
            raise ConfigError(
                f"connection_idle_timeout ({self.connection_idle_timeout:g} s) must be 0 or at "
                f"least idle_timeout ({self.idle_timeout:g} s)"
            )

    @property
    def tls(self) -> bool:
        """Whether both carriers serve TLS."""
        return self.tls_cert is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context, or None without TLS.

        Raises:
            ConfigError: The certificate or key cannot be loaded (wrong format, key does not
                match the certificate, encrypted key).
        """
        if self.tls_cert is None or self.tls_key is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            # An empty password callback: an encrypted key fails here instead of prompting.
            context.load_cert_chain(self.tls_cert, self.tls_key, password=lambda: "")
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"cannot load the TLS certificate {self.tls_cert} with the key {self.tls_key} "
                f"({exc}); pass a PEM certificate and its unencrypted PEM private key"
            ) from exc
        return context

    def plaintext_warning(self) -> str | None:
        """A warning when a token will travel in clear text over a non-loopback network."""
        if self.token and not self.tls and not _is_loopback(self.host):
            return (
                f"WARNING: listening on {self.host} with a token but without TLS: the token and "
                "every observation and action travel in clear text, so anyone on the network "
                "path can read the token and act as a client. Pass --tls-cert FILE --tls-key "
                "FILE (clients then use tls://host:port), or keep the server on a private "
                "network / behind a TLS proxy (see docs/security.md)"
            )
        return None

    def limits(self) -> Limits:
        """The wire limits this configuration sets."""
        return Limits(
            max_frame_bytes=self.max_frame_bytes,
            max_array_elements=self.max_array_elements,
            max_episodes_per_client=self.max_episodes_per_client,
            max_episodes_per_server=self.max_episodes_per_server,
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def with_token_from_env(table: dict[str, Any] | None) -> dict[str, Any]:
    """The ``[server]`` table with the token of ``RLSERVE_TOKEN`` when that is set.

    The precedence is ``--token`` flag > ``RLSERVE_TOKEN`` > the ``token`` of the TOML table:
    the flag is applied afterwards by :func:`rlserve.config.fields.build`. An empty variable counts
    as
    unset.
    """
    result = dict(table or {})
    token = os.environ.get(TOKEN_ENV)
    if token:
        result["token"] = token
    return result


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address."""
    return _is_loopback(host)
