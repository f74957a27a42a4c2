"""Parsing of the exactly-once and identity fields: ``seq``, ``seqs`` and ``client_id``."""

from __future__ import annotations

import pytest

from rlserve.errors import DecodeError, LimitExceededError
from rlserve.protocol.episode_requests import MAX_SEQ, EndEpisode, GetAction, LogAction, LogReturns
from rlserve.protocol.messages import parse_request
from rlserve.protocol.session_requests import Hello


def test_seq_on_every_episode_call() -> None:
    single = parse_request({"type": "get_action", "episode_id": "e", "observation": [0], "seq": 3})
    assert isinstance(single, GetAction) and single.seqs == [3]
    logged = parse_request(
        {"type": "log_action", "episode_id": "e", "observation": [0], "action": 0, "seq": 4}
    )
    assert isinstance(logged, LogAction) and logged.seq == 4
    reward = parse_request({"type": "log_returns", "episode_id": "e", "reward": 1.0, "seq": 5})
    assert isinstance(reward, LogReturns) and reward.seq == 5
    end = parse_request({"type": "end_episode", "episode_id": "e", "observation": [0], "seq": 6})
    assert isinstance(end, EndEpisode) and end.seq == 6


def test_seq_is_optional() -> None:
    single = parse_request({"type": "get_action", "episode_id": "e", "observation": [0]})
    assert isinstance(single, GetAction) and single.seqs is None
    end = parse_request({"type": "end_episode", "episode_id": "e", "observation": [0]})
    assert isinstance(end, EndEpisode) and end.seq is None


@pytest.mark.parametrize("seq", [0, -1, 1.5, "1", True, MAX_SEQ + 1])
def test_bad_seq(seq: object) -> None:
    with pytest.raises(DecodeError, match="'seq' must be an integer from 1"):
        parse_request({"type": "log_returns", "episode_id": "e", "reward": 1.0, "seq": seq})


def test_batched_seqs_are_parallel_to_the_ids() -> None:
    raw = {"type": "get_action", "episode_ids": ["a", "b"], "observations": [[0], [0]]}
    parsed = parse_request({**raw, "seqs": [1, 7]})
    assert isinstance(parsed, GetAction) and parsed.seqs == [1, 7]
    with pytest.raises(DecodeError, match="list of 2 integers"):
        parse_request({**raw, "seqs": [1]})
    with pytest.raises(DecodeError, match="'seqs' must be an integer"):
        parse_request({**raw, "seqs": [1, 0]})


def test_client_id_in_hello() -> None:
    hello = parse_request({"type": "hello", "protocol_version": 1, "client_id": "abc"})
    assert isinstance(hello, Hello) and hello.client_id == "abc"
    assert parse_request({"type": "hello", "protocol_version": 1}).client_id is None  # type: ignore[union-attr]
    with pytest.raises(LimitExceededError, match="client_id"):
        parse_request({"type": "hello", "protocol_version": 1, "client_id": ""})
    with pytest.raises(DecodeError, match="client_id"):
        parse_request({"type": "hello", "protocol_version": 1, "client_id": 5})
