"""TLS on both carriers, end to end: a real server with a certificate from a test CA (trustme).

A ``tls://`` or ``https://`` address verifies the server's certificate and host name and never
falls back to plain text; a plain client and a TLS server (or the reverse) fail with an error
that names the fix.
"""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from e2e_support import play_cartpole

from rlserve import PolicyClient, TLSError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GOOD = [0.01, -0.02, 0.03, 0.04]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for localhost and 127.0.0.1, and an unrelated CA."""
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    issued = ca.issue_cert("localhost", "127.0.0.1")
    paths = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key", "other_ca")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    paths["cert"].write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(paths["key"]))
    trustme.CA().cert_pem.write_to_path(str(paths["other_ca"]))
    return paths


@pytest.fixture(scope="module")
def server(module_launcher: Any, pki: dict[str, Path]) -> Any:
    handle = module_launcher("--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]))
    handle.http_verify = ssl.create_default_context(cafile=str(pki["ca"]))
    return handle


@pytest.fixture(scope="module")
def plain_server(module_launcher: Any) -> Any:
    return module_launcher()


def test_listening_line_names_the_tls_schemes(server: Any) -> None:
    line = next(line for line in server.stdout_lines if "rlserve listening on" in line)
    assert f"tls://127.0.0.1:{server.port} (binary)" in line
    assert f"https://127.0.0.1:{server.http_port} (HTTP)" in line


def test_binary_carrier_over_tls_with_a_private_ca(server: Any, pki: dict[str, Path]) -> None:
    client = PolicyClient(
        f"tls://127.0.0.1:{server.port}", inference_mode="remote", tls_ca=str(pki["ca"]), timeout=30
    )
    try:
        result = play_cartpole(client, seed=3, max_steps=5)
        assert result.length >= 1
    finally:
        client.close()


def test_https_address_and_ca_from_the_environment(
    server: Any, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSERVE_TLS_CA", str(pki["ca"]))
    client = PolicyClient(f"https://localhost:{server.port}", inference_mode="remote", timeout=30)
    try:
        episode_id = client.start_episode()
        assert client.get_action(episode_id, GOOD) in (0, 1)
        client.end_episode(episode_id, GOOD)
    finally:
        client.close()


def test_local_inference_over_tls(server: Any, pki: dict[str, Path]) -> None:
    server.wait_for_weights()
    client = PolicyClient(
        f"tls://localhost:{server.port}", inference_mode="local", tls_ca=str(pki["ca"]), timeout=30
    )
    try:
        result = play_cartpole(client, seed=4, max_steps=5)
        assert result.length >= 1
    finally:
        client.close()
    server.wait_until(lambda m: m["samples/steps_reported"] >= result.length, what="the report")


def test_http_carrier_over_https(server: Any, pki: dict[str, Path]) -> None:
    with httpx.Client(base_url=server.http_url, verify=server.http_verify, timeout=30) as http:
        assert server.http_url.startswith("https://")
        assert http.get("/v1/health").status_code == 200
        started = http.post("/v1/start_episode", json={})
        assert started.status_code == 200, started.text
        episode_id = started.json()["episode_id"]
        reply = http.post("/v1/get_action", json={"episode_id": episode_id, "observation": GOOD})
        assert reply.status_code == 200, reply.text
        assert reply.json()["action"] in (0, 1)
    # Plain HTTP to the HTTPS port gets no answer in plain text.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.http_port}/v1/health", timeout=10)


def test_a_certificate_from_another_ca_is_refused(server: Any, pki: dict[str, Path]) -> None:
    with pytest.raises(TLSError, match=r"not accepted.*tls_ca"):
        PolicyClient(
            f"tls://127.0.0.1:{server.port}",
            inference_mode="remote",
            tls_ca=str(pki["other_ca"]),
            timeout=10,
        )
    # Without tls_ca only the system's CAs are trusted, and they did not issue this one.
    with pytest.raises(TLSError, match="RLSERVE_TLS_CA"):
        PolicyClient(f"tls://127.0.0.1:{server.port}", inference_mode="remote", timeout=10)
    with pytest.raises(httpx.ConnectError):
        httpx.get(
            f"{server.http_url}/v1/health",
            verify=ssl.create_default_context(cafile=str(pki["other_ca"])),
            timeout=10,
        )


def test_a_plain_client_against_a_tls_server_fails_clearly(
    server: Any, pki: dict[str, Path]
) -> None:
    for _ in range(5):
        with pytest.raises(TLSError, match=rf"speaks TLS.*tls://127\.0\.0\.1:{server.port}"):
            PolicyClient(
                f"127.0.0.1:{server.port}", inference_mode="remote", timeout=10, reconnect_timeout=1
            )
    # The server shrugs the bad handshakes off: no traceback, and TLS clients still work.
    assert "Traceback" not in server.log()
    client = PolicyClient(
        f"tls://127.0.0.1:{server.port}", inference_mode="remote", tls_ca=str(pki["ca"]), timeout=30
    )
    client.close()


def test_tls_against_a_plain_server_fails_before_anything_is_sent(plain_server: Any) -> None:
    # The binary port (binary framing answers the handshake) and the HTTP port (uvicorn does).
    for port in (plain_server.port, plain_server.http_port):
        with pytest.raises(TLSError, match=rf"handshake.*plain text.*tcp://127\.0\.0\.1:{port}"):
            PolicyClient(f"tls://127.0.0.1:{port}", inference_mode="remote", timeout=10)
    assert plain_server.alive()


def test_a_tls_address_never_sends_the_hello_in_clear() -> None:
    # A listener that records what a tls:// client sends and answers in plain text.
    listener = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            received.extend(conn.recv(65536))
            conn.sendall(b"\x00\x00\x00\x05hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    try:
        with pytest.raises(TLSError):
            PolicyClient(
                f"tls://127.0.0.1:{port}", inference_mode="remote", token="s3cret", timeout=10
            )
    finally:
        thread.join(10)
        listener.close()
    assert received[:1] == b"\x16", "the first bytes must be a TLS handshake record"
    assert b"s3cret" not in received
    assert b"hello" not in received
