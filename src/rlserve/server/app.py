"""The policy server: wires the service, the carriers, the learner process and the metrics.

Data flow: a carrier decodes a request -> :class:`~rlserve.server.service.Service` records it in
the episode table and batches ``get_action`` into one numpy forward pass -> finished fragments go
to the experience log through the :class:`~rlserve.server.learner_link.LearnerLink` -> the
supervised learner process reads the log, trains each policy on its own fragments and sends each
policy's weights back -> the server writes them to the run folder and the service switches that
policy to them between batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import uvicorn

from rlserve.config.fields import build
from rlserve.learners.registry import DEFAULT_ALGORITHM, algorithm
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.mapping import PolicyMapping
from rlserve.run.console import announce
from rlserve.run.experience_log import ExperienceLog
from rlserve.run.run_folder import RunFolder, endpoints
from rlserve.run.state_store import StateStore
from rlserve.server import json_body
from rlserve.server.config import ServerConfig
from rlserve.server.dashboard_feed import DashboardFeed
from rlserve.server.housekeeping import Housekeeping
from rlserve.server.http import BrowserPolicy, build_http_app
from rlserve.server.http_deadline import protocol_kwargs, shared_port_protocol
from rlserve.server.learner_link import LearnerLink
from rlserve.server.learner_side import LearnerSide
from rlserve.server.pacing import LearnerPace, max_lag_steps, paced_fragment_length
from rlserve.server.policies import PolicySpec, is_flat, policy_paths, single_policy
from rlserve.server.service import Service
from rlserve.server.stats import ServerStats
from rlserve.server.tcp import BinaryServer, ConnectionPolicy, start_binary_server

logger = logging.getLogger("rlserve.server")


def _uvicorn_logging() -> dict[str, Any]:
    """The logging arguments of uvicorn: the program's levels and handlers, else warnings only.

    ``log_config=None`` keeps uvicorn from installing its own handlers and format, so its lines
    look like rlserve's (``rlserve serve`` configures both). Its access log (a line per request)
    is on only where the program enabled ``uvicorn.access`` at INFO.
    """
    configured = logging.getLogger("uvicorn").level != logging.NOTSET
    return {
        "log_config": None,
        "log_level": None if configured else "warning",
        "access_log": configured and logging.getLogger("uvicorn.access").isEnabledFor(logging.INFO),
    }


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside our event loop: the policy server owns signal handling."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class PolicyServer:
    """An rlserve server for one or several policies.

    :meth:`single` builds the server of one policy (``"default"``) from its two spaces.

    Args:
        config: Server configuration.
        ppo: The top settings table of the server's algorithm (``algo``; plain values, passed
            to the learner process); each policy's own overrides apply on top of it.
        policies: The policies served, by id, in order.
        run: The run folder.
        mapping: Which policy acts for which agent (None: every agent maps to the only policy,
            when there is one).
        resume: Continue the run in ``run`` (its weights, counters and experience log).
        algo: The learning algorithm's name (the registry's; its settings are ``ppo``): that of
            every policy that names none.
        algo_tables: The top settings tables of the other algorithms the policies name, by
            algorithm name (an algorithm left out: its defaults).
    """

    config: ServerConfig
    ppo: dict[str, Any]
    policies: dict[str, PolicySpec]
    run: RunFolder
    mapping: PolicyMapping | None = None
    resume: bool = False
    stats: ServerStats = field(default_factory=ServerStats)
    port: int = 0
    """The binary port (it answers HTTP requests too); known once started."""
    http_port: int | None = None
    """The HTTP port: the separate ``http_port`` listener, or the binary port when there is
    none (``http_port = -1``); known once started."""

    final_checkpoints: dict[str, Path] = field(default_factory=dict)
    """Each policy's final checkpoint; known once closed."""
    learner_factory: Callable[[PolicyServer], LearnerSide] | None = None
    """Builds the learner side from the server (its config, stats, store and opened-later log);
    None: a :class:`LearnerLink` with a supervised learner process (``rlserve serve``)."""
    learner_link: Callable[..., LearnerLink] = LearnerLink
    """Makes the learner side when ``learner_factory`` is None, from :class:`LearnerLink`'s
    arguments: a learner process, or with ``rlserve serve --ray`` a Ray actor
    (``rlserve.cluster.learner_link.RayLearnerLink``)."""
    algo: str = DEFAULT_ALGORITHM
    """The algorithm the learner process trains (``--algo``) for the policies that name none."""
    algo_tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The top settings tables of the other algorithms the policies name, by name."""
    metrics_folder: str = ""
    """Where in the run folder the server writes its TensorBoard events and ``progress.csv``:
    the run folder itself (``""``), or a sub-folder (an Algorithm's attached server writes to
    ``server/``, beside the Algorithm's own metrics)."""
    frame_stacks: dict[str, int] | None = None
    """Each policy's ``frame_stack``, where the server's settings tables do not hold it (an
    Algorithm's attached server); None: read from them."""
    mapping_fn: Callable[..., Any] | None = None
    """A served Algorithm's ``policy_mapping_fn``, asked about the agents no rule of
    ``mapping`` maps (:mod:`~rlserve.server.mapping_function`)."""
    checkpoint_listeners: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    """Told of each checkpoint the learner process writes (``policy_id``, ``path``,
    ``version``, ``reason``), on the server's loop: each must return at once."""

    @classmethod
    def single(
        cls,
        config: ServerConfig,
        ppo: dict[str, Any],
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        run: RunFolder,
        resume: bool = False,
    ) -> PolicyServer:
        """The server of the one policy ``"default"`` (the run folder's single-policy layout)."""
        return cls(config, ppo, single_policy(observation_space, action_space), run, resume=resume)

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("a server needs at least one policy")
        # A space the learner cannot train in is refused here, before anything listens.
        self.algorithms = {pid: s.algorithm_of(self.algo) for pid, s in self.policies.items()}
        """Each policy's algorithm, by id."""
        for pid, spec in self.policies.items():
            algorithm(self.algorithms[pid]).check(spec.observation_space, spec.action_space)
        self.stats.configure_policies(list(self.policies), dict(self.algorithms))
        self.flat = is_flat(self.policies)
        """Whether the run folder has the single-policy layout (see :func:`is_flat`)."""
        self.paths = {pid: policy_paths(self.run.path, pid, self.flat) for pid in self.policies}
        self._stopping = asyncio.Event()
        self._http_task: asyncio.Task[Any] | None = None
        self._housekeeping_task: asyncio.Task[Any] | None = None
        self._dashboard_task: asyncio.Task[Any] | None = None
        self._http: _EmbeddedUvicorn | None = None
        self._tcp: BinaryServer | None = None
        self.store = StateStore(
            self.run.path, {pid: paths.weights for pid, paths in self.paths.items()}
        )
        self.log = ExperienceLog(self.run.path / "experience")
        # Off-policy learners among the policies (mixed runs: any of them) pace the clients of
        # a learner process; an in-process learner side (an Algorithm's) paces itself.
        bound = max_lag_steps(
            self.config.max_learner_lag_steps, self._training_rounds(), self._recurrent()
        )
        self.pace = LearnerPace(
            bound if self.learner_factory is None else 0, self.config.max_hold_seconds
        )
        """Holds clients while the learner process is too far behind (off-policy learners)."""
        self.stats.metric_sources.append(self.pace.metrics)
        self.learner: LearnerSide = (
            self.learner_factory(self) if self.learner_factory is not None else self._learner_link()
        )
        self.service = Service(
            {pid: (s.observation_space, s.action_space) for pid, s in self.policies.items()},
            self.config.limits(),
            self.config.token,
            paced_fragment_length(self.config.fragment_length, self.pace.max_lag_steps),
            self.learner,
            self.stats,
            seed=self.config.seed,
            mapping=self.mapping,
            pace=self.pace,
            mapping_fn=self.mapping_fn,
            frame_stacks={spec.policy_id: self._frame_stack(spec) for spec in self.specs},
        )
        self._housekeeping = Housekeeping(
            self.config,
            self.service,
            self.stats,
            self.store,
            self.log,
            self.run.path / self.metrics_folder,
        )
        self.dashboard = DashboardFeed(
            self.stats,
            self.service.activity,
            self.service.episodes.owners,
            self.health,
            {pid: paths.checkpoints for pid, paths in self.paths.items()},
        )
        """What the dashboard (``GET /``) shows."""

    def _learner_link(self) -> LearnerLink:
        """The learner side of ``rlserve serve``: a supervised learner process (or actor)."""
        return self.learner_link(
            {
                "policies": [self._learner_setup(i, spec) for i, spec in enumerate(self.specs)],
                "run_dir": str(self.run.path),
                "checkpoint_every": self.config.checkpoint_every,
                "keep_checkpoints": self.config.keep_checkpoints,
                "max_queue_steps": self.config.max_sample_queue_steps,
                "niceness": self.config.learner_niceness,
            },
            self.stats,
            self.log,
            self._on_weights,
            self._on_checkpointed,
            lambda: dict(self.stats.policy_versions),
            sync_reports=self.config.sync_reports,
            pace=self.pace,
        )

    @property
    def specs(self) -> list[PolicySpec]:
        """The policies, in order."""
        return list(self.policies.values())

    def _training_rounds(self) -> list[int]:
        """The ``train_every`` of each trained off-policy policy (what pacing must allow)."""
        rounds = []
        for spec in self.policies.values():
            entry = algorithm(self.algorithms[spec.policy_id])
            if entry.off_policy and not spec.frozen:
                table = self._learner_setup(0, spec)["settings"]
                rounds.append(int(build(entry.settings, table, None).train_every))
        return rounds

    def _recurrent(self) -> bool:
        """Whether a trained on-policy policy has memory (pacing then holds it near on-policy)."""
        for spec in self.policies.values():
            entry = algorithm(self.algorithms[spec.policy_id])
            if not entry.off_policy and not spec.frozen:
                settings = self._learner_setup(0, spec)["settings"]
                if bool(getattr(build(entry.settings, settings, None), "use_lstm", False)):
                    return True
        return False

    def _frame_stack(self, spec: PolicySpec) -> int:
        """A policy's ``frame_stack`` setting (its settings table's, checked; 1: off)."""
        if self.frame_stacks is not None:
            return self.frame_stacks.get(spec.policy_id, 1)
        entry = algorithm(self.algorithms[spec.policy_id])
        table = self._learner_setup(0, spec)["settings"]
        return int(build(entry.settings, table, None).frame_stack)

    def _learner_setup(self, index: int, spec: PolicySpec) -> dict[str, Any]:
        """A policy's plain-value set-up for the learner process (seeded apart by its index).

        Its algorithm, and its settings: that algorithm's top table with its overrides.
        """
        name = self.algorithms[spec.policy_id]
        base = self.ppo if name == algorithm(self.algo).name else self.algo_tables.get(name, {})
        return {
            "policy_id": spec.policy_id,
            "algo": name,
            "settings": {**spec.settings_table(base), "seed": self.config.seed + index},
            **spec.spaces(),
            "frozen": spec.frozen,
            "init_checkpoint": spec.init_checkpoint,
            "checkpoint_dir": str(self.paths[spec.policy_id].checkpoints),
        }

    def _recover(self) -> None:
        """Continue from what the run folder holds: counters, reported batch ids, weights."""
        records = self.log.open()
        state = self.store.load_state()
        self.stats.restore(state)
        logged_before = int(state.get("log_seq", 0))
        self.service.ledger.restore(self.store.load_ledger())
        for record in records:
            if record.batch_id is not None:
                self.service.ledger.remember(record.batch_id, record.steps)
            if record.seq > logged_before:
                # Logged after the counters were last saved: count it now, so the counters
                # never go back after a crash.
                self.stats.steps_logged += record.steps
                if record.kind == "report":
                    self.stats.count_reported(record.steps)
        packages = {pid: self.store.load_weights(pid) for pid in self.policies}
        if self.resume:
            announce(
                logger,
                f"rlserve: resuming {self.run.path}: {self.stats.env_steps:,} env steps, "
                f"{self.stats.episodes_completed:,} episodes completed, "
                + self._serving_text(packages),
            )
        for pid, package in packages.items():
            if package is not None:
                # Serve at once, without waiting for the learner (which continues after it).
                self._publish(pid, package)

    def _serving_text(self, packages: dict[str, WeightsPackage | None]) -> str:
        if self.flat:
            package = packages[DEFAULT_POLICY_ID]
            return f"serving weights v{package.version}" if package else "no weights yet"
        shown = [f"{pid} v{p.version}" if p else f"{pid} none yet" for pid, p in packages.items()]
        return f"serving weights {', '.join(shown)}"

    def _publish(self, policy_id: str, package: WeightsPackage) -> None:
        self.service.set_weights(policy_id, package)
        self.stats.set_policy_version(policy_id, package.version)

    async def _on_weights(self, policy_id: str, package: WeightsPackage) -> None:
        try:
            # On disk before any client sees the version: a restarted server serves it again,
            # so versions never go back and reports made with it are never refused.
            await asyncio.get_running_loop().run_in_executor(
                None, self.store.save_weights, package, policy_id
            )
            self.stats.storage_ok("published weights")
        except OSError as exc:
            self.stats.storage_failed("published weights", exc)
        self._publish(policy_id, package)

    async def _on_checkpointed(self, message: dict[str, Any]) -> None:
        """Tell the listeners; delete log segments every policy's kept checkpoints trained past."""
        if "path" in message:
            for listener in self.checkpoint_listeners:
                listener(message)
        needed_after = int(message["log_needed_after"])
        entries = self.service.ledger.state()
        loop = asyncio.get_running_loop()

        def compact() -> None:
            # The ids of reported batches outlive their records: save them before deleting.
            self.store.save_ledger(entries)
            self.log.delete_through(needed_after)

        try:
            await loop.run_in_executor(None, compact)
            self.stats.storage_ok("experience log clean-up")
        except OSError as exc:
            self.stats.storage_failed("experience log clean-up", exc)

    async def start(self) -> None:
        """Recover the run folder's state, start the learner and listen on both carriers.

        The binary port serves both carriers; the separate HTTP port, when configured, only HTTP.
        """
        loop = asyncio.get_running_loop()
        tls = self.config.ssl_context()
        self._recover()
        self.learner.start(loop)
        limits = self.config.limits()
        hygiene = ConnectionPolicy.from_config(self.config)
        browsers = BrowserPolicy.from_config(self.config)
        app = build_http_app(self.service, self.config.token, browsers, self.health, self.dashboard)
        self._http = _EmbeddedUvicorn(
            uvicorn.Config(
                app,
                lifespan="off",
                **_uvicorn_logging(),
                # A request still waiting at shutdown (e.g. a report for a learner that
                # failed) must not hold the final checkpoint back.
                timeout_graceful_shutdown=2,
                # uvicorn wraps the pre-bound socket with these too (create_server(sock=...,
                # ssl=config.ssl)); both carriers use the same certificate.
                ssl_certfile=self.config.tls_cert,
                ssl_keyfile=self.config.tls_key,
                **protocol_kwargs(self.config),
            )
        )
        # The binary port answers HTTP too (one port to open in a firewall); its HTTP
        # connections belong to the same uvicorn server as the separate HTTP port's.
        self._tcp = await start_binary_server(
            self.service,
            limits,
            self.config.host,
            self.config.port,
            hygiene,
            tls=tls,
            http=shared_port_protocol(self._http),
        )
        self.port = self._tcp.port
        sockets: list[socket.socket] = []
        if self.config.http_port >= 0:
            sock = socket.socket(
                socket.AF_INET6 if ":" in self.config.host else socket.AF_INET, socket.SOCK_STREAM
            )
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.config.host, self.config.http_port))
            # Listen now, so the port accepts connections once the listening line is printed.
            sock.listen(2048)
            sockets.append(sock)
            self.http_port = sock.getsockname()[1]
        else:
            self.http_port = self.port
        self._http_task = loop.create_task(self._http.serve(sockets=sockets))
        self._housekeeping_task = loop.create_task(self._housekeeping.run(self._stopping))
        self._dashboard_task = loop.create_task(self.dashboard.run())

    def request_stop(self) -> None:
        """Ask the server to shut down (safe from a signal handler)."""
        self._stopping.set()

    async def wait_stopped(self) -> None:
        """Wait until :meth:`request_stop`."""
        await self._stopping.wait()

    def publish_endpoints(self) -> None:
        """Write where both carriers listen to the run folder's ``endpoints.json``."""
        content = endpoints(self.config.host, self.port, self.http_port, self.config.tls)
        try:
            self.run.write_endpoints(content)
        except OSError as exc:
            # Serving does not need it; only launchers and 'rlserve status' read it.
            logger.warning("rlserve: cannot write %s (%s)", self.run.endpoints_file, exc)

    def health(self) -> dict[str, Any]:
        """What ``GET /v1/health`` reports beyond the versions: degraded parts, the learner.

        And the binary port, so that a client that dialled the HTTP port can name the right one.
        """
        problems = dict(self.stats.degraded)
        if self.learner.failure is not None:
            problems["learner"] = self.learner.failure.strip().splitlines()[-1]
        return {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "binary_port": self.port,
        }

    async def close(self) -> Path | None:
        """Stop serving, write a final checkpoint and state, close everything (within ~10 s).

        Returns:
            The first policy's final checkpoint (all are in :attr:`final_checkpoints`), or None
            if the learner wrote none in time (nothing is lost: the experience log holds
            everything acknowledged).
        """
        self._stopping.set()
        self.dashboard.stop()  # its streams end, so HTTP can shut down at once
        if self._tcp is not None:
            self._tcp.close()
        if self._http is not None:
            self._http.should_exit = True
        for chore in (self._housekeeping_task, self._dashboard_task):
            if chore is not None:
                chore.cancel()
        tasks = [
            t
            for t in (self._http_task, self._housekeeping_task, self._dashboard_task)
            if t is not None
        ]
        stopped = await asyncio.gather(self.learner.stop(), *tasks, return_exceptions=True)
        json_body.shutdown()
        if isinstance(stopped[0], dict):
            self.final_checkpoints = {pid: Path(path) for pid, path in stopped[0].items()}
        await self._housekeeping.finish()
        with contextlib.suppress(OSError):
            self.run.mark_stopped()
        return self.final_checkpoints.get(self.specs[0].policy_id)


async def serve_forever(server: PolicyServer) -> Path | None:
    """Run ``server`` until SIGINT/SIGTERM, then shut it down cleanly."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_stop)
    await server.start()
    server.publish_endpoints()
    binary, http = ("tls://", "https://") if server.config.tls else ("", "http://")
    announce(
        logger,
        f"rlserve listening on {binary}{server.config.host}:{server.port} (binary)"
        + f" and {http}{server.config.host}:{server.http_port} (HTTP)"
        + f"; run folder {server.run.path}",
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
