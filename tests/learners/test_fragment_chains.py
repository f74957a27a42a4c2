"""PPO with memory: a fragment that continues an earlier one of the batch is replayed on from it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlserve.learners.fragment_chains import continued_fragments, replay_rounds
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.ppo_sequences import build_sequence_batch
from rlserve.learners.recurrent_models import RecurrentActorCritic
from rlserve.protocol.fragment import Fragment

BOX = spaces.Box(-2.0, 2.0, (4,), np.float32)
CPU = torch.device("cpu")


def _model() -> RecurrentActorCritic:
    torch.manual_seed(0)
    return RecurrentActorCritic(BOX, spaces.Discrete(2), (8,), "tanh", cell_size=5)


def _episode(steps: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.uniform(-1, 1, (steps + 1, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, steps).astype(np.int64),
        "rewards": rng.normal(size=steps).astype(np.float32),
    }


def _piece(
    episode: dict[str, np.ndarray], first: int, last: int, episode_id: str = "e", **kw: Any
) -> Fragment:
    """Steps ``first..last-1`` of ``episode``; ``state_in`` is noise unless given."""
    steps = last - first
    fields: dict[str, Any] = {
        "episode_id": episode_id,
        "agent_id": "agent0",
        "policy_id": "default",
        "obs": episode["obs"][first : last + 1],
        "actions": episode["actions"][first:last],
        "rewards": episode["rewards"][first:last],
        "behaviour_logp": np.full(steps, -0.7, dtype=np.float32),
        "policy_chosen": np.ones(steps, dtype=bool),
        "weights_version": np.zeros(steps, dtype=np.int64),
        "terminated": False,
        "truncated": False,
        "state_in": np.random.default_rng(first).normal(0, 0.5, 10).astype(np.float32),
    }
    fields.update(kw)
    return Fragment(**fields)


def test_each_fragment_continues_the_latest_earlier_one_of_its_episode_and_agent() -> None:
    a, b = _episode(30, 0), _episode(30, 1)
    fragments = [
        _piece(a, 0, 10),  # 0
        _piece(b, 0, 10, "f"),  # 1
        _piece(a, 10, 20),  # 2 continues 0
        _piece(b, 10, 20, "f", agent_id="other"),  # 3: another agent
        _piece(b, 10, 20, "f"),  # 4 continues 1
        _piece(a, 20, 30),  # 5 continues 2
    ]
    predecessor = continued_fragments(fragments)
    assert predecessor.tolist() == [-1, -1, 0, -1, 1, 2]
    assert [r.tolist() for r in replay_rounds(predecessor)] == [[0, 1, 3], [2, 4], [5]]


def test_no_chain_across_an_episode_end_a_gap_or_out_of_order() -> None:
    a = _episode(30, 0)
    for terminated in (True, False):
        ended = _piece(a, 0, 10, terminated=terminated, truncated=not terminated)
        assert continued_fragments([ended, _piece(a, 10, 20)]).tolist() == [-1, -1]
    # A fragment missing in between: the later one starts where the earlier did not end.
    assert continued_fragments([_piece(a, 0, 10), _piece(a, 20, 30)]).tolist() == [-1, -1]
    # Only the latest earlier fragment of the episode is a candidate.
    gap = [_piece(a, 0, 10), _piece(a, 20, 30), _piece(a, 10, 20)]
    assert continued_fragments(gap).tolist() == [-1, -1, -1]
    # Out of order: the earlier piece comes later in the batch.
    assert continued_fragments([_piece(a, 10, 20), _piece(a, 0, 10)]).tolist() == [-1, -1]
    assert replay_rounds(np.zeros(0, dtype=np.int64)) == []


def test_the_state_after_each_rows_own_length_is_the_unrolls() -> None:
    model = _model()
    rng = np.random.default_rng(2)
    obs = torch.as_tensor(rng.uniform(-1, 1, (3, 6, 4)).astype(np.float32))
    state = torch.as_tensor(rng.normal(0, 0.5, (3, 10)).astype(np.float32))
    with torch.no_grad():
        ends = model.state_after(obs, state, torch.tensor([6, 1, 4]))
        for row, steps in enumerate((6, 1, 4)):
            _, expected = model.unroll(obs[row : row + 1, :steps], state[row : row + 1])
            torch.testing.assert_close(ends[row], expected[0], rtol=0, atol=1e-6)


def test_a_continued_fragment_replays_as_the_whole_episode_would() -> None:
    """An episode in pieces of 20, 13 and 12 steps (chunks of 20; the first piece ends on a
    chunk's end, the second inside one), each later piece's stored state_in wrong (as from older
    weights), another episode between them: the pieces' values, proximal log-probabilities and
    chunk start states are those of the episode replayed whole from its start."""
    model = _model()
    cfg = PPOSettings(
        use_lstm=True,
        lstm_cell_size=5,
        hidden=(8,),
        max_seq_len=20,
        train_batch_size=40,
        minibatch_size=40,
        device="cpu",
        norm_advantages=False,
    )
    a, other = _episode(45, 0), _episode(7, 9)
    zeros = np.zeros(10, np.float32)
    pieces = [
        _piece(a, 0, 20, state_in=zeros),
        _piece(other, 0, 7, "f", state_in=zeros, terminated=True),
        _piece(a, 20, 33),
        _piece(a, 33, 45),
    ]
    whole = _piece(a, 0, 45, state_in=zeros)
    split = build_sequence_batch(pieces, model, cfg, 0, None, None, CPU).tensors
    one = build_sequence_batch([whole], model, cfg, 0, None, None, CPU).tensors
    assert split is not None and one is not None
    valid = split["valid"]
    # The pieces' chunks: a [20], f [7], a [13], a [12]; the other episode's left out.
    assert valid.sum(1).tolist() == [20, 7, 13, 12]
    mine = torch.tensor([True, False, True, True])
    for name in ("values", "prox_logp"):
        got = split[name][mine][valid[mine]]
        torch.testing.assert_close(got, one[name][one["valid"]], rtol=0, atol=1e-5)
    with torch.no_grad():
        state = torch.as_tensor(zeros)[None]
        _, after_20 = model.unroll(torch.as_tensor(a["obs"][None, :20]), state)
        _, after_33 = model.unroll(torch.as_tensor(a["obs"][None, :33]), state)
    torch.testing.assert_close(split["state_in"][2], after_20[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(split["state_in"][3], after_33[0], rtol=0, atol=1e-6)
