"""The ``rlserve`` command: serve, train, demo, status, check-env and export."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the ``rlserve`` command (the console script's entry point).

    The commands are imported only when the command runs, so ``import rlserve.cli.demo`` stays
    light.
    """
    from rlserve.cli.commands import main as run

    return run(argv)
