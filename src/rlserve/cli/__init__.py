"""The ``rlserve`` command: serve, train, demo, status, check-env and export."""

from __future__ import annotations

INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, as a shell reports a process SIGINT stopped)."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``rlserve`` command (the console script's entry point).

    The commands are imported only when the command runs, so ``import rlserve.cli.demo`` stays
    light.
    """
    from rlserve.cli.commands import main as run

    return run(argv)
