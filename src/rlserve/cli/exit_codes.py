"""The exit statuses the ``rlserve`` commands share."""

INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, as a shell reports a process SIGINT stopped)."""
