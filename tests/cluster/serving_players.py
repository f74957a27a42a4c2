"""Clients that play CartPole against a server and count what they did (cluster serving tests)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx

from conftest import HEAD_IP, SECOND_IP, _cluster_pids
from rlserve import PolicyClient
from rlserve.client.local import LocalConfig
from rlserve.errors import EpisodeLostError, RLServeError
from rlserve.run.experience_log import LogCorruptError, LogReader

SMALL_PPO = (
    *("--ppo-train-batch-size", "256", "--ppo-minibatch-size", "128", "--ppo-num-epochs", "1"),
    *("--fragment-length", "16", "--max-sample-queue-steps", "1000000"),
)
"""Flags of a server whose PPO learner updates often on little data (the serving tests')."""

STEP_S = 0.002
"""A simulator's time per step: a few hundred steps a second per client, not tens of thousands."""

STALL_S = 60.0
"""Seconds without any headway after which a wait fails (a slow machine only slows headway)."""

START_S = 240.0
"""Seconds a wait without a measure of headway (a process starting) gets."""

LIMIT_S = 300.0
"""Seconds any wait gets: headway that never meets the condition fails too, not at the test's
timeout (which says nothing of what was awaited)."""


class LocalPlayer(threading.Thread):
    """Plays CartPole through a local-inference client and counts every step it took."""

    def __init__(self, address: str | list[str], seed: int):
        super().__init__(daemon=True)
        patient = LocalConfig(
            batch_steps=64, batch_interval=0.05, max_buffered_steps=50_000, when_full="block"
        )
        self.client = PolicyClient(
            address,
            inference_mode="local",
            local=patient,
            reconnect_timeout=60,
            update_interval=0.5,
        )
        self.seed = seed
        self.stop = threading.Event()
        self.steps = 0

    def run(self) -> None:
        env = gym.make("CartPole-v1")
        episode = 0
        while not self.stop.is_set():
            obs, _ = env.reset(seed=self.seed + episode)
            eid = self.client.start_episode()
            done = truncated = terminated = False
            while not done:
                action = self.client.get_action(eid, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                self.client.log_returns(eid, float(reward))
                self.steps += 1
                done = terminated or truncated
                time.sleep(STEP_S)
            self.client.end_episode(eid, obs, truncated=truncated and not terminated)
            episode += 1

    def state(self) -> str:
        """What it did so far, in words (for a failing test's message)."""
        local = self.client.local
        assert local is not None
        return (
            f"{self.steps} steps, on {self.client.front_end}, {local.shipped_steps} shipped, "
            f"{local.buffered_steps} buffered, alive {self.is_alive()}"
        )

    def finish(self) -> None:
        """Stop playing, and send every batch still buffered."""
        self.stop.set()
        self.join(60)
        # Its shipper may be far behind on a loaded machine (the server gets little CPU).
        self.client.close(timeout=120)


class RemotePlayer(threading.Thread):
    """Plays CartPole through a remote-inference client, starting over after a lost episode."""

    def __init__(self, address: str | list[str], seed: int):
        super().__init__(daemon=True)
        self.client = PolicyClient(
            address, inference_mode="remote", timeout=30, reconnect_timeout=60
        )
        self.seed = seed
        self.stop = threading.Event()
        self.episodes = 0
        self.lost = 0
        self.calls = 0
        self.errors: list[str] = []

    def run(self) -> None:
        env = gym.make("CartPole-v1")
        while not self.stop.is_set():
            try:
                obs, _ = env.reset(seed=self.seed + self.episodes)
                eid = self.client.start_episode()
                for _ in range(60):
                    action = self.client.get_action(eid, obs)
                    self.calls += 1
                    obs, reward, terminated, truncated, _ = env.step(action)
                    self.client.log_returns(eid, float(reward))
                    if terminated or truncated:
                        break
                    time.sleep(STEP_S)
                self.client.end_episode(eid, obs)
                self.episodes += 1
            except EpisodeLostError:
                self.lost += 1
            except RLServeError as exc:
                self.errors.append(str(exc))
                time.sleep(0.05)

    def state(self) -> str:
        """What it did so far, in words (for a failing test's message)."""
        return (
            f"{self.episodes} episodes, {self.lost} lost, {self.calls} calls, on "
            f"{self.client.front_end}, errors {self.errors[-2:]}, alive {self.is_alive()}"
        )

    def finish(self) -> None:
        """Stop playing."""
        self.stop.set()
        self.join(60)
        self.client.close()


def port_free_on_both() -> int:
    """A port free on both nodes' addresses (every front-end listens on the same one)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind((HEAD_IP, 0))
            port = int(sock.getsockname()[1])
        with socket.socket() as other:
            try:
                other.bind((SECOND_IP, port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free on both nodes")


def front_ends(run: Path, timeout: float = START_S, **want: Any) -> list[dict[str, Any]]:
    """The two front-ends of ``endpoints.json`` in ``run``, once listed (and ``want`` holds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            entries = json.loads((run / "endpoints.json").read_text()).get("front_ends", [])
        except (OSError, ValueError):
            entries = []
        if (
            len(entries) == 2
            and entries[1].get("pid")
            and all(entries[1].get(k) == v for k, v in want.items())
        ):
            return list(entries)
        time.sleep(0.2)
    raise AssertionError(f"endpoints.json never listed both front-ends ({want})")


def metrics(entry: dict[str, Any]) -> dict[str, Any]:
    """A front-end's ``/v1/metrics``; empty while it does not answer (dead, or busy)."""
    url = f"http://{entry['host']}:{entry['http_port']}/v1/metrics"
    try:
        return dict(httpx.get(url, timeout=10).json())
    except httpx.HTTPError:
        return {}


def wait_for(
    condition: Callable[[], bool],
    what: str,
    headway: Callable[[], Any] | None = None,
    state: Callable[[], str] | None = None,
    logs: tuple[Path, ...] = (),
    stall_s: float = STALL_S,
) -> None:
    """Wait until ``condition()``; fail once it has made no headway for ``stall_s`` s.

    ``headway()`` is something that changes while the system under test works towards the
    condition (e.g. a client's count of calls): on a loaded machine work is slow, not stuck,
    so only a stall fails the wait. Until the headway first moves (or without one: a process
    starting) the wait gets :data:`START_S` seconds; in all, at most :data:`LIMIT_S` (work that
    goes on without ever meeting the condition).
    ``state()`` and the tails of ``logs`` go into the failure's message; ``stall_s`` is
    :data:`STALL_S` unless a step of the work may take longer.
    """
    last = headway() if headway is not None else None
    moved = started = time.monotonic()
    while not condition():
        now = time.monotonic()
        if headway is not None:
            current = headway()
            if current != last:
                last, moved = current, now
        stalled = now - moved > stall_s if moved > started else now - started > START_S
        if stalled or now - started > LIMIT_S:
            tails = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists())
            said = f" ({state()})" if state is not None else ""
            raise AssertionError(f"timed out waiting for {what}{said}\n{tails}")
        time.sleep(0.2)


def learner_actor_pid(temp_dir: Path, actor: str = "WorkerActor", node: str = SECOND_IP) -> int:
    """The process of the one learner actor, on ``node`` (a worker of its raylet).

    ``actor`` is its class: ``WorkerActor`` for one front-end, ``SharedLearner`` for several.
    Only this cluster's raylet's children are looked at (``temp_dir``: other sessions' Ray
    clusters are left alone).
    """
    raylets = set(_cluster_pids(temp_dir, "raylet", f"--node_ip_address={node}"))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if parent in raylets and cmdline.startswith(f"ray::{actor}".encode()):
            found.append(int(entry.name))
    assert len(found) == 1, found
    return found[0]


def merged_records(run: Path) -> list[Any]:
    """The learner's merged log, read as far as it goes."""
    reader = LogReader(run / "learner" / "experience")
    records: list[Any] = []
    try:
        records.extend(reader.records(0, 1 << 40))
    except LogCorruptError:
        pass  # its end
    finally:
        reader.close()
    return records


def every_step_merged_and_read_once(server: Any, players: Any, wait: Any) -> None:
    """The local players shipped every step; each reached the merged log once (no batch id
    twice) and the learner read the whole merged log (front-ends still replaying are waited for).
    """
    for player in players:
        assert player.client.local is not None
        assert player.client.local.buffered_steps == player.client.local.dropped_steps == 0
        assert player.client.local.rejected_steps == 0
    total = sum(player.steps for player in players)

    def reported() -> int:
        records = merged_records(server.run_folder)
        return sum(r.steps for r in records if r.kind.startswith("report"))

    wait(lambda: reported() >= total, "every reported step to be merged", reported)
    records = merged_records(server.run_folder)
    copies = Counter(r.batch_id for r in records if r.batch_id is not None)
    assert [batch for batch, n in copies.items() if n > 1] == []
    assert reported() == total

    def everything_read() -> bool:
        merged = sum(r.steps for r in merged_records(server.run_folder))
        return bool(server.metrics()["learner/steps_consumed"] == merged)

    wait(
        everything_read,
        "the learner to read the whole merged log",
        lambda: server.metrics()["learner/steps_consumed"],
    )
