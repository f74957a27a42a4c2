"""A client that meets something other than rlserve's binary carrier says what it met.

Each test runs a tiny listener on 127.0.0.1 that answers whatever it receives with fixed bytes:
an HTTP server that is not rlserve, a TLS server's alert. (The same against real rlserve
servers, with the binary port named: ``tests/e2e/test_one_port.py`` and ``test_tls.py``.)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from rlserve import ConfigError, PolicyClient, TLSError

pytestmark = pytest.mark.timeout(60)

NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 9\r\n"
    b"connection: close\r\n\r\nNot Found"
)
TLS_ALERT = b"\x15\x03\x01\x00\x02\x02\x46"  # fatal protocol_version alert


def _answering(reply: bytes) -> Iterator[int]:
    """Serve on a free port; every connection gets ``reply`` to its first bytes, then a close."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(10)
        listener.close()


@pytest.fixture
def web_server() -> Iterator[int]:
    yield from _answering(NOT_FOUND)


@pytest.fixture
def tls_alert_server() -> Iterator[int]:
    yield from _answering(TLS_ALERT)


def test_an_http_server_is_named_instead_of_a_frame_size(web_server: int) -> None:
    with pytest.raises(ConfigError) as raised:
        PolicyClient(f"http://127.0.0.1:{web_server}", timeout=10, reconnect_timeout=1)
    message = str(raised.value)
    assert f"127.0.0.1:{web_server} answered in HTTP ('HTTP/1.1 404 Not Found')" in message
    assert "binary port" in message and "--port" in message
    assert "max_frame_bytes" not in message and "\n" not in message


def test_a_tls_peer_is_named_with_the_address_to_use(tls_alert_server: int) -> None:
    with pytest.raises(TLSError, match=rf"speaks TLS.*tls://127\.0\.0\.1:{tls_alert_server}"):
        PolicyClient(f"127.0.0.1:{tls_alert_server}", timeout=10, reconnect_timeout=1)
