"""The learner process: trains on the experience log and publishes weights back.

It runs apart from the serving process so an update never pauses serving, and so that its death
never stops serving: the server restarts it (see :mod:`rlserve.server.learner_link`). It reads
experience from the run's experience log (:mod:`rlserve.server.experience_log`), from the position
its newest intact checkpoint had trained through, so a restarted learner or a resumed run trains on
everything the server acknowledged. It talks to the server over a socket pair, with the wire's
framing and msgpack codec (no pickle); every message is small except ``weights``:

* learner -> server: ``ready`` (version, trained position, device), ``waiting`` (idle: it will
  read whatever is announced next at once), ``weights`` (a new actor and
  the update's metrics), ``metrics`` (an update that applied no step), ``consumed`` (log
  position read, steps dropped because the backlog was over its bound), ``checkpointed``,
  ``failed`` (a traceback).
* server -> learner: ``available`` (the log's newest seq), ``checkpoint``, ``stop`` (write a
  checkpoint, then exit).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlserve.durable import atomic_write_bytes
from rlserve.errors import ProtocolError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.framing import FrameDecoder, frame
from rlserve.protocol.limits import Limits
from rlserve.samples import Fragment
from rlserve.server.experience_log import LogCorruptError, LogReader

if TYPE_CHECKING:
    from rlserve.algorithms.base import Learner

# Messages between our own two processes; a weights package may be large: allow 1 GiB.
IPC_LIMITS = Limits(max_frame_bytes=1 << 30, max_array_elements=1 << 28, max_container_len=1 << 20)


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    return sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))


def trained_through_of(checkpoint: Path) -> int:
    """The experience-log position a checkpoint trained through, from its side file (0: unknown).

    A checkpoint without the side file keeps the whole log, which is always safe.
    """
    try:
        return int(json.loads(checkpoint.with_suffix(".json").read_text())["trained_through"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


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
                self._outbox = deque(item for item in self._outbox if item[0] != "weights")
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


def run_learner(sock: socket.socket, setup: dict[str, Any]) -> None:
    """Entry point of the learner process.

    Args:
        sock: The learner's end of the socket pair.
        setup: Plain values: ``ppo`` (PPOConfig table), ``observation_space`` and
            ``action_space`` (descriptions), ``run_dir``, ``checkpoint_every``,
            ``keep_checkpoints``, ``published_version`` (the version the server serves, -1 for
            none), ``max_queue_steps``.
    """
    # Ctrl-C, systemd and `kill -- -PGID` signal the whole process group; the server decides
    # when the learner stops (after a final checkpoint), so the learner ignores both signals.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pipe = LearnerPipe(sock)
    try:
        _LearnerLoop(pipe, setup).run()
    except (EOFError, BrokenPipeError, ConnectionResetError) as exc:
        # The server went away: nothing is left to report to, but say so for the operator.
        print(f"rlserve learner: lost the server ({exc!r}); exiting", file=sys.stderr)
    except Exception:
        with contextlib.suppress(OSError):
            pipe.send({"type": "failed", "message": traceback.format_exc()})
    finally:
        pipe.close()


def restore_newest(
    make_learner: Callable[[], Learner], run_dir: Path
) -> tuple[Learner, dict[str, Any], Path | None]:
    """Load the newest checkpoint that loads; a damaged one falls back to the one before.

    Returns:
        The learner, the checkpoint's ``extra``, and the checkpoint's path (None: fresh start).
    """
    for path in reversed(checkpoint_files(run_dir)):
        learner = make_learner()
        try:
            extra = learner.load(path)
        except Exception as exc:
            print(
                f"rlserve learner: checkpoint {path} is damaged or unreadable ({exc!r}); "
                "falling back to the previous one",
                file=sys.stderr,
            )
            continue
        return learner, extra, path
    return make_learner(), {}, None


class _LearnerLoop:
    """Reads the experience log as the server announces it, trains, publishes, checkpoints."""

    def __init__(self, pipe: LearnerPipe, setup: dict[str, Any]):
        self.pipe = pipe
        self.setup = setup
        self.run_dir = Path(setup["run_dir"])
        self.checkpoints = self.run_dir / "checkpoints"
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.reader = LogReader(self.run_dir / "experience")
        self.available = 0
        self.stop_requested = False
        self.checkpoint_requested = False

    def run(self) -> None:
        # Imported here so the serving process, which only spawns this, never imports torch.
        from rlserve.algorithms.ppo import PPOConfig, PPOLearner
        from rlserve.config import build
        from rlserve.spaces import from_description

        config = build(PPOConfig, self.setup["ppo"], None)
        obs_space = from_description(self.setup["observation_space"])
        act_space = from_description(self.setup["action_space"])
        learner, extra, restored = restore_newest(
            lambda: PPOLearner(obs_space, act_space, config), self.run_dir
        )
        self.learner = learner
        # Everything up to `settled` is in the weights (trained or dropped); what came after it
        # is read again by the next learner that starts from this state.
        self.settled = self.position = int(extra.get("trained_through", 0))
        self.consumed_steps = self.settled_consumed = int(extra.get("steps_consumed", 0))
        self.published = int(self.setup["published_version"])
        # Weights versions never go back: a learner restored from an older checkpoint numbers
        # its next weights after the ones the server already serves.
        learner.continue_versions_from(self.published)
        self.pipe.send(
            {
                "type": "ready",
                "pid": os.getpid(),
                "device": str(getattr(learner, "device", "cpu")),
                "version": learner.version,
                "trained_through": self.settled,
                "restored": None if restored is None else str(restored),
                "updates": int(learner.counters().get("updates", 0)),
            }
        )
        # Its counters at once (restored ones after --resume), so the server's learner/* keys
        # are true before the first update; with the first weights when it has new ones.
        counters = learner.counters()
        self.publish(
            {
                **{f"learner/{k}": float(v) for k, v in counters.items() if k != "version"},
                "learner/weights_version": float(learner.version),
            }
        )
        every = int(self.setup["checkpoint_every"])
        while True:
            # Wait only when nothing announced is left unread (it may have come in meanwhile);
            # say so first, so the server hands the next records over at once (acknowledging
            # reports without waiting for this loop to come round).
            idle = self.available <= self.position
            if idle:
                self.pipe.send({"type": "waiting", "through": self.position})
            self.poll(block=idle)
            self.read_available()
            while learner.ready() and not self.stop_requested:
                metrics = learner.update()
                self.settle()
                self.publish(metrics)
                if every and learner.counters()["updates"] % every == 0:
                    self.save("interval")
                self.poll(block=False)
            if self.stop_requested:
                self.save("shutdown")
                return
            if self.checkpoint_requested:
                self.checkpoint_requested = False
                self.save("request")

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
        """Ingest the log records the server announced, dropping the oldest over the bound."""
        if self.available <= self.position:
            return
        try:
            records = list(self.reader.records(self.position, self.available))
        except (LogCorruptError, OSError) as exc:
            print(
                f"rlserve learner: cannot read the experience log past seq {self.position} "
                f"({exc}); skipping to {self.available}",
                file=sys.stderr,
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
        fragments: list[Fragment] = []
        for record in records:
            try:
                fragments.extend(Fragment.from_wire(raw) for raw in record.fragments())
            except (ProtocolError, KeyError, TypeError, ValueError) as exc:
                print(
                    f"rlserve learner: log record {record.seq} unreadable ({exc})", file=sys.stderr
                )
                dropped.append([record.seq, record.steps])
        self.learner.ingest(fragments)
        self.position = self.available
        self.consumed_steps += sum(r.steps for r in records)
        self.settle()
        self.pipe.send(
            {
                "type": "consumed",
                "through": self.position,
                "dropped": dropped,
                "steps_consumed": self.consumed_steps,
            }
        )

    def settle(self) -> None:
        """Move the trained position up when nothing read is waiting in the learner's buffer."""
        if self.learner.buffered_steps == 0:
            self.settled, self.settled_consumed = self.position, self.consumed_steps

    def publish(self, metrics: dict[str, float]) -> None:
        """Send the current actor and the update's metrics.

        An update that applied no step leaves the version where it was: then only the metrics go.
        """
        metrics = {**metrics, "learner/steps_consumed": float(self.consumed_steps)}
        if self.learner.version == self.published:
            self.pipe.send({"type": "metrics", "metrics": metrics})
            return
        self.published = self.learner.version
        self.pipe.send(
            {"type": "weights", "package": self.learner.weights().to_wire(), "metrics": metrics}
        )

    def save(self, reason: str) -> None:
        """Write a checkpoint atomically, forget the oldest, tell the server what log it needs."""
        path = self.checkpoints / f"ckpt_{self.learner.counters()['updates']:07d}.pt"
        extra = {
            "trained_through": self.settled,
            "steps_consumed": self.settled_consumed,
            "reason": reason,
        }
        self.learner.save(path, extra)
        atomic_write_bytes(
            path.with_suffix(".json"), json.dumps({"trained_through": self.settled}).encode()
        )
        kept = checkpoint_files(self.run_dir)
        for old in kept[: -int(self.setup["keep_checkpoints"])]:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
        kept = checkpoint_files(self.run_dir)
        self.pipe.send(
            {
                "type": "checkpointed",
                "path": str(path),
                "reason": reason,
                "trained_through": self.settled,
                # The log must reach back to the oldest kept checkpoint: it is the fallback
                # when a newer one turns out damaged.
                "log_needed_after": min(trained_through_of(p) for p in kept),
                "untrained_steps": self.learner.buffered_steps,
            }
        )
