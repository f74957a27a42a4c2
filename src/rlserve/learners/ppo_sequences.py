"""PPO with memory (``use_lstm``): fragments replayed from their stored states, trained as chunks.

A policy with memory acts from a recurrent state that depends on every earlier observation of
the episode; each fragment carries the state its first step was taken from (``state_in``).
:func:`build_sequence_batch` replays every fragment once, without gradients, over ``obs[0..T]``
with the learner's weights at the start of the update: that pass gives the values (and the
bootstrap value at ``obs[T]``), the proximal log-probabilities of decoupled PPO and the state at
the start of every chunk. A fragment starts from ``state_in``, unless it continues an earlier
fragment of the same batch (:mod:`rlserve.learners.fragment_chains`): then from the state that
one's replay ended in, the learner's own, not the older acting weights'. Each fragment is then
cut into chunks of ``max_seq_len`` steps from its first step, the last one padded; a step's
``valid`` flag says whether it is trained on (not padding, fresh, not a logged step left out, within
``max_steps_per_update``). Steps that are not trained on still advance the state, as they did
when acting. The rest (importance weights, GAE with its bootstrapping, logged steps, the step
cap, the statistics) is :mod:`rlserve.learners.ppo_batch`'s, step for step.

An update's minibatches are whole chunks (:func:`chunks_per_minibatch`); the gradient pass
unrolls each chunk from its stored start state and keeps the valid steps only
(:func:`valid_steps`), so every loss and the advantage normalisation count them alone, and a
padded step changes nothing (the LSTM is causal: padding comes after a chunk's valid steps).
"""

from __future__ import annotations

import numpy as np
import torch

from rlserve.learners.fragment_chains import continued_fragments, replay_rounds
from rlserve.learners.normalization import ObservationNormalization
from rlserve.learners.ppo_batch import (
    TrainingBatch,
    fragment_steps,
    newest_steps,
    record_stats,
)
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.recurrent_models import RecurrentActorCritic
from rlserve.protocol.fragment import Fragment


def chunks_per_minibatch(cfg: PPOSettings) -> int:
    """Chunks per minibatch: ``minibatch_size // max_seq_len`` (1 at least)."""
    return max(1, cfg.minibatch_size // cfg.max_seq_len)


def _padded(column: np.ndarray, length: int) -> np.ndarray:
    """``column`` (``[T, ...]``) with zeros (False) after its end, ``[length, ...]``."""
    out = np.zeros((length, *column.shape[1:]), dtype=column.dtype)
    out[: column.shape[0]] = column
    return out


_Outputs = tuple[list[torch.Tensor], list[torch.Tensor], list[np.ndarray], list[np.ndarray]]
"""What the replay's chunks gave, per chunk: observations, LSTM outputs, fragment, position."""


class _Replay:
    """The no-grad pass over every fragment from its start state (see the module doc).

    A fragment that continues an earlier one of the batch (:mod:`rlserve.learners.fragment_chains`)
    starts from the state the replay of that one ended in; any other from its ``state_in``.

    Attributes:
        values: ``[rows, K * L]`` the value at each observation (``obs[T]``'s included).
        prox: ``[rows, K * L]`` the proximal log-probability of each step's action.
        chunk_obs: Per fragment, ``[K_i, L, D]`` its observations as read (``obs[0..T]``), cut
            into chunks of ``L`` and padded with zeros.
        starts: ``[rows, K, 2N]`` the state at the start of each chunk (zeros past the end).
        ends: ``[rows, 2N]`` the state after each fragment's last step (before ``obs[T]``).
    """

    def __init__(
        self,
        fragments: list[Fragment],
        obs_list: list[np.ndarray],
        model: RecurrentActorCritic,
        seq_len: int,
        device: torch.device,
    ):
        rows = len(fragments)
        self.lengths = np.array([len(f) for f in fragments])
        self.segments = -(-(self.lengths + 1) // seq_len)  # chunks covering obs[0..T]
        self.seq_len = seq_len
        self.device = device
        width = obs_list[0].shape[1]
        total = int(self.segments.max()) * seq_len
        self.chunk_obs = [
            _padded(obs, int(k) * seq_len).reshape(int(k), seq_len, width)
            for obs, k in zip(obs_list, self.segments, strict=True)
        ]
        states = [f.state_in for f in fragments]
        if any(s is None for s in states):
            raise ValueError("a fragment of a policy with memory has no state_in")
        stored = torch.as_tensor(np.stack(states), device=device)  # type: ignore[arg-type]
        self.starts = stored.new_zeros((rows, int(self.segments.max()), stored.shape[1]))
        self.ends = stored.clone()
        predecessor = continued_fragments(fragments)
        self._parts: _Outputs = ([], [], [], [])
        with torch.no_grad():
            for group in replay_rounds(predecessor):
                begin = stored[torch.as_tensor(group, device=device)]
                linked = predecessor[group] >= 0
                if linked.any():
                    after = torch.as_tensor(predecessor[group][linked], device=device)
                    begin[torch.as_tensor(linked, device=device)] = self.ends[after]
                self._unroll(group, begin, model)
            obs_parts, h_parts, which, position = self._parts
            obs_all, h_all = torch.cat(obs_parts), torch.cat(h_parts)
            fragment_of, at = np.concatenate(which), np.concatenate(position)
            self.values = np.zeros((rows, total), dtype=np.float32)
            self.values[fragment_of, at] = model.value(obs_all, h_all).cpu().numpy()
            steps = at < self.lengths[fragment_of]
            actions = np.stack([_padded(f.actions, total) for f in fragments])
            selected = torch.as_tensor(steps, device=device)
            prox, _ = model.log_prob_entropy(
                obs_all[selected],
                torch.as_tensor(actions[fragment_of[steps], at[steps]], device=device),
                h_all[selected],
            )
        self.prox = np.zeros((rows, total), dtype=np.float32)
        self.prox[fragment_of[steps], at[steps]] = prox.cpu().numpy()

    def _unroll(self, group: np.ndarray, state: torch.Tensor, model: RecurrentActorCritic) -> None:
        """Replay the fragments ``group`` from ``state`` (``[len(group), 2N]``), chunk by chunk.

        Chunk ``k`` of every fragment that has one goes as one batch: memory stays that of the
        observations themselves, whatever the spread of the fragments' lengths. Notes each
        chunk's start state, each fragment's end state and the outputs the heads read.
        """
        seq_len, device = self.seq_len, self.device
        obs_parts, h_parts, which, position = self._parts
        segments = self.segments[group]
        for k in range(int(segments.max())):
            local = np.nonzero(segments > k)[0]
            active = group[local]
            chunk = torch.as_tensor(np.stack([self.chunk_obs[i][k] for i in active]), device=device)
            index = torch.as_tensor(local, device=device)
            begin = state[index]
            self.starts[torch.as_tensor(active, device=device), k] = begin
            out, state_k = model.unroll(chunk, begin)
            state[index] = state_k
            # The state after a fragment's last step, when that step is in this chunk: the
            # chunk's end state when it is the chunk's last, else a replay stopped there.
            left = self.lengths[active] - k * seq_len
            full = left == seq_len
            self.ends[torch.as_tensor(active[full], device=device)] = state_k[
                torch.as_tensor(full, device=device)
            ]
            part = (left >= 1) & (left < seq_len)
            if part.any():
                rows = torch.as_tensor(part, device=device)
                self.ends[torch.as_tensor(active[part], device=device)] = model.state_after(
                    chunk[rows], begin[rows], torch.as_tensor(left[part])
                )
            obs_parts.append(chunk.reshape(-1, chunk.shape[-1]))
            h_parts.append(out.reshape(-1, out.shape[-1]))
            which.append(np.repeat(active, seq_len))
            position.append(np.tile(k * seq_len + np.arange(seq_len), len(active)))


SEQUENCE_COLUMNS = (
    "obs",
    "actions",
    "prox_logp",
    "weights",
    "advantages",
    "returns",
    "values",
    "policy",
    "logged",
    "valid",
    "state_in",
)
"""The columns of a batch with memory: ``[C, L, ...]`` per chunk step, ``state_in`` ``[C, 2N]``."""


def build_sequence_batch(
    fragments: list[Fragment],
    model: RecurrentActorCritic,
    cfg: PPOSettings,
    version: int,
    obs_normalization: ObservationNormalization | None,
    reward_divisor: float | None,
    device: torch.device,
) -> TrainingBatch:
    """:func:`~rlserve.learners.ppo_batch.build_batch` for a policy with memory: chunks.

    Args and the batch's statistics as ``build_batch``'s; the fragments each have a
    ``state_in`` (:func:`~rlserve.learners.ppo_batch.check_fragment` saw to it). The tensors
    are :data:`SEQUENCE_COLUMNS`: ``C`` chunks of ``L = max_seq_len`` steps each, those with at
    least one ``valid`` step.
    """
    batch = TrainingBatch()
    if not fragments:
        return batch
    seq_len = cfg.max_seq_len
    obs_list = [f.obs for f in fragments]
    if obs_normalization is not None:
        flat = obs_normalization.numpy(np.concatenate(obs_list))
        obs_list = np.split(flat, np.cumsum([f.obs.shape[0] for f in fragments])[:-1])
    replay = _Replay(fragments, obs_list, model, seq_len, device)
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in (*SEQUENCE_COLUMNS, "log_ratio", "versions")
    }
    starts: list[torch.Tensor] = []
    for i, f in enumerate(fragments):
        steps = len(f)
        found = fragment_steps(
            f,
            f.obs[:0],  # the chunks' observations come from the replay
            replay.values[i, : steps + 1],
            replay.prox[i, :steps],
            cfg,
            version,
            reward_divisor,
            batch,
        )
        if found is None:
            continue
        columns, mask = found
        chunks = -(-steps // seq_len)
        length = chunks * seq_len
        for name, column in columns.items():
            if name != "obs":
                column = _padded(column, length)
                parts[name].append(column.reshape(chunks, seq_len, *column.shape[1:]))
        parts["valid"].append(_padded(mask, length).reshape(chunks, seq_len))
        parts["obs"].append(replay.chunk_obs[i][:chunks])
        starts.append(replay.starts[i, :chunks])
    if not parts["obs"]:
        return batch
    arrays = {k: np.concatenate(v) for k, v in parts.items() if k != "state_in"}
    state_in = torch.cat(starts)
    valid = arrays["valid"]
    candidates = np.flatnonzero(valid)
    keep = newest_steps(arrays["versions"].reshape(-1)[candidates], cfg.step_cap)
    if keep is not None:
        batch.steps_dropped_cap = candidates.shape[0] - keep.shape[0]
        valid.reshape(-1)[candidates] = False
        valid.reshape(-1)[candidates[keep]] = True
    trained = valid.any(axis=1)
    if not trained.any():
        return batch
    arrays = {k: v[trained] for k, v in arrays.items()}
    state_in = state_in[torch.as_tensor(trained, device=state_in.device)]
    valid = arrays["valid"]
    steps_only = {k: arrays[k][valid] for k in ("logged", "weights", "policy")}
    record_stats(
        batch, version, arrays.pop("versions")[valid], arrays.pop("log_ratio")[valid], steps_only
    )
    batch.tensors = {k: torch.as_tensor(v, device=device) for k, v in arrays.items()}
    batch.tensors["state_in"] = state_in
    return batch


def valid_steps(
    model: RecurrentActorCritic, minibatch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """A minibatch of chunks as the valid steps the losses read.

    Unrolls the LSTM over each chunk's observations from its ``state_in`` (with gradients),
    then keeps the ``valid`` steps: ``(obs [n, D], features [n, N], columns)``, where
    ``features`` are the LSTM's outputs the heads read and ``columns`` the minibatch's other
    per-step columns at those steps.
    """
    valid = minibatch["valid"]
    h, _ = model.unroll(minibatch["obs"], minibatch["state_in"])
    columns = {
        name: column[valid]
        for name, column in minibatch.items()
        if name not in ("obs", "valid", "state_in")
    }
    return minibatch["obs"][valid], h[valid], columns
