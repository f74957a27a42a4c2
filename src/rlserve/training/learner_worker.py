"""The learner process: trains the server's policies on the experience log, publishes weights.

It runs apart from the serving process so an update never pauses serving, and so that its death
never stops serving: the server restarts it (see :mod:`rlserve.server.learner_link`). It runs
the one learner loop, :class:`~rlserve.training.driver.TrainingDriver`, over one learner per
policy (:class:`~rlserve.training.policy_learner.PolicyLearner`, each with its own optimiser,
counters, weights version and checkpoints) and reads the run's experience log
(:mod:`rlserve.run.experience_log`) once for all of them, handing each fragment to the policy
it names, from the lowest position a policy's newest intact checkpoint had trained through; each
policy skips what it trained already, so a restarted learner or a resumed run trains every
acknowledged step once per policy. It talks to the server over a socket pair, with the wire's
framing and msgpack codec (no pickle); every message is small except ``weights``:

* learner -> server: ``ready`` (device; per policy: version, trained position, restored
  checkpoint), ``waiting`` (idle: it will read whatever is announced next at once), ``weights``
  (a policy's new actor and the update's metrics), ``metrics`` (a policy's metrics without a new
  actor), ``consumed`` (log position read, steps dropped because the backlog was over its bound),
  ``checkpointed`` (a policy's checkpoint and the log position its kept checkpoints need),
  ``failed`` (a traceback), ``log`` (a record of the learner's ``rlserve`` loggers, which the
  server logs as its own: :mod:`~rlserve.training.learner_logs`). ``weights``, ``metrics`` and
  ``checkpointed`` carry ``policy_id``.
* server -> learner: ``available`` (the log's newest seq), ``checkpoint``, ``stop`` (checkpoint
  every policy, then exit).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
import traceback
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from rlserve.errors import ProtocolError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.framing import FrameDecoder, frame
from rlserve.protocol.limits import Limits
from rlserve.run.checkpoints import checkpoints_in, trained_through_of
from rlserve.run.experience_log import LogCorruptError, LogReader, LogRecord
from rlserve.training.driver import TrainingDriver
from rlserve.training.learner_logs import send_logs_to
from rlserve.training.policy_learner import PolicyLearner, restore_newest

__all__ = [
    "IPC_LIMITS",
    "LearnerPipe",
    "Pipe",
    "Records",
    "checkpoint_files",
    "learn",
    "restore_newest",
    "run_learner",
    "trained_through_of",
]

# Messages between our own two processes; a weights package may be large: allow 1 GiB. Any
# number of containers fits (each is at least one byte of the frame): our own records, with
# every step's info, must never be refused.
IPC_LIMITS = Limits(
    max_frame_bytes=1 << 30,
    max_array_elements=1 << 28,
    max_container_len=1 << 20,
    max_containers_per_frame=1 << 30,
)

logger = logging.getLogger("rlserve.learner")


class Pipe(Protocol):
    """The learner's end of its channel to the server (:class:`LearnerPipe`, or an actor's)."""

    def send(self, message: dict[str, Any]) -> None:
        """Queue one message for the server."""

    def receive(self, block: bool = True) -> dict[str, Any] | None:
        """One message from the server; None when ``block`` is False and none is waiting."""


class Records(Protocol):
    """Where the learner reads the records the server announced (:class:`LogReader`'s API)."""

    def records(self, after: int, through: int) -> Iterator[LogRecord]:
        """The records with ``after < seq <= through``, in order."""

    def close(self) -> None:
        """Release what it holds; the next read starts afresh."""


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The checkpoints of a single-policy run, oldest first."""
    return checkpoints_in(run_dir / "checkpoints")


class LearnerPipe:
    """The learner's end of the socket pair: framed msgpack, never blocking the training loop.

    Reads happen in the training loop between updates. Writes go through a writer thread, so
    the loop never waits for the server to read; of several unsent ``weights`` messages only the
    newest is kept (an old actor is worth nothing once a newer one exists).
    """

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._sock.setblocking(True)
        self._decoder = FrameDecoder(IPC_LIMITS.max_frame_bytes)
        self._ready: deque[bytes] = deque()
        self._outbox: deque[tuple[str, bytes]] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self.write_error: OSError | None = None
        self._writer = threading.Thread(
            target=self._write_loop, name="rlserve-learner-writer", daemon=True
        )
        self._writer.start()

    def send(self, message: dict[str, Any]) -> None:
        """Queue one message for the server.

        Raises:
            BrokenPipeError: An earlier write failed: the server is gone.
        """
        if self.write_error is not None:
            raise BrokenPipeError(f"writing to the server failed: {self.write_error!r}")
        data = frame(encode(message))
        kind = str(message["type"])
        with self._wake:
            if kind == "weights":
                # One policy's newer weights replace its older ones, not another policy's.
                kind = f"weights:{message.get('policy_id')}"
                self._outbox = deque(item for item in self._outbox if item[0] != kind)
            self._outbox.append((kind, data))
            self._wake.notify()

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while not self._outbox and not self._closing:
                    self._wake.wait()
                if not self._outbox:
                    return
                _, data = self._outbox.popleft()
            try:
                self._sock.sendall(data)
            except OSError as exc:
                self.write_error = exc
                return

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to ``timeout`` seconds) and stop the writer."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._writer.join(timeout)

    def receive(self, block: bool = True) -> dict[str, Any] | None:
        """Read one message; None when ``block`` is False and none is waiting.

        Raises:
            EOFError: The server closed its end.
        """
        while not self._ready:
            try:
                data = self._sock.recv(1 << 16, 0 if block else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if not data:
                raise EOFError("the server closed the learner's socket")
            self._ready.extend(self._decoder.feed(data))
        return decode(self._ready.popleft(), IPC_LIMITS)


def run_learner(
    sock: socket.socket, setup: dict[str, Any] | None = None, *, own_process: bool = False
) -> None:
    """Entry point of the learner process.

    Args:
        sock: The learner's end of the socket pair.
        setup: None: the first message on ``sock`` (``{"type": "setup", "setup": ...}``)
            brings it. Plain values: ``policies`` (one map per policy: see
            :class:`~rlserve.training.policy_learner.PolicyLearner`), ``run_dir``,
            ``checkpoint_every``, ``keep_checkpoints``, ``max_queue_steps``,
            ``published_versions`` (policy id -> the version the server serves, -1 for none),
            ``log_level`` (the server's level for its ``rlserve`` loggers; default INFO),
            ``niceness`` (added to this process's niceness where the OS has one; default 0).
        own_process: True when this process exists for the learner alone (:func:`main`): its
            start-up objects are then frozen out of the garbage collector's scans (see
            :func:`learn`).
    """
    # Ctrl-C, systemd and `kill -- -PGID` signal the whole process group; the server decides
    # when the learner stops (after a final checkpoint), so the learner ignores both signals.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pipe = LearnerPipe(sock)
    try:
        if setup is None:
            first = pipe.receive(block=True)
            if first is None or first.get("type") != "setup":
                raise ProtocolError("the server's first message to the learner must be its setup")
            setup = dict(first["setup"])
        niceness = int(setup.get("niceness", 0))
        if niceness and hasattr(os, "nice"):
            # Serving first: a reply waiting behind a gradient step is latency every client sees.
            os.nice(niceness)
        learn(pipe, setup, own_process=own_process)
    except (EOFError, BrokenPipeError, ConnectionResetError) as exc:
        # The server went away: nothing is left to report to, but say so for the operator.
        print(f"rlserve learner: lost the server ({exc!r}); exiting", file=sys.stderr)
    except Exception:
        with contextlib.suppress(OSError):
            pipe.send({"type": "failed", "message": traceback.format_exc()})
    finally:
        pipe.close()


def learn(
    pipe: Pipe, setup: dict[str, Any], reader: Records | None = None, *, own_process: bool = False
) -> None:
    """Train on what the server announces until it says stop; a failure is sent as ``failed``.

    Args:
        pipe: The learner's end of its channel to the server.
        setup: See :func:`run_learner`.
        reader: Where the announced records are read (None: the run's experience log on this
            machine's disk; a Ray learner actor is handed them by its server instead).
        own_process: The process runs nothing else: once started (torch imported, the models
            built), ``gc.freeze()`` moves everything made so far out of the collector's scans.
            A full collection, which the update's tensors trigger every few updates, then walks
            what training makes instead of torch's ~300,000 objects as well (each such
            collection cost 0.1-0.3 s of CPU). Not for a shared process: frozen cycles are
            never freed (start-up leaves few).

    Raises:
        EOFError, BrokenPipeError, ConnectionResetError: The server went away.
    """
    try:
        send_logs_to(pipe.send, int(setup.get("log_level", logging.INFO)))
        _LearnerLoop(pipe, setup, reader).run(freeze_start_up=own_process)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        raise
    except Exception:
        with contextlib.suppress(OSError):
            pipe.send({"type": "failed", "message": traceback.format_exc()})


class _LearnerLoop:
    """Reads the log as the server announces it; a :class:`TrainingDriver` trains the policies.

    The pipe is the driver's publisher: each update's ``weights`` (or ``metrics``), each
    ``checkpointed``, and the ``owed`` steps when they change.
    """

    def __init__(self, pipe: Pipe, setup: dict[str, Any], reader: Records | None = None):
        self.pipe = pipe
        self.setup = setup
        self.run_dir = Path(setup["run_dir"])
        self.reader = reader if reader is not None else LogReader(self.run_dir / "experience")
        self.available = 0
        self.stop_requested = False
        self.checkpoint_requested = False
        self.reported_owed = 0
        published = setup.get("published_versions") or {}
        keep = int(setup["keep_checkpoints"])
        policies = {}
        for spec in setup["policies"]:
            pid = str(spec["policy_id"])
            policies[pid] = PolicyLearner.start(spec, int(published.get(pid, -1)), keep)
        self.driver = TrainingDriver(
            policies,
            self.published,
            self.pipe.send,
            checkpoint_every=int(setup["checkpoint_every"]),
            on_unknown=_unknown_policy,
        )

    def run(self, freeze_start_up: bool = False) -> None:
        """Say ready, then read, train and checkpoint as the server asks, until it says stop.

        ``freeze_start_up``: ``gc.freeze()`` once ready (see :func:`learn`).
        """
        policies = self.driver.policies
        first = next(iter(policies.values())).learner
        self.pipe.send(
            {
                "type": "ready",
                "pid": os.getpid(),
                "device": str(getattr(first, "device", "cpu")),
                "steps_consumed": self.driver.log_steps,
                "position": self.driver.position,
                "owed_steps": self.owed_steps(),
                "policies": {pid: p.ready_info() for pid, p in policies.items()},
            }
        )
        self.reported_owed = self.owed_steps()
        # Their counters at once (restored ones after --resume), so the server's learner keys
        # are true before the first update; with the first weights when they have new ones.
        for policy in policies.values():
            self.pipe.send(policy.publication(policy.counter_metrics()))
        if freeze_start_up:
            gc.freeze()
        while True:
            # Wait only when nothing announced is left unread (it may have come in meanwhile);
            # say so first, so the server hands the next records over at once (acknowledging
            # reports without waiting for this loop to come round).
            idle = self.available <= self.driver.position
            if idle:
                self.pipe.send({"type": "waiting", "through": self.driver.position})
            self.poll(block=idle)
            self.read_available()
            if not self.stop_requested:
                self.driver.train(self.interrupted)
            if self.stop_requested:
                self.driver.save_all("shutdown")
                return
            if self.checkpoint_requested:
                self.checkpoint_requested = False
                self.driver.save_all("request")

    def published(self, policy: PolicyLearner, metrics: dict[str, float]) -> None:
        """Send an update's weights (or only its metrics) and the owed steps."""
        self.pipe.send(policy.publication(metrics))
        self.report_owed()

    def interrupted(self) -> bool:
        """Take the waiting messages; whether a stop came."""
        self.poll(block=False)
        return self.stop_requested

    def poll(self, block: bool) -> None:
        """Take every waiting message (waiting for one first when ``block``)."""
        message = self.pipe.receive(block=block)
        while message is not None:
            kind = message["type"]
            if kind == "available":
                self.available = max(self.available, int(message["through"]))
            elif kind == "checkpoint":
                self.checkpoint_requested = True
            elif kind == "stop":
                self.stop_requested = True
            message = self.pipe.receive(block=False)

    def read_available(self) -> None:
        """Hand the announced log records to their policies, dropping the oldest over the bound."""
        driver = self.driver
        if self.available <= driver.position:
            return
        try:
            records = list(self.reader.records(driver.position, self.available))
        except (LogCorruptError, OSError) as exc:
            logger.warning(
                "cannot read the experience log past seq %d (%s); skipping to %d",
                driver.position,
                exc,
                self.available,
            )
            self.reader.close()
            records = []
        bound = int(self.setup["max_queue_steps"])
        total = sum(r.steps for r in records)
        dropped: list[list[int]] = []
        while total > bound and len(records) > 1:
            oldest = records.pop(0)
            dropped.append([oldest.seq, oldest.steps])
            total -= oldest.steps
        for record in records:
            try:
                fragments = [Fragment.from_wire(raw) for raw in record.fragments()]
            except (ProtocolError, KeyError, TypeError, ValueError) as exc:
                logger.warning("log record %d unreadable (%s)", record.seq, exc)
                dropped.append([record.seq, record.steps])
                continue
            driver.take(fragments, record.seq)
        driver.ingest(self.available, sum(r.steps for r in records))
        for policy in driver.policies.values():
            report = policy.read_report()
            if report is not None:
                self.pipe.send(report)
        self.pipe.send(
            {
                "type": "consumed",
                "through": driver.position,
                "dropped": dropped,
                "steps_consumed": driver.log_steps,
            }
        )
        self.report_owed()

    def owed_steps(self) -> int:
        """Env steps read whose scheduled training the policies still owe (off-policy)."""
        return sum(p.learner.owed_steps for p in self.driver.policies.values() if not p.frozen)

    def report_owed(self) -> None:
        """Tell the server the owed steps when they changed (it paces clients by them)."""
        owed = self.owed_steps()
        if owed != self.reported_owed:
            self.reported_owed = owed
            self.pipe.send({"type": "owed", "steps": owed})


def _unknown_policy(policy_id: str) -> None:
    logger.warning(
        "the experience log holds fragments of the policy '%s', which this server does not "
        "host; they are skipped",
        policy_id,
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m rlserve.training.learner_worker FD``: the learner on the inherited socket FD."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        sys.exit("usage: python -m rlserve.training.learner_worker FD (started by the server)")
    run_learner(socket.socket(fileno=int(args[0])), own_process=True)


if __name__ == "__main__":
    main()
