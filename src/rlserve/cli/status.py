"""``rlserve status``: a running server's progress, clients, episodes and learner, in a few lines.

It reads ``GET /v1/health`` and ``GET /v1/metrics`` from the server's HTTP carrier, found from a
run folder's ``endpoints.json`` or given as an address; a run folder that no server serves now
is summarised from its files instead (:mod:`rlserve.cli.run_summary`). Standard library only,
but for rich on a colour terminal.
"""

from __future__ import annotations

import json
import math
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from rlserve.cli.run_summary import folder_summary, format_summary, server_gone
from rlserve.config.fields import TOKEN_ENV
from rlserve.errors import ConfigError
from rlserve.run.progress_file import PROGRESS_FILE
from rlserve.server.config import is_loopback

TLS_CA_ENV = "RLSERVE_TLS_CA"
"""Environment variable with the CA file of a TLS server's certificate."""


def _newest_run(runs: Path) -> Path | None:
    found = [*runs.glob("*/endpoints.json"), *runs.glob(f"*/{PROGRESS_FILE}")]
    found.sort(key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


def _served_live(folder: Path) -> bool:
    """Whether ``folder``'s server runs with an HTTP carrier (``endpoints.json``, its pid)."""
    try:
        endpoints = json.loads((folder / "endpoints.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        endpoints.get("state") != "stopped"
        and bool(endpoints.get("http"))
        and not server_gone(endpoints)
    )


def http_url(target: str | None) -> tuple[str, str]:
    """The base URL of the server's HTTP carrier and a description of where it came from.

    Args:
        target: A run folder (with ``endpoints.json``), ``host:port``, or a URL of either of
            the server's ports (``http(s)://``, or endpoints.json's ``tcp://``/``tls://``; a path
            is left out); None looks for the newest run under ``runs/``.

    Raises:
        ConfigError: Nothing to connect to (no run folder, a stopped server, no HTTP carrier).
    """
    if target is None:
        folder = _newest_run(Path("runs"))
        if folder is None:
            raise ConfigError(
                "no run folder with an endpoints.json or a progress.csv under runs/; pass the run "
                "folder (rlserve status runs/<name>) or the HTTP address (rlserve status "
                "localhost:9901)"
            )
        target = str(folder)
    path = Path(target)
    if path.is_dir():
        endpoints_file = path / "endpoints.json"
        try:
            endpoints = json.loads(endpoints_file.read_text())
        except FileNotFoundError:
            raise ConfigError(_not_served(path)) from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{endpoints_file}: unreadable ({exc})") from None
        if endpoints.get("state") == "stopped":
            raise ConfigError(
                f"the server of {path} stopped at {endpoints.get('stopped', '?')}; start it again "
                f"with 'rlserve serve --resume {path}'"
            )
        if server_gone(endpoints):
            raise ConfigError(
                f"the server of {path} is not running: its process ({endpoints['pid']}) is gone, "
                f"killed or crashed; start it again with 'rlserve serve --resume {path}'"
            )
        http = endpoints.get("http")
        if not http:
            raise ConfigError(
                f"the server of {path} runs without its HTTP carrier (--http-port -1), which "
                "'rlserve status' reads; restart it with an --http-port"
            )
        host = str(http["host"])
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        shown = f"[{host}]" if ":" in host else host
        scheme = "https" if endpoints.get("tls") else "http"
        return f"{scheme}://{shown}:{int(http['port'])}", f"run folder {path}"
    if "://" not in target:
        if ":" not in target:
            raise ConfigError(
                f"'{target}' is neither a run folder nor an address; pass runs/<name> or "
                "host:port of the HTTP carrier (default port 9901)"
            )
        target = f"http://{target}"
    scheme, _, rest = target.partition("://")
    # The binary port answers HTTP too, so endpoints.json's tcp:// and tls:// URLs work as given.
    scheme = {"tcp": "http", "tls": "https"}.get(scheme.lower(), scheme.lower())
    if scheme not in ("http", "https"):
        raise ConfigError(
            f"'{target}': rlserve status reads the server's HTTP API; pass host:port, "
            "http://host:port or https://host:port (either of the server's ports)"
        )
    base = f"{scheme}://{rest.split('/', 1)[0]}"  # a path (/v1/health) is left out
    return base, base


def _not_served(path: Path) -> str:
    """Why ``path`` (a folder without ``endpoints.json``) cannot be asked, with the fix."""
    if (path / "config.toml").exists():
        return (
            f"{path} has no endpoints.json: the server of this run folder never listened; pass "
            "the server's address instead, e.g. localhost:9901"
        )
    try:
        runs = [
            child
            for child in path.iterdir()
            if (child / "endpoints.json").exists() or (child / "config.toml").exists()
        ]
    except OSError as exc:
        return f"{path} cannot be read ({exc}); pass runs/<name> or the server's address"
    if runs:
        runs.sort(key=lambda run: run.stat().st_mtime, reverse=True)
        shown = ", ".join(map(str, runs[:5])) + (", ..." if len(runs) > 5 else "")
        return (
            f"{path} is a folder of runs, not a run folder; pass one of them (newest first: "
            f"{shown}), or nothing for the newest under runs/"
        )
    return (
        f"{path} is not a run folder (it has no config.toml nor endpoints.json); pass "
        "runs/<name> or the server's address, e.g. localhost:9901"
    )


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """An rlserve server never redirects its API, and urllib would send the token along."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _get(url: str, token: str | None, context: ssl.SSLContext | None, timeout: float) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(
        _NoRedirects(), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(request, timeout=timeout) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            problem = "refused the token given" if token else "needs its token"
            raise ConfigError(
                f"{url}: the server {problem}; pass its --token value as --token SECRET or in "
                f"{TOKEN_ENV}"
            ) from None
        raise ConfigError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(
            f"no rlserve server answers at {url.rsplit('/v1/', 1)[0]} ({reason}); is it "
            "running? Start it with 'rlserve serve', or pass its run folder or HTTP address"
        ) from None
    except ValueError:
        raise ConfigError(
            f"{url} did not answer with JSON: is this the HTTP port of an rlserve server "
            "(default 9901)?"
        ) from None


def _number(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if digits:
        return f"{float(value):,.{digits}f}"
    return f"{int(value):,d}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


LEARNER_FIGURES: dict[str, tuple[tuple[str, str, int], ...]] = {
    "ppo": (
        ("policy loss", "policy_loss", 4),
        ("value loss", "value_loss", 4),
        ("entropy", "entropy", 3),
        ("kl", "approx_kl", 4),
    ),
    "dqn": (
        ("q loss", "q_loss", 4),
        ("q mean", "q_mean", 3),
        ("epsilon", "epsilon", 3),
        ("replay", "replay_size", 0),
    ),
    "sac": (
        ("critic loss", "critic_loss", 4),
        ("actor loss", "actor_loss", 4),
        ("alpha", "alpha", 4),
        ("entropy", "entropy", 3),
    ),
}
"""Each algorithm's learner figures that ``rlserve status`` shows: (label, ``learner/`` name
without the prefix, decimals); the names are those the algorithm reports (docs/metrics.md)."""

_MARKERS = (("dqn", "q_loss"), ("sac", "critic_loss"))
"""A name only that algorithm reports: a server lists it from the start for the policies that
train with it. Every server lists PPO's names, so PPO is the algorithm without a marker."""


def learner_algorithm(metrics: dict[str, Any], prefix: str = "") -> str:
    """The algorithm of the learner whose metrics are under ``prefix`` (``policies/<id>/``)."""
    for name, marker in _MARKERS:
        if f"{prefix}learner/{marker}" in metrics:
            return name
    return "ppo"


def _figures(metrics: dict[str, Any], algo: str, prefix: str = "") -> str:
    shown = ", ".join(
        f"{label} {_number(metrics.get(f'{prefix}learner/{name}'), digits)}"
        for label, name, digits in LEARNER_FIGURES[algo]
    )
    return f"{algo}: {shown}"


def status_rows(
    where: str, health: dict[str, Any], metrics: dict[str, Any]
) -> list[tuple[str, str]]:
    """The status as (label, text) rows.

    The learner row and each policy's row show the figures of that learner's own algorithm
    (:data:`LEARNER_FIGURES`); with policies of several algorithms the learner row leaves them
    to the policy rows (the totals of a statistic are only the newest update's).
    """
    m = metrics
    version = int(m.get("server/weights_version", -1))
    policies = sorted({k.split("/")[1] for k in m if k.startswith("policies/")})
    algos = {pid: learner_algorithm(m, f"policies/{pid}/") for pid in policies}
    kinds = set(algos.values()) if policies else {learner_algorithm(m)}
    figures = (
        _figures(m, kinds.pop())
        if len(kinds) == 1
        else f"algorithms {', '.join(sorted(kinds))}: see each policy"
    )
    rows = [
        (
            "server",
            f"{where}: {health.get('status', '?')}, rlserve {health.get('server_version', '?')}, "
            f"up {_duration(m.get('server/uptime_seconds') or 0)}",
        ),
        (
            "progress",
            f"{_number(m.get('samples/env_steps'))} env steps, "
            f"{_number(m.get('samples/env_steps_per_second'), 1)} steps/s, "
            + (f"weights v{version}" if version >= 0 else "no weights yet"),
        ),
        (
            "clients",
            f"{_number(m.get('server/clients'))} connected, "
            f"{_number(m.get('server/errors'))} error replies",
        ),
        (
            "episodes",
            f"{_number(m.get('episodes/started'))} started, "
            f"{_number(m.get('episodes/completed'))} completed, "
            f"{_number(m.get('episodes/timed_out'))} timed out, "
            f"{_number(m.get('server/episodes_active'))} active; "
            f"return(100) {_number(m.get('episodes/return_mean'), 2)}, "
            f"length(100) {_number(m.get('episodes/length_mean'), 1)}",
        ),
        (
            "learner",
            f"{_number(m.get('learner/updates'))} updates, "
            f"{_number(m.get('learner/steps_trained'))} steps trained, "
            f"{_number(m.get('samples/steps_queued'))} waiting; {figures}; "
            f"{_number(m.get('learner/restarts'))} restarts",
        ),
    ]
    for pid in policies:
        p = f"policies/{pid}/"
        rows.append(
            (
                "policy",
                f"{pid}: weights v{_number(m.get(p + 'weights_version'))}, "
                f"{_number(m.get(p + 'learner/updates'))} updates, "
                f"{_number(m.get(p + 'learner/steps_trained'))} steps trained, "
                f"return(100) {_number(m.get(p + 'episodes/return_mean'), 2)}; "
                + _figures(m, algos[pid], p),
            )
        )
    for part, problem in (health.get("problems") or {}).items():
        rows.append(("problem", f"{part}: {problem}"))
    return rows


def format_status(where: str, health: dict[str, Any], metrics: dict[str, Any]) -> str:
    """The status as a few labelled lines (plain text)."""
    return "\n".join(f"{label:<10}{text}" for label, text in status_rows(where, health, metrics))


def print_status(where: str, health: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Print the status: a rich table on a colour terminal, else :func:`format_status`'s lines."""
    from rlserve.cli.logs import use_color

    if not use_color(sys.stdout):
        print(format_status(where, health, metrics))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None, padding=(0, 1))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for label, text in status_rows(where, health, metrics):
        table.add_row(label, text, style="red" if label == "problem" else None)
    Console(file=sys.stdout).print(table)


def run_status(
    target: str | None,
    token: str | None = None,
    tls_ca: str | None = None,
    as_json: bool = False,
    timeout: float = 5.0,
) -> int:
    """Print a running server's status, or a run folder's summary; the ``rlserve status`` command.

    A run folder whose server does not run (a finished served run, a hosted run) is summarised
    from its ``progress.csv`` and checkpoints (:mod:`rlserve.cli.run_summary`).

    Returns:
        0 when the server answered or the folder was summarised.

    Raises:
        ConfigError: The server cannot be found or does not answer (one line, with the fix).
    """
    folder = _newest_run(Path("runs")) if target is None else Path(target)
    if (
        folder is not None
        and folder.is_dir()
        and not _served_live(folder)
        and (folder / PROGRESS_FILE).exists()
    ):
        summary = folder_summary(folder)
        if as_json:
            json.dump(summary, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(format_summary(summary))
        return 0
    base, where = http_url(target)
    token = token or os.environ.get(TOKEN_ENV) or None
    host = urllib.parse.urlsplit(base).hostname or ""
    if token and where != base and not is_loopback(host):
        # A run folder may come from anyone: its endpoints.json must not steer the token away.
        raise ConfigError(
            f"{where}: its endpoints.json names {host}, not this machine's loopback; rlserve "
            f"status sends the token only to an address you give: rlserve status {base}"
        )
    tls_ca = tls_ca or os.environ.get(TLS_CA_ENV) or None
    context = None
    if base.startswith("https://"):
        try:
            context = ssl.create_default_context(cafile=tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-ca {tls_ca}: cannot load it ({exc})") from None
    health = _get(f"{base}/v1/health", None, context, timeout)
    metrics = _get(f"{base}/v1/metrics", token, context, timeout)
    if as_json:
        json.dump({"health": health, "metrics": metrics}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_status(where if where == base else f"{base} ({where})", health, metrics)
    return 0
