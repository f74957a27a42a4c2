"""Experience reported by local-inference clients: validation and exactly-once bookkeeping.

A ``report_samples`` batch is checked as a whole before any of it is used: every fragment's
report form must read (:func:`~rlserve.protocol.fragment.read_report`: its arrays agree on
their length), observations must fit the policy (flattened, finite, within a Box's bounds),
actions must fit the action space, rewards must be finite, and every weights version must be
one the server has published (a forged, future version is refused). A batch is
identified by its ``batch_id``; the :class:`BatchLedger` remembers the ids handed to the learner
(and saves them in checkpoints), so a batch re-sent after a lost reply or a server restart is
answered as a duplicate and never trained on twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.errors import SpaceError
from rlserve.experience.episode_records import SINGLE_AGENT, EpisodeSummary
from rlserve.policy.space_distribution import action_distribution
from rlserve.protocol.fields import finite_number
from rlserve.protocol.fragment import Fragment, read_report
from rlserve.protocol.limits import Limits
from rlserve.protocol.replies import SamplesAccepted
from rlserve.protocol.session_requests import ReportSamples
from rlserve.protocol.spaces import flat_dim
from rlserve.protocol.values import MAX_ABS_LOGP, MAX_ABS_REWARD, check_float32, indices_within
from rlserve.server.replies import Respond

MAX_REMEMBERED_BATCHES = 100_000
"""Batch ids remembered for de-duplication (oldest forgotten first)."""


class FragmentChecker:
    """Validates reported fragment maps against one policy's spaces.

    What the spaces imply (flattened size, whether the Box has finite bounds, the action kind)
    is worked out once here: every reported fragment goes through :meth:`check`.
    """

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        policy_id: str,
        limits: Limits,
    ):
        self.observation_space = observation_space
        self.action_space = action_space
        self.policy_id = policy_id
        self.limits = limits
        self._obs_dim = flat_dim(observation_space)
        self._obs_bounds: tuple[np.ndarray, np.ndarray] | None = None
        if isinstance(observation_space, gym.spaces.Box):
            low = observation_space.low.reshape(-1)
            high = observation_space.high.reshape(-1)
            if np.isfinite(low).any() or np.isfinite(high).any():
                self._obs_bounds = (low, high)
        self._distribution = action_distribution(action_space)
        self._choices: int | None = None
        if self._distribution.scalar:
            self._choices = self._distribution.param_dim
        self._action_width = self._distribution.action_width

    def check(
        self, raw: dict[str, Any], published_version: int, where: str, state_size: int = 0
    ) -> Fragment:
        """Validate one reported fragment map and build the :class:`Fragment`.

        ``state_size``: the policy's recurrent state width (0: no memory); a fragment of a
        policy with memory must carry a ``state_in`` of that length, any other none.

        Raises:
            SpaceError: A field is missing, mistyped, of the wrong shape, or out of range.
            LimitExceededError: An id over the length limit.
        """
        wire = read_report(raw, self.limits, where)
        steps = wire.steps
        rewards = check_float32(wire.rewards, f"{where}.rewards", MAX_ABS_REWARD)
        obs = wire.obs
        if obs.shape != (steps + 1, self._obs_dim):
            raise SpaceError(
                f"{where}: 'obs' must be the flattened observations, shape "
                f"({steps + 1}, {self._obs_dim}) for {steps} steps of "
                f"{self.observation_space}; got {obs.shape}"
            )
        obs = check_float32(obs, f"{where}.obs")
        if self._obs_bounds is not None:
            low, high = self._obs_bounds
            if (obs < low).any() or (obs > high).any():
                raise SpaceError(
                    f"{where}: 'obs' has values outside {self.observation_space}'s bounds"
                )
        actions = self._check_actions(wire.actions, steps, where)
        chosen, logp = wire.policy_chosen, wire.behaviour_logp
        all_chosen = bool(chosen.all())
        # Only the policy's own choices carry a log-probability; a logged action's is ignored.
        check_float32(
            logp if all_chosen else logp[chosen],
            f"{where}.behaviour_logp (where policy_chosen)",
            MAX_ABS_LOGP,
        )
        if logp.dtype != np.float32:
            with np.errstate(over="ignore", invalid="ignore"):
                logp = logp.astype(np.float32)
        if not all_chosen:
            # A logged action's behaviour probability is unknown whatever number came with it.
            logp = logp.copy()
            logp[~chosen] = np.nan
        versions = wire.weights_version
        if not indices_within(versions, published_version):
            raise SpaceError(
                f"{where}: weights versions {versions.min()}..{versions.max()} are not versions "
                f"this server published (0..{published_version}); report the version the client "
                "acted with"
            )
        if wire.state_in is not None or state_size:
            _check_state_in(wire.state_in, state_size, self.policy_id, where)
        return Fragment(
            episode_id=wire.episode_id,
            agent_id=SINGLE_AGENT,
            policy_id=self.policy_id,
            obs=obs,
            actions=actions,
            rewards=rewards,
            behaviour_logp=logp,
            policy_chosen=chosen,
            weights_version=versions.astype(np.int64, copy=False),
            terminated=wire.terminated,
            truncated=wire.truncated,
            infos=wire.infos,
            state_in=wire.state_in,
        )

    def _check_actions(self, actions: np.ndarray, steps: int, where: str) -> np.ndarray:
        if self._choices is not None:
            if actions.shape != (steps,) or actions.dtype.kind not in "iu":
                raise SpaceError(f"{where}: 'actions' must be ({steps},) integer choice indices")
            if not indices_within(actions, self._choices - 1):
                raise SpaceError(
                    f"{where}: 'actions' are choice indices 0..{self._choices - 1} (the value "
                    f"minus the space's start); got {actions.min()}..{actions.max()}"
                )
            return actions.astype(np.int64, copy=False)
        if actions.shape != (steps, self._action_width):
            raise SpaceError(
                f"{where}: 'actions' must have shape ({steps}, {self._action_width}) (the flat "
                f"action layout of {self.action_space}, docs/protocol.md §6.3)"
            )
        if self._distribution.kind != "gaussian":
            problem = self._distribution.check_actions(actions, steps)
            if problem:
                raise SpaceError(f"{where}: {problem} (the flat layout of {self.action_space})")
        return check_float32(actions, f"{where}.actions")


def _check_state_in(state_in: Any, state_size: int, policy_id: str, where: str) -> None:
    """Refuse a ``state_in`` that does not fit the policy's memory (or one that has none).

    Raises:
        SpaceError: Naming the length found, the length expected and the fix.
    """
    if state_size and state_in is None:
        raise SpaceError(
            f"{where}: policy '{policy_id}' has memory (a recurrent state of {state_size} "
            "values) but the fragment has no 'state_in'; send the state its first step read "
            "(zeros at an episode's start; rlserve's PolicyClient does it)"
        )
    if state_in is not None and state_in.shape[0] != state_size:
        if not state_size:
            raise SpaceError(
                f"{where}: 'state_in' has {state_in.shape[0]} values but policy '{policy_id}' "
                "has no memory; send its fragments without 'state_in'"
            )
        raise SpaceError(
            f"{where}: 'state_in' has {state_in.shape[0]} values; policy '{policy_id}' has a "
            f"recurrent state of {state_size} (2 x its LSTM's cell_size): send the state the "
            "policy read before the fragment's first step, with the weights the server "
            "publishes now"
        )


def check_summaries(
    raw: list[dict[str, Any]],
    limits: Limits,
    where: str,
    policy_id: str = "default",
    policies: Collection[str] = (),
) -> list[EpisodeSummary]:
    """Validate the ended-episode summaries of a report.

    A multi-agent episode's summary may carry ``policy_returns``: a map from each served policy
    that acted in it (``policies``) to its return. Any other summary is the report's policy's.
    """
    summaries = []
    for i, item in enumerate(raw):
        episode_id, length = item.get("episode_id"), item.get("length")
        ret = finite_number(item.get("return"))
        if (
            not isinstance(episode_id, str)
            or not 0 < len(episode_id) <= limits.max_id_length
            or ret is None
            or isinstance(length, bool)
            or not isinstance(length, int)
            or length < 0
        ):
            raise SpaceError(
                f"{where}.episodes[{i}]: needs 'episode_id' (string of 1 to "
                f"{limits.max_id_length} characters), 'return' (finite number) and 'length' "
                "(non-negative integer)"
            )
        reason = item.get("reason")
        if reason is None:  # absent or nil: the default
            reason = "terminated"
        if reason not in ("terminated", "truncated", "idle_timeout"):
            raise SpaceError(f"{where}.episodes[{i}]: unknown reason '{reason}'")
        policy_returns = _policy_returns(
            item.get("policy_returns"), policies, f"{where}.episodes[{i}]"
        )
        trained = item.get("training_enabled")
        if trained is not None and not isinstance(trained, bool):
            raise SpaceError(
                f"{where}.episodes[{i}]: 'training_enabled' must be a boolean or null, got "
                f"{trained!r}"
            )
        summaries.append(
            EpisodeSummary(
                episode_id, ret, length, trained is not False, reason, policy_returns, policy_id
            )
        )
    return summaries


def _policy_returns(raw: Any, policies: Collection[str], where: str) -> dict[str, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > len(policies):
        raise SpaceError(f"{where}: 'policy_returns' must map served policy ids to finite numbers")
    out = {}
    for policy_id, value in raw.items():
        number = finite_number(value)
        if policy_id not in policies or number is None:
            raise SpaceError(
                f"{where}: 'policy_returns' must map served policy ids ({sorted(policies)}) to "
                f"finite numbers, got {policy_id!r}: {value!r}"
            )
        out[policy_id] = number
    return out


@dataclass
class BatchLedger:
    """Which reported batches were handed to the learner, and who waits on pending ones."""

    handed: OrderedDict[str, int] = field(default_factory=OrderedDict)
    pending: dict[str, list[tuple[int, Respond, bool]]] = field(default_factory=dict)
    """Per batch still in the queue: each request's id and callback, and whether it repeats
    the first."""

    def begin(self, report: ReportSamples, respond: Respond) -> str:
        """Register a report.

        Returns:
            ``new``; ``answered`` for a known duplicate (answered now); or ``waiting`` for a
            duplicate of a batch still in the queue (answered with it).
        """
        steps = self.handed.get(report.batch_id)
        if steps is not None:
            respond(SamplesAccepted(report.id, report.batch_id, steps, duplicate=True).to_wire())
            return "answered"
        waiting = self.pending.get(report.batch_id)
        if waiting is not None:
            waiting.append((report.id, respond, True))
            return "waiting"
        self.pending[report.batch_id] = [(report.id, respond, False)]
        return "new"

    def remember(self, batch_id: str, steps: int) -> None:
        """Record a batch as accepted (rebuilding the ledger from the experience log)."""
        self.handed[batch_id] = steps
        while len(self.handed) > MAX_REMEMBERED_BATCHES:
            self.handed.popitem(last=False)

    def abandon(self, batch_id: str) -> None:
        """Forget a pending batch that was refused."""
        self.pending.pop(batch_id, None)

    def finish(self, report: ReportSamples, steps: int, dropped: int, version: int) -> None:
        """The batch is durable and read by a learner: answer everyone waiting on it."""
        self.remember(report.batch_id, steps)
        for request_id, respond, duplicate in self.pending.pop(report.batch_id, []):
            accepted = SamplesAccepted(
                request_id, report.batch_id, steps, duplicate, dropped, version
            )
            respond(accepted.to_wire())

    def state(self) -> list[list[Any]]:
        """Accepted batch ids and their step counts, for the run folder."""
        return [[batch_id, steps] for batch_id, steps in self.handed.items()]

    def restore(self, state: list[list[Any]]) -> None:
        """Continue from :meth:`state`."""
        for batch_id, steps in state:
            self.handed[str(batch_id)] = int(steps)
