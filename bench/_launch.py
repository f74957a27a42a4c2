"""A benchmark's server process: started, read up to its listening line, its output kept."""

from __future__ import annotations

import re
import signal
import subprocess
import threading


class ListeningProcess:
    """``command`` started with its output read up to the line ``listening`` matches.

    The lines before it, and those a thread reads after it, are kept in :attr:`lines` (for the
    error when the process exits early, and for a report).

    Raises:
        RuntimeError: The process exited before printing a listening line.
    """

    def __init__(self, command: list[str], listening: re.Pattern[str], what: str) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        assert self.process.stdout is not None
        match = None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            match = listening.search(line)
            if match:
                break
        if match is None:
            raise RuntimeError(f"{what} exited before listening:\n" + "\n".join(self.lines))
        self.match: re.Match[str] = match
        self._reader = threading.Thread(target=self._read_rest, daemon=True)
        self._reader.start()

    def _read_rest(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def stop(self, grace_s: float) -> None:
        """SIGTERM, then wait ``grace_s`` for it to exit before killing it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
