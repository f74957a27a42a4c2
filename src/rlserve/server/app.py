"""The policy server: wires the service, the carriers, the learner process and the metrics.

Data flow: a carrier decodes a request -> :class:`~rlserve.server.service.Service` records it in
the episode table and batches ``get_action`` into one numpy forward pass -> finished fragments go
to the :class:`~rlserve.server.learner_link.LearnerLink` queue -> the learner process trains and
sends weights back -> the service switches to them between batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import uvicorn

from rlserve.algorithms.base import WeightsPackage
from rlserve.errors import RLServeError
from rlserve.protocol.messages import DEFAULT_POLICY_ID
from rlserve.server.config import ServerConfig
from rlserve.server.http import BrowserPolicy, build_http_app
from rlserve.server.http_deadline import protocol_kwargs
from rlserve.server.learner_link import LearnerLink
from rlserve.server.metrics import MetricsWriter, ProgressLine
from rlserve.server.run_folder import RunFolder
from rlserve.server.service import Service
from rlserve.server.stats import ServerStats
from rlserve.server.tcp import BinaryServer, ConnectionPolicy, start_binary_server
from rlserve.spaces import describe


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside our event loop: the policy server owns signal handling."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class PolicyServer:
    """An rlserve server for one policy.

    Args:
        config: Server configuration.
        ppo: PPO configuration table (plain values, passed to the learner process).
        observation_space: The policy's observation space.
        action_space: The policy's action space.
        run: The run folder.
        resume: Continue from the run folder's latest checkpoint.
    """

    config: ServerConfig
    ppo: dict[str, Any]
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    run: RunFolder
    resume: bool = False
    stats: ServerStats = field(default_factory=ServerStats)
    port: int = 0
    http_port: int | None = None

    def __post_init__(self) -> None:
        self._stopping = asyncio.Event()
        self._http_task: asyncio.Task[Any] | None = None
        self._housekeeping_task: asyncio.Task[Any] | None = None
        self._http: _EmbeddedUvicorn | None = None
        self._tcp: BinaryServer | None = None
        self.learner = LearnerLink(
            {
                "ppo": {**self.ppo, "seed": self.config.seed},
                "observation_space": describe(self.observation_space),
                "action_space": describe(self.action_space),
                "run_dir": str(self.run.path),
                "resume": self.resume,
                "checkpoint_every": self.config.checkpoint_every,
                "keep_checkpoints": self.config.keep_checkpoints,
            },
            self.stats,
            self._on_weights,
            self._restore,
            self.config.max_sample_queue_steps,
            self._state,
        )
        self.service = Service(
            {DEFAULT_POLICY_ID: (self.observation_space, self.action_space)},
            self.config.limits(),
            self.config.token,
            self.config.fragment_length,
            self.learner,
            self.stats,
            seed=self.config.seed,
        )
        self._metrics = MetricsWriter(self.run.path)
        self._progress = ProgressLine(self.config.progress)

    def _state(self) -> dict[str, Any]:
        return {"stats": self.stats.state(), "reported_batches": self.service.ledger.state()}

    def _restore(self, state: dict[str, Any]) -> None:
        self.stats.restore(state.get("stats", {}))
        self.service.ledger.restore(state.get("reported_batches", []))

    def _on_weights(self, package: WeightsPackage) -> None:
        self.service.set_weights(DEFAULT_POLICY_ID, package)

    async def start(self) -> None:
        """Start the learner process and listen on both carriers."""
        loop = asyncio.get_running_loop()
        self.learner.start(loop)
        limits = self.config.limits()
        hygiene = ConnectionPolicy.from_config(self.config)
        self._tcp = await start_binary_server(
            self.service, limits, self.config.host, self.config.port, hygiene
        )
        self.port = self._tcp.port
        if self.config.http_port >= 0:
            sock = socket.socket(
                socket.AF_INET6 if ":" in self.config.host else socket.AF_INET, socket.SOCK_STREAM
            )
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.config.host, self.config.http_port))
            # Listen now, so the port accepts connections once the listening line is printed.
            sock.listen(2048)
            self.http_port = sock.getsockname()[1]
            browsers = BrowserPolicy.from_config(self.config)
            app = build_http_app(self.service, self.config.token, browsers)
            self._http = _EmbeddedUvicorn(
                uvicorn.Config(
                    app,
                    log_level="warning",
                    lifespan="off",
                    access_log=False,
                    # A request still waiting at shutdown (e.g. a report for a learner that
                    # failed) must not hold the final checkpoint back.
                    timeout_graceful_shutdown=5,
                    **protocol_kwargs(self.config),
                )
            )
            self._http_task = loop.create_task(self._http.serve(sockets=[sock]))
        self._housekeeping_task = loop.create_task(self._housekeeping())

    def request_stop(self) -> None:
        """Ask the server to shut down (safe from a signal handler)."""
        self._stopping.set()

    async def wait_stopped(self) -> None:
        """Wait until :meth:`request_stop` or a learner failure."""
        await self._stopping.wait()

    async def _housekeeping(self) -> None:
        interval = self.config.metrics_interval
        while not self._stopping.is_set():
            await asyncio.sleep(interval)
            self.service.expire_idle(self.config.idle_timeout)
            self.stats.tick()
            self._metrics.write(self.stats.snapshot(), self.stats.env_steps)
            self._progress.show(self.stats.progress_line())
            if self.learner.failure is not None:
                self._stopping.set()

    async def close(self) -> Path | None:
        """Stop serving, write a final checkpoint, close everything; return the checkpoint path."""
        self._stopping.set()
        if self._tcp is not None:
            self._tcp.close()
        if self._http is not None:
            self._http.should_exit = True
        if self._housekeeping_task is not None:
            self._housekeeping_task.cancel()
        tasks = [t for t in (self._http_task, self._housekeeping_task) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        checkpoint = await self.learner.stop()
        self.stats.tick()
        self._metrics.write(self.stats.snapshot(), self.stats.env_steps)
        self._metrics.close()
        self._progress.finish()
        if self.learner.failure is not None:
            raise RLServeError(f"the learner process failed:\n{self.learner.failure}")
        return None if checkpoint is None else Path(checkpoint)


async def serve_forever(server: PolicyServer) -> Path | None:
    """Run ``server`` until SIGINT/SIGTERM, then shut it down cleanly."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_stop)
    await server.start()
    print(
        f"rlserve listening on {server.config.host}:{server.port} (binary)"
        + (
            f" and http://{server.config.host}:{server.http_port} (HTTP)"
            if server.http_port
            else ""
        )
        + f"; run folder {server.run.path}",
        flush=True,
    )
    await server.wait_stopped()
    return await server.close()


def install_uvloop() -> None:
    """Use uvloop's event loop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
