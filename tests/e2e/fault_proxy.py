"""A TCP proxy between a client and a real server that loses chosen replies.

It forwards binary-carrier frames both ways and reads their ``type`` and ``id``. A rule
``drop_reply(kind)`` makes it, for the next request of that kind, forward the request, wait
for the server's reply (so the server has applied the request), throw the reply away and cut
the client's connection: exactly a reply lost in the network.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from rlserve.protocol.codec import decode

_HEADER = struct.Struct(">I")


def _read_frame(sock: socket.socket, buffer: bytearray) -> bytes | None:
    """One whole frame (header included), or None when the peer closed."""
    while True:
        if len(buffer) >= 4:
            (length,) = _HEADER.unpack(buffer[:4])
            if len(buffer) >= 4 + length:
                data = bytes(buffer[: 4 + length])
                del buffer[: 4 + length]
                return data
        try:
            chunk = sock.recv(1 << 16)
        except OSError:
            return None
        if not chunk:
            return None
        buffer += chunk


def _kind_and_id(data: bytes) -> tuple[str | None, int | None]:
    try:
        message = decode(data[4:])
    except Exception:
        return None, None
    if not isinstance(message, dict):
        return None, None
    return message.get("type"), message.get("id")


class FaultProxy:
    """Listens on 127.0.0.1 and forwards every connection to ``upstream`` (``host:port``)."""

    def __init__(self, upstream: str):
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._drop: list[str] = []
        self.dropped: list[str] = []
        """Kinds of the requests whose replies were dropped, in order."""
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def drop_reply(self, kind: str) -> None:
        """Lose the reply to the next request of type ``kind`` (and cut that connection)."""
        with self._lock:
            self._drop.append(kind)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream, 10)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            doomed: dict[int, str] = {}
            threading.Thread(target=self._up, args=(client, server, doomed), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, doomed), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, doomed: dict[int, str]) -> None:
        buffer = bytearray()
        while (data := _read_frame(client, buffer)) is not None:
            kind, request_id = _kind_and_id(data)
            with self._lock:
                if kind in self._drop and isinstance(request_id, int):
                    self._drop.remove(kind)
                    doomed[request_id] = kind
            try:
                server.sendall(data)
            except OSError:
                break
        self._cut(client, server)

    def _down(self, server: socket.socket, client: socket.socket, doomed: dict[int, str]) -> None:
        buffer = bytearray()
        while (data := _read_frame(server, buffer)) is not None:
            _, reply_id = _kind_and_id(data)
            if reply_id in doomed:
                self.dropped.append(doomed.pop(reply_id))
                break
            try:
                client.sendall(data)
            except OSError:
                break
        self._cut(client, server)

    @staticmethod
    def _cut(*sockets: socket.socket) -> None:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
