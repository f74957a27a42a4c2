"""The learner process: trains on fragments from the server and publishes weights back.

It runs apart from the serving process so a PPO update never pauses serving. It talks to the
server over a ``multiprocessing`` pipe with the same msgpack codec as the wire (no pickle):

* learner -> server: ``request`` (send me queued fragments), ``weights`` (a new actor and the
  update's metrics), ``restored`` (server counters from a checkpoint), ``checkpointed``,
  ``failed`` (a traceback).
* server -> learner: ``fragments`` (with the server's counters, kept for the next checkpoint),
  ``checkpoint`` and ``stop`` (write a checkpoint; after ``stop``, exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rlserve.protocol.codec import decode, encode
from rlserve.protocol.limits import Limits
from rlserve.samples import Fragment

# The pipe is between our own processes, but a fragments batch may be large: allow 1 GiB.
IPC_LIMITS = Limits(max_frame_bytes=1 << 30, max_array_elements=1 << 28, max_container_len=1 << 20)


def send(conn: Connection, message: dict[str, Any]) -> None:
    """Write one whole message to the pipe."""
    # An event loop polling this fd (libuv) may have made it non-blocking; a message must never
    # be written in part, so make sure the write blocks until it is all out.
    os.set_blocking(conn.fileno(), True)
    conn.send_bytes(encode(message))


def receive(conn: Connection) -> dict[str, Any]:
    """Read one whole message from the pipe."""
    os.set_blocking(conn.fileno(), True)
    return decode(conn.recv_bytes(), IPC_LIMITS)


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    return sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))


def run_learner(conn: Connection, setup: dict[str, Any]) -> None:
    """Entry point of the learner process.

    Args:
        conn: The learner's end of the pipe.
        setup: Plain values: ``ppo`` (PPOConfig table), ``observation_space`` and
            ``action_space`` (descriptions), ``run_dir``, ``resume``, ``checkpoint_every``,
            ``keep_checkpoints``.
    """
    # Ctrl-C, systemd and `kill -- -PGID` signal the whole process group; the server decides
    # when the learner stops (after a final checkpoint), so the learner ignores both signals.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _serve(conn, setup)
    except (EOFError, BrokenPipeError) as exc:
        # The server went away: nothing is left to report to, but say so for the operator.
        print(f"rlserve learner: lost the pipe to the server ({exc!r}); exiting", file=sys.stderr)
    except Exception:
        with contextlib.suppress(OSError):
            send(conn, {"type": "failed", "message": traceback.format_exc()})


def _serve(conn: Connection, setup: dict[str, Any]) -> None:
    # Imported here so the serving process, which only spawns this, never imports torch.
    from rlserve.algorithms.ppo import PPOConfig, PPOLearner
    from rlserve.config import build
    from rlserve.spaces import from_description

    config = build(PPOConfig, setup["ppo"], None)
    learner = PPOLearner(
        from_description(setup["observation_space"]),
        from_description(setup["action_space"]),
        config,
    )
    run_dir = Path(setup["run_dir"])
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    server_state: dict[str, Any] = {}
    if setup["resume"]:
        files = checkpoint_files(run_dir)
        if files:
            extra = learner.load(files[-1])
            server_state = extra.get("server", {})
            send(conn, {"type": "restored", "server_state": server_state, "path": str(files[-1])})
        else:
            print(
                f"rlserve learner: --resume found no checkpoint in {run_dir / 'checkpoints'}; "
                "starting from fresh weights",
                file=sys.stderr,
            )

    def save(reason: str) -> None:
        path = run_dir / "checkpoints" / f"ckpt_{learner.counters()['updates']:07d}.pt"
        learner.save(path, {"server": server_state, "reason": reason})
        for old in checkpoint_files(run_dir)[: -setup["keep_checkpoints"]]:
            old.unlink(missing_ok=True)
        send(
            conn,
            {
                "type": "checkpointed",
                "path": str(path),
                "reason": reason,
                "untrained_steps": learner.buffered_steps,
            },
        )

    send(
        conn,
        {
            "type": "weights",
            "package": learner.weights().to_wire(),
            "metrics": {},
            "device": str(learner.device),
            "pid": os.getpid(),
        },
    )
    every = setup["checkpoint_every"]
    waiting = False
    while True:
        if not waiting:
            send(conn, {"type": "request"})
            waiting = True
        message = receive(conn)
        kind = message["type"]
        if kind == "fragments":
            waiting = False
            server_state = message.get("server_state", server_state)
            learner.ingest([Fragment.from_wire(f) for f in message["fragments"]])
            while learner.ready():
                metrics = learner.update()
                send(
                    conn,
                    {"type": "weights", "package": learner.weights().to_wire(), "metrics": metrics},
                )
                if every and learner.counters()["updates"] % every == 0:
                    save("interval")
        elif kind == "checkpoint":
            server_state = message.get("server_state", server_state)
            save("request")
        elif kind == "stop":
            server_state = message.get("server_state", server_state)
            save("shutdown")
            return
