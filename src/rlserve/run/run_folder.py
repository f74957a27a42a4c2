"""The run folder: ``runs/<name>/`` with the config, the spaces, checkpoints and event files.

Layout::

    runs/<name>/config.toml       the server and PPO configuration the run started with, without
                                  the token (``token_required = true`` records that it had one),
                                  and the [policies.<id>] and [mapping] tables when it has them
    runs/<name>/spaces.json       the policy's observation and action space descriptions
                                  (several policies: {"policies": {id: {...}}})
    runs/<name>/checkpoints/      ckpt_<updates>.pt (torch.load(weights_only=True) safe)
    runs/<name>/policies/<id>/    several policies: each one's checkpoints/ and weights.npz
                                  (see :mod:`rlserve.server.policies`)
    runs/<name>/events.out.tfevents.*   TensorBoard scalars
    runs/<name>/progress.csv      a row of metrics per report (:mod:`rlserve.run.progress_file`)
    runs/<name>/server/           an Algorithm's attached server: its event files and progress.csv
    runs/<name>/endpoints.json    where the running server listens (see :data:`ENDPOINTS_FILE`)
    runs/<name>/run.lock          locked by the one process that serves or trains the run, its
                                  pid inside (see :mod:`rlserve.run.run_lock`)
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from rlserve.errors import ConfigError
from rlserve.run.durable import atomic_write_bytes
from rlserve.run.run_lock import RunLock

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

ENDPOINTS_FILE = "endpoints.json"
"""Where a server writes its addresses once it listens, for launchers and ``rlserve status``.

``{"state": "running", "pid": ..., "machine": host name, "started": ISO time, "tls": bool,
"binary": {"host", "port", "url"}, "http": {"host", "port", "url"}}`` (``http`` is the binary
port when there is no separate HTTP port), written atomically once both carriers listen (so a
launcher that passed ``--port 0`` can read the ports instead of parsing stdout). On a clean exit
``state`` becomes ``"stopped"`` and ``stopped`` gives the time; after a crash it still says
``"running"``, with a ``pid`` that no longer runs on ``machine`` (``rlserve status`` checks it
there).
"""

IN_USE_NEW = "stop it or choose another --name"
"""The fix named when a new run's folder is held by another process (:meth:`RunFolder.hold`)."""

IN_USE_RESUME = "stop that process first (one process writes a run at a time)"
"""The fix named when a run to resume is held by another process (:meth:`RunFolder.hold`)."""


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def endpoints(host: str, port: int, http_port: int | None, tls: bool) -> dict[str, Any]:
    """The content of :data:`ENDPOINTS_FILE` for a server that listens now."""
    shown = f"[{host}]" if ":" in host else host
    binary_scheme, http_scheme = ("tls", "https") if tls else ("tcp", "http")
    return {
        "state": "running",
        "pid": os.getpid(),
        "machine": socket.gethostname(),
        "started": _now_iso(),
        "tls": tls,
        "binary": {"host": host, "port": port, "url": f"{binary_scheme}://{shown}:{port}"},
        "http": None
        if http_port is None
        else {"host": host, "port": http_port, "url": f"{http_scheme}://{shown}:{http_port}"},
    }


def resume_command(path: Path) -> str:
    """The command that continues the run in ``path``: ``rlserve train`` or ``rlserve serve``.

    A run of ``rlserve train`` holds its training state (``algorithm.json``) and no experience
    log; every other run (``rlserve serve``, ``rlserve demo``) is served.
    """
    trained = (path / "algorithm.json").exists() and not (path / "experience").is_dir()
    return f"rlserve {'train' if trained else 'serve'} --resume {path}"


@dataclass(slots=True)
class RunFolder:
    """Paths of one run."""

    path: Path
    token_required: bool = False
    """Set by :meth:`load`: the run was started with a token (which is not saved)."""
    lock: RunLock | None = field(default=None, repr=False, compare=False)
    """This process's exclusive lock of the folder, while it holds it (:meth:`hold`)."""

    def hold(self, fix: str, replacing: RunFolder | None = None) -> RunFolder:
        """Lock the folder for this process until :meth:`release` or its exit; return it.

        Every process that writes a run (a server, a training run) holds it, so that a second
        one is refused instead of overwriting its checkpoints and ``endpoints.json``.

        Args:
            fix: What to do when another process holds it (ends the error message).
            replacing: The folder held so far, released once this one is held; when it is the
                same folder, it is returned (still held) instead of locking it twice.

        Raises:
            ConfigError: Another process holds it: ``"<folder> is in use by pid N; <fix>"``.
        """
        if replacing is not None and replacing.path.resolve() == self.path.resolve():
            return replacing.hold(fix)
        if self.lock is None or not self.lock.held:
            self.lock = RunLock.acquire(self.path, fix)
        if replacing is not None:
            replacing.release()
        return self

    def release(self) -> None:
        """Let another process open the folder (a no-op when this one does not hold it)."""
        if self.lock is not None:
            self.lock.release()

    @property
    def config_file(self) -> Path:
        """The saved configuration."""
        return self.path / "config.toml"

    @property
    def spaces_file(self) -> Path:
        """The saved space descriptions."""
        return self.path / "spaces.json"

    @classmethod
    def create(cls, run_dir: str, name: str | None) -> RunFolder:
        """Make a new run folder (``name`` defaults to a timestamp).

        A timestamp taken already (two runs started in one second) gets ``-2``, ``-3``...: the
        folder is created atomically, so two processes never share one.

        Raises:
            ConfigError: The named folder exists already (resume it with ``--resume`` instead).
        """
        if not name:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            for n in itertools.count(1):
                path = Path(run_dir) / (stamp if n == 1 else f"{stamp}-{n}")
                try:
                    path.mkdir()
                except FileExistsError:
                    continue
                return cls(path)
        path = Path(run_dir) / str(name)
        if (path / "config.toml").exists():
            raise ConfigError(
                f"run folder {path} exists; continue it with '{resume_command(path)}' or "
                "choose another --name"
            )
        path.mkdir(parents=True, exist_ok=True)
        return cls(path)

    @classmethod
    def existing(cls, path: str | Path) -> RunFolder:
        """Open a run folder to resume.

        Raises:
            ConfigError: It is not a run folder.
        """
        folder = cls(Path(path))
        if not folder.config_file.exists() or not folder.spaces_file.exists():
            raise ConfigError(
                f"{path} is not a run folder (no config.toml and spaces.json); pass the folder "
                "that 'rlserve serve' created, e.g. runs/<name>"
            )
        return folder

    def save(self, tables: dict[str, dict[str, Any]], spaces: dict[str, Any]) -> None:
        """Write the configuration tables and the space descriptions.

        The server's token is left out (a run folder is copied, shared and backed up; the token
        must not travel with it); ``token_required = true`` takes its place, so a resumed server
        asks for it again.
        """
        server = dict(tables.get("server", {}))
        if server.pop("token", None) or server.get("token_required"):
            server["token_required"] = True
        self.config_file.write_text(tomli_w.dumps({**tables, "server": server}))
        self.spaces_file.write_text(json.dumps(spaces, indent=2))

    def token_refusal(self, how_to_pass: str) -> str:
        """The error of a resume without a token of a run served with one, with the fix."""
        return (
            f"the run in {self.path} was served with a token in an earlier session (a token is "
            f"never saved in the run folder): {how_to_pass}; to serve it without a token from "
            f"now on, delete the line 'token_required = true' of {self.config_file}"
        )

    def load(self) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """Read what :meth:`save` wrote; ``token_required`` is moved to :attr:`token_required`.

        A ``token`` found in the file (written by an older rlserve) is dropped as well: on
        ``--resume`` the token comes from ``--token`` or ``RLSERVE_TOKEN`` only.
        """
        with self.config_file.open("rb") as fh:
            tables = tomllib.load(fh)
        server = tables.setdefault("server", {})
        self.token_required = bool(server.pop("token_required", False))
        if server.pop("token", None):
            self.token_required = True
        return tables, json.loads(self.spaces_file.read_text())

    @property
    def endpoints_file(self) -> Path:
        """Where the running server's addresses are (:data:`ENDPOINTS_FILE`)."""
        return self.path / ENDPOINTS_FILE

    def write_endpoints(self, content: dict[str, Any]) -> None:
        """Replace :attr:`endpoints_file` atomically (a reader sees the old or the new file)."""
        atomic_write_bytes(self.endpoints_file, (json.dumps(content, indent=2) + "\n").encode())

    def mark_stopped(self) -> None:
        """Say in :attr:`endpoints_file` that the server stopped cleanly (and when)."""
        try:
            content = json.loads(self.endpoints_file.read_text())
        except (OSError, ValueError):
            return
        if content.get("pid") == os.getpid():
            self.write_endpoints({**content, "state": "stopped", "stopped": _now_iso()})
