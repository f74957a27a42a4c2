"""Episodes closed for silence (``Service.expire_idle``): one warning line counts them all."""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest

from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request
from rlserve.server import stats as stats_module
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats
from rlserve.server.throttled_log import ThrottledLog
from service_fakes import NoLoop, RecordingSink

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def test_a_sweep_of_idle_episodes_is_told_once_with_its_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = io.StringIO()
    monkeypatch.setattr(stats_module, "SERVER_LOG", ThrottledLog(stream=lines))
    service = Service(
        {"default": (OBS, gym.spaces.Discrete(2))},
        Limits(),
        None,
        3,
        RecordingSink(),
        ServerStats(),
    )
    service._loop = NoLoop()  # type: ignore[assignment]  # nothing waits for a flush here
    session = Session(authenticated=True)
    for number in range(8):
        request = {"id": number, "type": "start_episode", "episode_id": f"e{number}"}
        service.handle(parse_request(request), session, lambda reply: None)
    assert len(service.expire_idle(-1.0)) == 8  # every episode idle
    (line,) = lines.getvalue().splitlines()
    assert line.startswith("rlserve: 8 episode(s) so far were closed after --idle-timeout")
    assert service.stats.episodes_timed_out == 8
