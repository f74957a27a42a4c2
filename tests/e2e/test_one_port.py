"""One port, both carriers: the binary port answers HTTP requests too, with every HTTP check.

Each connection's first byte (after the TLS handshake, with TLS) decides: an HTTP method goes to
the HTTP carrier, anything else is binary framing. ``PolicyClient`` pointed at an HTTP-only port
(the separate ``--http-port``) raises one line that names the binary port.
"""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from e2e_support import RawSocket

from rlserve import ConfigError, PolicyClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "one-port-token"
GOOD = [0.01, -0.02, 0.03, 0.04]
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(module_launcher: Any) -> Any:
    """A server with the default separate HTTP port (the binary port serves HTTP as well)."""
    return module_launcher()


@pytest.fixture(scope="module")
def one_port(module_launcher: Any) -> Any:
    """A server without a separate HTTP port, with a token and short HTTP deadlines."""
    return module_launcher("--http-port", "-1", "--token", TOKEN, "--http-request-timeout", "1")


def _receive_all(conn: socket.socket) -> bytes:
    received = b""
    while chunk := conn.recv(65536):
        received += chunk
    return received


def _receive_response(conn: socket.socket) -> bytes:
    """One HTTP response with its ``content-length`` body (it may come in several reads)."""
    received = b""
    while True:
        head, _, body = received.partition(b"\r\n\r\n")
        length = re.search(rb"content-length: (\d+)", head.lower())
        if length is not None and len(body) >= int(length.group(1)):
            return received
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed after {received!r}"
        received += chunk


def test_the_listening_line_names_the_binary_port_as_the_http_port(one_port: Any) -> None:
    assert one_port.http_port == one_port.port
    assert one_port.health()["binary_port"] == one_port.port


def test_http_and_binary_clients_share_the_binary_port(server: Any) -> None:
    url = f"http://127.0.0.1:{server.port}"
    client = PolicyClient(url, timeout=30)  # RLlib's form of the address: the binary carrier
    try:
        assert client.start_episode()
        with httpx.Client(base_url=url, timeout=30) as http:  # keep-alive: one connection
            health = http.get("/v1/health")
            assert health.status_code == 200, health.text
            assert health.json()["binary_port"] == server.port
            started = http.post("/v1/start_episode", json={})
            assert started.status_code == 200, started.text
            assert http.post("/v1/ping", json={"id": 5}).json() == {"type": "pong", "id": 5}
        assert client.start_episode()  # the binary connection carried on meanwhile
    finally:
        client.close()
    # The separate HTTP port still serves HTTP alone.
    assert httpx.get(f"{server.http_url}/v1/health", timeout=30).status_code == 200


def test_the_token_holds_on_the_shared_port(one_port: Any) -> None:
    url = f"http://127.0.0.1:{one_port.port}"
    refused = httpx.post(f"{url}/v1/ping", json={}, timeout=30)
    assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
    assert httpx.get(f"{url}/v1/metrics", timeout=30).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(f"{url}/v1/ping", json={}, headers=auth, timeout=30).status_code == 200
    # The binary carrier on the same port still needs the token in hello.
    client = PolicyClient(f"127.0.0.1:{one_port.port}", token=TOKEN, timeout=30)
    client.close()


def test_host_origin_and_content_type_checks_hold_on_the_shared_port(one_port: Any) -> None:
    url = f"http://127.0.0.1:{one_port.port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    foreign_host = httpx.get(f"{url}/v1/health", headers={"Host": "evil.example"}, timeout=30)
    assert foreign_host.status_code == 421, foreign_host.text
    foreign_origin = httpx.post(
        f"{url}/v1/ping", json={}, headers={**auth, "Origin": "http://evil.example"}, timeout=30
    )
    assert foreign_origin.status_code == 403, foreign_origin.text
    form = httpx.post(
        f"{url}/v1/ping", content=b"{}", headers={**auth, "content-type": "text/plain"}, timeout=30
    )
    assert form.status_code == 415, form.text


def test_header_and_body_deadlines_hold_on_the_shared_port(one_port: Any) -> None:
    # Headers never finished: closed without a reply (the binary carrier would have answered).
    with socket.create_connection(("127.0.0.1", one_port.port), 30) as conn:
        conn.settimeout(30)
        conn.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert _receive_all(conn) == b""
    # A body that never comes: 408 in JSON.
    with socket.create_connection(("127.0.0.1", one_port.port), 30) as conn:
        conn.settimeout(30)
        conn.sendall(
            b"POST /v1/ping HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + TOKEN.encode() + b"\r\ncontent-length: 10\r\n\r\n"
        )
        reply = _receive_response(conn)
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert b'"code":"timeout"' in reply


def test_the_http_connection_cap_counts_both_ports(launch_server: Any) -> None:
    server = launch_server("--http-max-connections", "2")
    ports = [server.http_port, server.port]
    clients = [httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=30) for p in ports]
    try:
        for http in clients:  # keep-alive: each holds its connection open
            assert http.get("/v1/health").status_code == 200
        with socket.create_connection(("127.0.0.1", server.port), 30) as conn:
            conn.settimeout(30)
            conn.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            reply = _receive_all(conn)
        assert reply.startswith(b"HTTP/1.1 503"), reply
        assert b"http_max_connections" in reply
        # A binary client is not an HTTP connection: the binary port still takes it.
        with RawSocket(server.address) as raw:
            assert raw.hello()["type"] == "welcome"
    finally:
        for http in clients:
            http.close()


def test_a_client_at_the_http_port_is_told_the_binary_port(server: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        PolicyClient(f"http://127.0.0.1:{server.http_port}", timeout=10, reconnect_timeout=1)
    message = str(raised.value)
    assert f"PolicyClient('http://127.0.0.1:{server.port}')" in message, message
    assert "HTTP port" in message and "\n" not in message
    assert "frame" not in message


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    issued = ca.issue_cert("localhost", "127.0.0.1")
    paths = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    paths["cert"].write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(paths["key"]))
    return paths


@pytest.fixture(scope="module")
def tls_server(module_launcher: Any, pki: dict[str, Path]) -> Any:
    handle = module_launcher("--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]))
    handle.http_verify = ssl.create_default_context(cafile=str(pki["ca"]))
    return handle


def test_https_on_the_binary_port_sniffs_the_decrypted_stream(
    tls_server: Any, pki: dict[str, Path]
) -> None:
    url = f"https://127.0.0.1:{tls_server.port}"
    with httpx.Client(base_url=url, verify=tls_server.http_verify, timeout=30) as http:
        health = http.get("/v1/health")
        assert health.status_code == 200, health.text
        assert health.json()["binary_port"] == tls_server.port
        # The scheme is https, so the server's own origin is its https:// one.
        own = http.post("/v1/ping", json={}, headers={"Origin": url})
        assert own.status_code == 200, own.text
    client = PolicyClient(f"tls://127.0.0.1:{tls_server.port}", tls_ca=str(pki["ca"]), timeout=30)
    client.close()
    # Plain HTTP to the TLS port gets no plain-text answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{tls_server.port}/v1/health", timeout=10)


def test_a_tls_client_at_the_https_port_is_told_the_binary_port(
    tls_server: Any, pki: dict[str, Path]
) -> None:
    address = f"https://localhost:{tls_server.http_port}"
    with pytest.raises(
        ConfigError, match=rf"PolicyClient\('https://localhost:{tls_server.port}'\)"
    ):
        PolicyClient(address, tls_ca=str(pki["ca"]), timeout=10, reconnect_timeout=1)
