"""``GET /v1/health`` before the learner has published its first weights (section 4.1)."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import httpx
import numpy as np

from rlserve.protocol.limits import Limits
from rlserve.server.http import build_http_app
from rlserve.server.service import Service
from rlserve.server.stats import ServerStats
from service_fakes import RecordingSink


def test_health_says_weights_version_minus_one_before_the_first_weights() -> None:
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    service = Service(
        {"default": (space, gym.spaces.Discrete(2))},
        Limits(),
        None,
        8,
        RecordingSink(),
        ServerStats(),
    )

    async def get_health() -> httpx.Response:
        transport = httpx.ASGITransport(app=build_http_app(service, None))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            return await http.get("/v1/health")

    reply = asyncio.run(get_health())
    assert reply.status_code == 200
    assert reply.json()["status"] == "ok"
    assert reply.json()["weights_version"] == -1
