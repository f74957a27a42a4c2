"""The recurrent state of the episodes of a policy with memory: where it lives and when it moves.

A policy with memory (``NumpyPolicy.state_size > 0``, docs/protocol.md section 14.4.3) reads, at
every step, the state its previous step left, per episode and per agent. The rules, for every
source that keeps episodes in an :class:`~rlserve.experience.episodes.EpisodeTable` (the server
in remote mode, the hosted per-episode collector, a local-inference client):

* an episode (an agent of a multi-agent episode) starts from zeros: ``Episode.state`` (the
  agents' ``AgentColumns.state`` rows) is None (zeros) until its first step;
* the state a step read is passed to the forward pass, and the next state replaces it, also for
  a step whose action was logged (``log_action``: the forward pass runs and its action is
  dropped), since the LSTM reads observations only;
* every fragment cut from the episode carries as ``state_in`` the state its first step read;
* the state is dropped with the episode (it lives in the episode's record).

:func:`read_states` / :func:`advance` are the single-agent form, :func:`read_rows` /
:func:`advance_rows` the multi-agent one. Nothing here runs for a policy without memory: the
callers test ``state_size`` first, so their per-step cost is unchanged.
"""

from __future__ import annotations

import numpy as np

from rlserve.experience.agent_columns import AgentColumns
from rlserve.experience.episode_records import Episode
from rlserve.policy import NumpyPolicy


def read_states(episodes: list[Episode], state_size: int) -> np.ndarray:
    """``[B, state_size]``: the state each single-agent episode's next step reads.

    Zeros for an episode that has taken no step with memory yet (or whose state has another
    width, as after weights of another cell size).
    """
    states = np.zeros((len(episodes), state_size), np.float32)
    for i, episode in enumerate(episodes):
        state = episode.state
        if state is not None and state.shape[0] == state_size:
            states[i] = state
    return states


def advance(episodes: list[Episode], read: np.ndarray, next_states: np.ndarray | None) -> None:
    """After each episode recorded a step that read ``read[i]``: it leaves ``next_states[i]``.

    Call after the step is recorded (``EpisodeTable.act`` / ``observe_act_many``): the first
    step of a fragment keeps ``read[i]`` as that fragment's ``state_in`` (steps before it that
    could not advance the state, a server's ``log_action`` before the first weights, left it
    as it was). ``next_states`` is a policy output's ``state`` (never None with memory).
    """
    assert next_states is not None
    for i, episode in enumerate(episodes):
        agent = episode.agent
        if agent.state_in is None:
            agent.state_in = read[i].copy()
        episode.state = next_states[i].copy()


def read_rows(columns: AgentColumns, rows: np.ndarray, state_size: int) -> np.ndarray:
    """``[k, state_size]``: the state each agent row's next step reads (zeros for a new agent).

    Call once a call's observations are recorded and before its actions are: a row whose step
    starts a fragment (none of its steps recorded yet) keeps the state as its ``state_in``.
    """
    if columns.state is None or columns.state.shape[1] != state_size:
        columns.state = np.zeros((columns.count.shape[0], state_size), np.float32)
        columns.state_in = np.zeros_like(columns.state)
    assert columns.state_in is not None
    states = columns.state[rows]
    first = columns.count[rows] == 0
    if first.any():
        columns.state_in[rows[first]] = states[first]
    return states


def advance_rows(columns: AgentColumns, rows: np.ndarray, next_states: np.ndarray | None) -> None:
    """The agent rows' steps (read with :func:`read_rows`) left ``next_states``."""
    assert columns.state is not None and next_states is not None
    columns.state[rows] = next_states


def log_steps(
    episodes: list[Episode], obs: np.ndarray, policy: NumpyPolicy
) -> tuple[np.ndarray, np.ndarray]:
    """The forward pass of logged steps (``log_action``): the states read and the next ones.

    The action is dropped. Run it before the steps are recorded (a failure leaves the episodes
    as they were), then :func:`advance` with both once they are.
    """
    read = read_states(episodes, policy.state_size)
    return read, policy.recurrent_forward(obs, read)[1]


def log_rows(columns: AgentColumns, rows: np.ndarray, obs: np.ndarray, policy: NumpyPolicy) -> None:
    """The forward pass of agents' logged steps: their states advance, the actions are dropped.

    Call between the observations' and the actions' recording, as :func:`read_rows`.
    """
    read = read_rows(columns, rows, policy.state_size)
    advance_rows(columns, rows, policy.recurrent_forward(obs, read)[1])
