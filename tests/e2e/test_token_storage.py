"""The token: from ``RLSERVE_TOKEN`` on both sides, never written to the run folder or printed,
and asked for again on ``--resume``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rlserve import AuthenticationError, PolicyClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "env-token-7f3a9c1e5b"


def test_token_from_the_environment_is_never_saved_and_resume_asks_again(
    launch_server: Any, run_rlserve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSERVE_TOKEN", TOKEN)
    server = launch_server()
    # The client reads RLSERVE_TOKEN too.
    client = PolicyClient(server.address, inference_mode="remote", timeout=30)
    episode_id = client.start_episode()
    assert client.get_action(episode_id, [0.0, 0.0, 0.0, 0.0]) in (0, 1)
    client.end_episode(episode_id, [0.0, 0.0, 0.0, 0.0])
    client.close()
    with pytest.raises(AuthenticationError):
        PolicyClient(server.address, inference_mode="remote", token="wrong", timeout=30)
    # The HTTP carrier takes the same token.
    assert server.metrics(TOKEN)["episodes/completed"] >= 0
    refused = httpx.get(f"{server.http_url}/v1/metrics", timeout=10)
    assert refused.status_code == 401
    metrics_text = httpx.get(
        f"{server.http_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ).text

    saved = (server.run_folder / "config.toml").read_text()
    assert TOKEN not in saved
    assert "token_required = true" in saved
    assert server.stop() == 0
    for where in (server.stdout(), server.log(), metrics_text):
        assert TOKEN not in where
    assert not any(
        TOKEN.encode() in p.read_bytes() for p in server.run_folder.rglob("*") if p.is_file()
    )

    monkeypatch.delenv("RLSERVE_TOKEN")
    refused_resume = run_rlserve("serve", "--resume", str(server.run_folder), "--no-progress")
    assert refused_resume.returncode == 2
    assert "RLSERVE_TOKEN" in refused_resume.stderr
    assert "--token" in refused_resume.stderr
    assert "delete the line 'token_required = true'" in refused_resume.stderr

    resumed = launch_server("--token", TOKEN, resume=server.run_folder)
    with pytest.raises(AuthenticationError):
        PolicyClient(resumed.address, inference_mode="remote", timeout=30)
    PolicyClient(resumed.address, inference_mode="remote", token=TOKEN, timeout=30).close()
    assert TOKEN not in (server.run_folder / "config.toml").read_text()


def test_a_token_in_an_old_run_folder_is_removed_on_resume(
    launch_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = launch_server("--token", TOKEN)
    assert server.stop() == 0
    config = server.run_folder / "config.toml"
    # What older versions wrote: the token in clear text.
    config.write_text(config.read_text().replace("[server]\n", f'[server]\ntoken = "{TOKEN}"\n'))
    monkeypatch.setenv("RLSERVE_TOKEN", TOKEN)
    resumed = launch_server(resume=server.run_folder)
    PolicyClient(resumed.address, inference_mode="remote", timeout=30).close()
    assert TOKEN not in config.read_text()


def test_a_token_without_tls_off_loopback_is_warned_about(launch_server: Any) -> None:
    server = launch_server("--host", "0.0.0.0", "--token", TOKEN)
    assert "without TLS" in server.log()
    assert "--tls-cert" in server.log()
    assert TOKEN not in server.log() + server.stdout()
