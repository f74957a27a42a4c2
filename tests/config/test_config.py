"""Config dataclasses: TOML tables, flags, and the example file."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import pytest

from rlserve.config.fields import add_arguments, build, to_table
from rlserve.errors import ConfigError
from rlserve.learners.ppo import PPOSettings
from rlserve.server.config import ServerConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

EXAMPLE = Path(__file__).parents[2] / "examples" / "rlserve.toml"


def test_the_example_config_lists_every_option_with_its_default() -> None:
    tables = tomllib.loads(EXAMPLE.read_text())
    server = build(ServerConfig, tables["server"], None)
    ppo = build(PPOSettings, tables["ppo"], None)
    assert server.spaces_from == "CartPole-v1"
    assert dataclasses.replace(server, spaces_from=None) == ServerConfig()
    assert ppo == PPOSettings()
    documented = set(tables["server"]) | set(tables["ppo"])
    commented = {
        line[2:].split(" = ")[0]
        for line in EXAMPLE.read_text().splitlines()
        if line.startswith("# ") and " = ..." in line
    }
    assert {f.name for f in dataclasses.fields(ServerConfig)} <= documented | commented
    assert {f.name for f in dataclasses.fields(PPOSettings)} <= documented | commented


def test_the_example_configs_comments_are_the_options_help() -> None:
    helps = {
        (table, f.name): f.metadata["help"]
        for cls, table in ((ServerConfig, "server"), (PPOSettings, "ppo"))
        for f in dataclasses.fields(cls)
    }
    table, compared = "", 0
    for number, line in enumerate(EXAMPLE.read_text().splitlines(), 1):
        if line.startswith("["):
            table = line.strip("[]")
            continue
        match = re.match(r"^(?:# )?(\w+) = .*?  # (.*)$", line)
        if match and (table, match[1]) in helps:
            assert match[2] == helps[table, match[1]], f"examples/rlserve.toml, line {number}"
            compared += 1
    assert compared == len(helps)


def test_flags_win_over_the_table_and_unknown_keys_are_named() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, PPOSettings, prefix="ppo_")
    args = parser.parse_args(["--ppo-lr", "0.5", "--ppo-hidden", "8", "8"])
    ppo = build(PPOSettings, {"lr": 0.1, "gamma": 0.9}, args, prefix="ppo_")
    assert (ppo.lr, ppo.gamma, ppo.hidden) == (0.5, 0.9, (8, 8))
    assert build(PPOSettings, to_table(ppo), None) == ppo
    with pytest.raises(ConfigError, match=r"unknown option 'learning_rate'.*known options"):
        build(PPOSettings, {"learning_rate": 0.1}, None)


def test_binding_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ConfigError, match="--token"):
        ServerConfig(host="0.0.0.0")
    assert ServerConfig(host="0.0.0.0", token="s3cret").host == "0.0.0.0"
    assert ServerConfig(host="::1").host == "::1"


def test_the_token_never_shows_in_the_config_repr() -> None:
    assert "s3cret" not in repr(ServerConfig(host="0.0.0.0", token="s3cret"))
    with pytest.raises(ConfigError, match="empty"):
        ServerConfig(token="")


def test_token_precedence_is_flag_then_environment_then_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlserve.server.config import with_token_from_env

    parser = argparse.ArgumentParser()
    add_arguments(parser, ServerConfig)
    table = {"token": "from-toml"}
    monkeypatch.delenv("RLSERVE_TOKEN", raising=False)
    assert build(ServerConfig, with_token_from_env(table), parser.parse_args([])).token == (
        "from-toml"
    )
    monkeypatch.setenv("RLSERVE_TOKEN", "from-env")
    assert build(ServerConfig, with_token_from_env(table), parser.parse_args([])).token == (
        "from-env"
    )
    flagged = parser.parse_args(["--token", "from-flag"])
    assert build(ServerConfig, with_token_from_env(table), flagged).token == "from-flag"
    monkeypatch.setenv("RLSERVE_TOKEN", "")
    assert build(ServerConfig, with_token_from_env({}), parser.parse_args([])).token is None


def test_tls_needs_a_readable_certificate_and_its_key(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    with pytest.raises(ConfigError, match="both --tls-cert FILE and --tls-key FILE"):
        ServerConfig(tls_cert=str(cert))
    with pytest.raises(ConfigError, match=r"--tls-cert .*cert\.pem: the file does not exist"):
        ServerConfig(tls_cert=str(cert), tls_key=str(key))
    cert.write_text("junk")
    key.write_text("junk")
    config = ServerConfig(tls_cert=str(cert), tls_key=str(key))
    with pytest.raises(ConfigError, match="cannot load the TLS certificate"):
        config.ssl_context()
    assert ServerConfig().ssl_context() is None


def test_tls_context_loads_a_real_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trustme = pytest.importorskip("trustme")
    issued = trustme.CA().issue_cert("localhost")
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    issued.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    monkeypatch.chdir(tmp_path)
    config = ServerConfig(tls_cert="cert.pem", tls_key="key.pem")
    assert config.tls
    # Saved absolute, so --resume from another folder finds them.
    assert config.tls_cert == str(tmp_path / "cert.pem")
    assert config.ssl_context() is not None


def test_a_token_in_clear_text_off_loopback_is_warned_about() -> None:
    warning = ServerConfig(host="0.0.0.0", token="s3cret").plaintext_warning()
    assert warning is not None and "clear text" in warning and "s3cret" not in warning
    assert ServerConfig(token="s3cret").plaintext_warning() is None


def test_max_frame_bytes_stays_below_what_looks_like_http() -> None:
    # Over 1 GiB a frame's first byte could be an HTTP method's first letter (one port serves
    # both carriers, told apart by that byte).
    assert ServerConfig(max_frame_bytes=1 << 30).max_frame_bytes == 1 << 30
    for bad in ((1 << 30) + 1, 0):
        with pytest.raises(ConfigError, match=r"max_frame_bytes is .* between 1 and 1073741824"):
            ServerConfig(max_frame_bytes=bad)


def _server_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, ServerConfig)
    return parser.parse_args(list(argv))


def test_a_flag_replaces_the_tables_alternative_setting() -> None:
    table = {"spaces_from": "CartPole-v1"}
    config = build(ServerConfig, table, _server_flags("--spaces-file", "s.json"))
    assert (config.spaces_from, config.spaces_file) == (None, "s.json")
    config = build(ServerConfig, {"spaces_file": "s.json"}, _server_flags("--spaces-from", "X-v1"))
    assert (config.spaces_from, config.spaces_file) == ("X-v1", None)
    both = _server_flags("--spaces-from", "X-v1", "--spaces-file", "s.json")
    with pytest.raises(ConfigError, match="--spaces-from and --spaces-file are alternatives"):
        build(ServerConfig, None, both)


def test_a_table_with_both_alternatives_is_refused_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "rlserve.toml"
    path.write_text('[server]\nspaces_from = "CartPole-v1"\nspaces_file = "s.json"\n')
    table = tomllib.loads(path.read_text())["server"]
    with pytest.raises(ConfigError) as caught:
        build(ServerConfig, table, _server_flags(), source=(str(path), "server"))
    assert f"{path}, line 3: [server] sets both spaces_from and spaces_file" in str(caught.value)


def test_a_value_error_names_the_file_line_and_key_or_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "rlserve.toml"
    path.write_text("[ppo]\nlr = 0.1\ntrain_batch_size = -5\n")
    table = tomllib.loads(path.read_text())["ppo"]
    with pytest.raises(ConfigError) as caught:
        build(PPOSettings, table, None, prefix="ppo_", source=(str(path), "ppo"))
    assert str(caught.value).startswith(f"{path}, line 3: [ppo] train_batch_size = -5: ")
    assert caught.value.key == "train_batch_size"

    parser = argparse.ArgumentParser()
    add_arguments(parser, PPOSettings, prefix="ppo_")
    args = parser.parse_args(["--ppo-train-batch-size", "-5"])
    with pytest.raises(ConfigError) as caught:
        build(PPOSettings, None, args, prefix="ppo_")
    assert "--ppo-train-batch-size" in str(caught.value)
    assert " train_batch_size" not in str(caught.value)
    # The flag wins over the file: its value is at fault, so the flag is named, not the file.
    with pytest.raises(ConfigError) as caught:
        build(PPOSettings, {"train_batch_size": 64}, args, prefix="ppo_", source=(str(path), "ppo"))
    assert "--ppo-train-batch-size" in str(caught.value) and str(path) not in str(caught.value)
