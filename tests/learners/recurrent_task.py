"""A tiny memory task, and fragments taken by acting on it with a recurrent torch model.

"Repeat the cue": an episode shows one of two cues at its first step, then blanks, then asks
(a query flag) for the cue back: reward 1 for the right action at the query step, 0 for the
wrong one and at every other step. Without memory the query step's observation says nothing
of the cue, so the best policy without memory earns 0.5 per episode.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from rlserve.learners.recurrent_models import RecurrentActorCritic
from rlserve.protocol.fragment import Fragment

OBS_SPACE = spaces.Box(0.0, 1.0, (3,), np.float32)
"""``[cue 0, cue 1, query]``."""
ACTIONS = spaces.Discrete(2)
EPISODE_STEPS = 4


def observation(cue: int, step: int) -> np.ndarray:
    """The task's observation at ``step`` of an episode whose cue is ``cue``."""
    obs = np.zeros(3, dtype=np.float32)
    if step == 0:
        obs[cue] = 1.0
    if step == EPISODE_STEPS - 1:
        obs[2] = 1.0
    return obs


def act(
    model: RecurrentActorCritic,
    episodes: int,
    rng: np.random.Generator,
    version: int = 0,
    cut: int | None = None,
) -> tuple[list[Fragment], float]:
    """Play ``episodes`` episodes at once with ``model``, sampling its actions.

    Each episode is cut into two fragments after step ``cut`` (random when None), the second
    starting from the state the model had reached there. Returns the fragments and the mean
    reward at the query step.
    """
    cues = rng.integers(0, 2, episodes)
    obs = np.stack([[observation(c, t) for t in range(EPISODE_STEPS + 1)] for c in cues])
    generator = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
    state = model.initial_state(episodes)
    states, actions, logps = [], [], []
    with torch.no_grad():
        for t in range(EPISODE_STEPS):
            states.append(state.numpy().copy())
            step_obs = torch.as_tensor(obs[:, t])
            h, state = model.step(step_obs, state)
            probs = torch.softmax(model.params(step_obs, h), dim=-1)
            action = torch.multinomial(probs, 1, generator=generator)[:, 0]
            actions.append(action.numpy())
            logps.append(torch.log(probs.gather(1, action[:, None]))[:, 0].numpy())
    chosen = np.stack(actions, 1)
    rewards = np.zeros((episodes, EPISODE_STEPS), dtype=np.float32)
    rewards[:, -1] = (chosen[:, -1] == cues).astype(np.float32)
    fragments = []
    for e in range(episodes):
        split = int(rng.integers(1, EPISODE_STEPS)) if cut is None else cut
        for first, last in ((0, split), (split, EPISODE_STEPS)):
            steps = last - first
            fragments.append(
                Fragment(
                    episode_id=f"e{e}",
                    agent_id="agent0",
                    policy_id="default",
                    obs=obs[e, first : last + 1],
                    actions=chosen[e, first:last].astype(np.int64),
                    rewards=rewards[e, first:last],
                    behaviour_logp=np.stack(logps, 1)[e, first:last].astype(np.float32),
                    policy_chosen=np.ones(steps, dtype=bool),
                    weights_version=np.full(steps, version, dtype=np.int64),
                    terminated=last == EPISODE_STEPS,
                    truncated=False,
                    state_in=states[first][e],
                )
            )
    return fragments, float(rewards[:, -1].mean())
