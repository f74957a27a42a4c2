"""A child run as ``python -m interpreter_child <fd>``: echoes its socket until EOF or "exit N"."""

from __future__ import annotations

import socket
import sys


def main() -> None:
    """Echo each line; ``exit N`` ends the process with code N."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    with sock, sock.makefile("rwb", buffering=0) as stream:
        for line in stream:
            if line.startswith(b"exit "):
                sys.exit(int(line.split()[1]))
            stream.write(line)


if __name__ == "__main__":
    main()
