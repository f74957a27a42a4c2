"""Back-pressure: hold the replies that let clients step on while the learner is too far behind.

An off-policy learner trains on a schedule (gradient steps per env step). A simulator faster than
that schedule would otherwise run ahead of it: most of its steps would be taken by old weights,
and a step budget would run out before the learner had trained on what it got. The server
therefore measures the learner's lag, in env steps: steps in the experience log that it has not
read yet, plus steps it has read whose scheduled gradient steps it still owes. While the lag is
over ``max_lag_steps``, the replies that let a client take its next step (``get_action``,
``log_action``, ``report_samples``) are held, and they are sent in arrival order as soon as the
lag is back under the bound. A connection's requests are handled one at a time, so a held reply
also holds the requests behind it: the order on the wire is kept.

Nothing is held while no learner is connected (a dead learner must not stop serving), nor
longer than ``max_hold_seconds`` (a stuck learner must not stall the simulators past their
timeouts). Error replies are never held.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rlserve.errors import ConfigError

Respond = Callable[[dict[str, Any]], None]

DEFAULT_MAX_HOLD_SECONDS = 10.0
"""Longest time a reply is held; well under the reference client's 60 s reply timeout."""


RECURRENT_LAG_STEPS = 256
"""The default bound when a trained PPO policy has memory (``use_lstm``) and no off-policy
policy sets a longer one. A recurrent PPO learner replays each fragment from the state its
acting weights left; further behind, every step it trained on came from weights a version old and
StatelessCartPole through 4 remote clients crossed 350 and fell back (226, 288 and 55 at 300,000
steps, docs/benchmarks.md "Remote memory"), while at 256 it held (474, 378 and 357 without
fragment chaining, 484, 412 and 465 with it)."""


def max_lag_steps(configured: int | None, rounds: list[int], recurrent: bool = False) -> int:
    """The lag bound in env steps (0: never hold).

    Args:
        configured: The server option (None: the default).
        rounds: The ``train_every`` of each trained off-policy policy: the env steps its learner
            waits for before a training round (empty: no off-policy policy).
        recurrent: A trained on-policy policy has memory (``use_lstm``).

    Returns:
        ``configured`` when set; else the longest round (the learner stays within one training
        round of its clients, as in a hosted run), else :data:`RECURRENT_LAG_STEPS` with a
        recurrent on-policy policy, else 0 (an on-policy learner drops the oldest backlog
        instead, ``max_sample_queue_steps``).

    Raises:
        ConfigError: ``configured`` is below a round: that learner would wait for steps its
            clients are held from taking.
    """
    longest = max(rounds, default=0)
    if configured is None:
        return longest or (RECURRENT_LAG_STEPS if recurrent else 0)
    if 0 < configured < longest:
        raise ConfigError(
            f"max_learner_lag_steps {configured} is below an off-policy policy's train_every "
            f"({longest}): its learner waits for {longest} steps before it trains, while the "
            f"server would hold the clients at {configured}; set max_learner_lag_steps to at "
            f"least {longest} (or 0 to never hold), or lower train_every"
        )
    return configured


def paced_fragment_length(fragment_length: int, bound: int) -> int:
    """The fragment length a server cuts at: at most half the lag bound while pacing.

    The learner sees a step only once its fragment is cut, so a fragment longer than the bound
    would let each client run that far ahead of it unseen.
    """
    return min(fragment_length, max(1, bound // 2)) if bound > 0 else fragment_length


class LearnerPace:
    """Tracks the learner's lag and holds replies while it is over the bound.

    Args:
        max_lag_steps: The bound in env steps; 0 turns pacing off.
        max_hold_seconds: The longest time one reply is held.
    """

    def __init__(self, max_lag_steps: int, max_hold_seconds: float = DEFAULT_MAX_HOLD_SECONDS):
        self.max_lag_steps = max_lag_steps
        self.max_hold_seconds = max_hold_seconds
        self.unread_steps = 0
        self.owed_steps = 0
        self.connected = False
        self._held: deque[tuple[float, Respond, dict[str, Any]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self.replies_held = 0
        """Replies held so far (counted once each)."""
        self.held_seconds = 0.0
        """Seconds of holding, summed over the held replies."""
        self.releases_timed_out = 0
        """Replies sent because they had been held ``max_hold_seconds`` (the learner was stuck)."""

    @property
    def enabled(self) -> bool:
        """Whether replies may be held at all (a bound is set)."""
        return self.max_lag_steps > 0

    @property
    def lag_steps(self) -> int:
        """The learner's lag: unread logged steps plus steps whose training it still owes."""
        return self.unread_steps + self.owed_steps

    @property
    def behind(self) -> bool:
        """Whether replies are held now."""
        return self.enabled and self.connected and self.lag_steps > self.max_lag_steps

    @property
    def waiting(self) -> int:
        """Replies held now."""
        return len(self._held)

    def update(
        self,
        unread_steps: int | None = None,
        owed_steps: int | None = None,
        connected: bool | None = None,
    ) -> None:
        """Take new figures from the learner side; send the held replies if no longer behind."""
        if unread_steps is not None:
            self.unread_steps = max(unread_steps, 0)
        if owed_steps is not None:
            self.owed_steps = max(owed_steps, 0)
        if connected is not None:
            self.connected = connected
            if not connected:
                self.owed_steps = 0
        if self._held and not self.behind:
            self._release_all()

    def paced(self, respond: Respond) -> PacedReply:
        """Wrap ``respond`` so that its non-error reply waits while the learner is behind."""
        return PacedReply(self, respond)

    def hold(self, respond: Respond, reply: dict[str, Any]) -> None:
        """Keep ``reply`` until the learner catches up (or ``max_hold_seconds`` pass)."""
        now = time.monotonic()
        self._held.append((now, respond, reply))
        self.replies_held += 1
        if self._timer is None:
            self._arm_timer(now)

    def close(self) -> None:
        """Send everything held and hold nothing more (the learner side is stopping)."""
        self.update(connected=False)
        self._release_all()

    def _arm_timer(self, now: float) -> None:
        if not self._held:
            return
        oldest = self._held[0][0]
        delay = max(oldest + self.max_hold_seconds - now, 0.0)
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        while self._held and now - self._held[0][0] >= self.max_hold_seconds:
            self.releases_timed_out += 1
            self._send(*self._held.popleft(), now)
        self._arm_timer(now)

    def _release_all(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = time.monotonic()
        held, self._held = self._held, deque()
        for item in held:
            self._send(*item, now)

    def _send(self, since: float, respond: Respond, reply: dict[str, Any], now: float) -> None:
        self.held_seconds += now - since
        # A connection closed meanwhile drops the reply in its own respond.
        respond(reply)

    def metrics(self) -> dict[str, float]:
        """The pacing metrics (``samples/...``) for the server's metrics."""
        return {
            "samples/learner_lag_steps": float(self.lag_steps),
            "samples/learner_lag_bound": float(self.max_lag_steps),
            "samples/replies_held": float(self.replies_held),
            "samples/replies_waiting": float(self.waiting),
            "samples/held_seconds": self.held_seconds,
            "samples/holds_timed_out": float(self.releases_timed_out),
        }


class PacedReply:
    """A ``respond`` whose non-error reply is held while the learner is behind.

    ``held`` tells the caller that the reply has not gone out yet (the request is deferred).
    """

    def __init__(self, pace: LearnerPace, respond: Respond):
        self._pace = pace
        self._respond = respond
        self.held = False

    def __call__(self, reply: dict[str, Any]) -> None:
        """Send ``reply`` now, or hold it while the learner is behind (never an error)."""
        if reply.get("type") != "error" and self._pace.behind:
            self.held = True
            self._pace.hold(self._respond, reply)
        else:
            self._respond(reply)
