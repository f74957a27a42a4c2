"""CPU per agent-step of the multi-agent paths without sockets, processes or a learner.

Run: ``python bench/multi_agent_inprocess.py remote-multi`` (or ``local-multi``,
``remote-anchor``, ``local-anchor``; ``--profile`` prints a cProfile of the run, ``--parts``
the server's time per tick by stage).

The simulator and loops of ``bench/multi_agent.py`` drive a real :class:`rlserve.PolicyClient`
whose connection is replaced by an in-process bridge to a real :class:`Service` (every message
still goes through the codec and the request parser), with random policy weights (64 x 64 tanh
layers, as the learner's defaults) and no learner: the figures are the CPU cost of the client and
the serving code alone, free of the scheduling noise of three processes on two cores. Local mode
ships its reports through the bridge, answered at once without the server's work.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from typing import Any

import gymnasium as gym
import numpy as np

import rlserve.client.policy_client as policy_client
from multi_agent import ACTIONS, OBS_DIM, FakeSim, _anchor_loop, _multi_loop
from rlserve.policy import ModelSpec
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats


class _Sink:
    def add(self, fragment: Any) -> None:
        pass

    def add_batch(self, fragments: Any, batch_id: str, on_done: Any) -> None:
        on_done(0)


class _NoLoop:
    def call_soon(self, callback: Any) -> None:
        pass


def make_service() -> Service:
    """A one-policy service with random weights, flushed by the caller."""
    obs = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
    service = Service(
        {"default": (obs, gym.spaces.Discrete(ACTIONS))},
        Limits(),
        None,
        200,
        _Sink(),
        ServerStats(),
    )
    rng = np.random.default_rng(0)
    spec = ModelSpec(OBS_DIM, ("l0", "l1", "l2"), "tanh", "categorical", ACTIONS)
    arrays = {}
    for name, (rows, cols) in zip(
        spec.actor_layers, ((64, OBS_DIM), (64, 64), (ACTIONS, 64)), strict=True
    ):
        arrays[f"{name}.weight"] = (rng.standard_normal((rows, cols)) * 0.3).astype(np.float32)
        arrays[f"{name}.bias"] = np.zeros(rows, np.float32)
    service._loop = _NoLoop()  # type: ignore[assignment]
    service.set_weights("default", WeightsPackage(1, spec, arrays))
    return service


class Timings:
    """Process CPU seconds spent in the service, by stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, stage: str, started: float) -> float:
        """Count the CPU time since ``started`` for ``stage``; return the time now."""
        now = time.process_time()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - started
        return now


def bridge(service: Service, timings: Timings) -> type:
    """A stand-in for :class:`rlserve.client.connection.Connection` that calls ``service``."""

    class Bridge:
        def __init__(self, *args: Any) -> None:
            self.session = Session()
            self.limits = Limits()
            self.failed_message = None
            self.unanswered = 0
            self.reconnects = 0
            self.mode, self.client_id = args[3], args[6]

        def open(self) -> dict[str, Any]:
            hello = {"type": "hello", "protocol_version": 1, "inference_mode": self.mode}
            return self.request({**hello, "client_id": self.client_id})

        def request(self, message: dict[str, Any]) -> dict[str, Any]:
            body = encode({"id": 1, **message})
            if message["type"] == "report_samples":
                return {"type": "samples_accepted", "id": 1, "weights_version": 1}
            started = time.process_time()
            raw = decode(body)
            started = timings.add("decode", started)
            request = parse_request(raw)
            started = timings.add("parse", started)
            replies: list[dict[str, Any]] = []
            service.handle(request, self.session, replies.append)
            started = timings.add("handle", started)
            if service._flush_scheduled:
                service.flush()
            started = timings.add("flush (policy, actions, reply)", started)
            out = encode(replies[0])
            timings.add("encode", started)
            reply = decode(out)
            if reply["type"] == "error":
                raise RuntimeError(reply["message"])
            return reply

        def send_nowait(self, message: dict[str, Any]) -> None:
            self.request(message)

        def take_unanswered(self) -> list[Any]:
            return []

        def close(self) -> None:
            pass

        def abort(self) -> None:
            pass

    return Bridge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "phase", choices=("remote-multi", "local-multi", "remote-anchor", "local-anchor")
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--ticks", type=int, default=300, help="ticks per episode")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the run")
    parser.add_argument("--parts", action="store_true", help="print the server's stages")
    args = parser.parse_args()
    timings = Timings()
    policy_client.Connection = bridge(make_service(), timings)  # type: ignore[misc]
    mode, form = args.phase.split("-")
    client = policy_client.PolicyClient(
        "in-process:1", inference_mode=mode, multiagent=form == "multi", update_interval=None
    )
    sim = FakeSim(args.agents)
    loop = _multi_loop if form == "multi" else _anchor_loop
    loop(client, sim, args.ticks, time.monotonic() + 0.5)  # warm-up
    timings.seconds.clear()
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    if profiler is not None:
        profiler.enable()
    cpu, wall = time.process_time(), time.perf_counter()
    ticks = loop(client, sim, args.ticks, time.monotonic() + args.seconds)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if profiler is not None:
        profiler.disable()
    steps = ticks * args.agents
    server = sum(timings.seconds.values())
    print(
        f"{args.phase}: {steps / wall:,.0f} agent-steps/s in one process; CPU per agent-step: "
        f"{cpu / steps * 1e6:.2f} us, of which serving {server / steps * 1e6:.2f} us and "
        f"client + simulator {(cpu - server) / steps * 1e6:.2f} us ({ticks} ticks)"
    )
    if args.parts:
        for stage, seconds in timings.seconds.items():
            print(f"  {stage:<32} {seconds / ticks * 1e6:8.1f} us per tick")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    client.close()


if __name__ == "__main__":
    main()
