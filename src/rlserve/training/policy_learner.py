"""One policy's learner inside the learner process, with its own place in the experience log.

Each policy has its own model, optimiser, counters, weights version and checkpoints.

The learner process (:mod:`rlserve.training.learner_worker`) reads the log once and hands each
fragment to the policy it names. Each policy remembers how far through the log its weights have
trained (``settled``: every fragment of this policy up to there is in its weights, trained or
dropped), and writes it into each of its checkpoints. A restarted learner reads the log from the
lowest of these positions and each policy skips the records it has already trained on, so every
logged step is trained once per policy in the lineage of its served weights.

A frozen policy never trains: it publishes its initial weights (its own checkpoint, else its
``init_checkpoint``, else fresh ones) once and counts the steps of its fragments as skipped.
Torch is imported only when a policy starts (the serving process imports this module's names).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlserve.protocol.fragment import Fragment
from rlserve.run.checkpoints import (
    checkpoint_path,
    checkpoints_in,
    log_needed_after,
    prune,
    write_side_file,
)

if TYPE_CHECKING:
    from rlserve.learners.base import Learner

logger = logging.getLogger("rlserve.learner")


def write_checkpoint(
    learner: Learner,
    folder: Path,
    extra: dict[str, Any],
    keep: int,
    trained_through: int | None = None,
) -> tuple[Path, list[Path]]:
    """Save ``learner`` as ``folder``'s checkpoint of its update count; keep the newest ``keep``.

    Args:
        learner: The learner to save.
        folder: Its checkpoint folder (it exists).
        extra: Stored with the checkpoint (the trainer's own record of it).
        keep: Checkpoints kept in ``folder``.
        trained_through: The log position it trained through, for its side file (None: none
            written: a trainer without a log of its own).

    Returns:
        The checkpoint's path, and the checkpoints kept (oldest first).
    """
    path = checkpoint_path(folder, int(learner.counters().get("updates", 0)))
    learner.save(path, extra)
    if trained_through is not None:
        write_side_file(path, trained_through)
    return path, prune(folder, keep)


def restore_newest(
    make_learner: Callable[[], Learner], folder: Path
) -> tuple[Learner, dict[str, Any], Path | None]:
    """Load the newest checkpoint in ``folder`` that loads; a damaged one falls back.

    Returns:
        The learner, the checkpoint's ``extra``, and the checkpoint's path (None: fresh start).
    """
    for path in reversed(checkpoints_in(folder)):
        learner = make_learner()
        try:
            extra = learner.load(path)
        except Exception as exc:
            logger.warning(
                "checkpoint %s is damaged or unreadable (%r); falling back to the previous one",
                path,
                exc,
            )
            continue
        return learner, extra, path
    return make_learner(), {}, None


class PolicyLearner:
    """One policy's learner, its log position and its checkpoints.

    Args:
        setup: The policy's plain-value set-up: ``policy_id``, ``algo`` (its algorithm's name;
            absent: PPO), ``settings`` (that algorithm's whole settings table; ``ppo`` in the
            set-up of an older server), ``observation_space``, ``action_space`` (descriptions),
            ``frozen``, ``init_checkpoint`` (a path or None), ``checkpoint_dir`` (absent: the
            trainer checkpoints it by itself, :meth:`save` is not used).
        learner: Its learner, restored or fresh.
        extra: The ``extra`` of the checkpoint it was restored from ({}: none).
        keep_checkpoints: How many of its checkpoints to keep.
    """

    def __init__(
        self, setup: dict[str, Any], learner: Learner, extra: dict[str, Any], keep_checkpoints: int
    ):
        self.policy_id = str(setup["policy_id"])
        self.frozen = bool(setup.get("frozen", False))
        folder = setup.get("checkpoint_dir")
        self.folder = None if folder is None else Path(folder)
        self.keep = keep_checkpoints
        self.learner = learner
        self.restored: Path | None = None
        self.initialised_from: str | None = None
        # Everything of this policy up to `settled` is in its weights; what came after it is
        # read again by the next learner that starts from this state.
        self.settled = int(extra.get("trained_through", 0))
        self.consumed = self.settled_consumed = int(extra.get("steps_consumed", 0))
        # The process's count of log steps read at `settled` (a single-policy checkpoint of an
        # older rlserve has only its own count, which is the same thing there).
        self.settled_log_consumed = int(extra.get("log_steps_consumed", self.settled_consumed))
        self.skipped_frozen = int(extra.get("steps_skipped_frozen", 0))
        self.published = -1
        self._reported_consumed = self.consumed
        self.checkpointed_updates: int | None = None
        self.checkpointed_through = self.settled
        self._taken: list[Fragment] = []

    @classmethod
    def in_process(cls, policy_id: str, learner: Learner, frozen: bool = False) -> PolicyLearner:
        """A policy whose trainer checkpoints it by itself (the in-process Algorithm's).

        ``frozen``: never trained (``multi_agent(policies_to_train=...)`` leaves it out).
        """
        return cls({"policy_id": policy_id, "frozen": frozen}, learner, {}, 0)

    @classmethod
    def start(cls, setup: dict[str, Any], published: int, keep_checkpoints: int) -> PolicyLearner:
        """Build the policy's learner; number its next weights after ``published``.

        From its newest intact checkpoint, else its ``init_checkpoint``, else fresh.

        Raises:
            ValueError: The ``init_checkpoint`` cannot be loaded into this policy's model.
        """
        # Imported here: the serving process, which only spawns the learner, never imports torch.
        from rlserve.config.fields import build
        from rlserve.learners.registry import algorithm
        from rlserve.protocol.spaces import from_description

        entry = algorithm(setup.get("algo"))
        config = build(entry.settings, setup.get("settings", setup.get("ppo")), None)
        obs_space = from_description(setup["observation_space"])
        act_space = from_description(setup["action_space"])
        folder = Path(setup["checkpoint_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        learner, extra, restored = restore_newest(
            lambda: entry.make_learner(obs_space, act_space, config), folder
        )
        policy = cls(setup, learner, extra, keep_checkpoints)
        policy.restored = restored
        init = setup.get("init_checkpoint")
        if restored is None and init:
            try:
                learner.initialise_from(Path(init))
            except Exception as exc:
                raise ValueError(
                    f"policy '{policy.policy_id}': cannot start from its init_checkpoint {init} "
                    f"({exc}); fix init_checkpoint in the [policies.{policy.policy_id}] table"
                ) from exc
            policy.initialised_from = str(init)
        if restored is not None:
            policy.checkpointed_updates = policy.updates
        # Weights versions never go back: a learner restored from an older checkpoint numbers
        # its next weights after the ones the server already serves.
        learner.continue_versions_from(published)
        policy.published = published
        return policy

    @property
    def updates(self) -> int:
        """Updates applied so far."""
        return int(self.learner.counters().get("updates", 0))

    def ready_info(self) -> dict[str, Any]:
        """What the ``ready`` message says of this policy."""
        return {
            "version": self.learner.version,
            "trained_through": self.settled,
            "restored": None if self.restored is None else str(self.restored),
            "initialised_from": self.initialised_from,
            "updates": self.updates,
            "frozen": self.frozen,
        }

    # -- experience ------------------------------------------------------------------------

    def take(self, seq: int | None, fragment: Fragment) -> None:
        """Take a fragment of log record ``seq``, unless this policy has trained past it.

        ``seq`` None: the fragment was never logged; it is always taken.
        """
        if seq is not None and seq <= self.settled:
            return  # in the weights already (read again after a restart)
        self.consumed += len(fragment)
        if self.frozen:
            self.skipped_frozen += len(fragment)
        else:
            self._taken.append(fragment)

    def ingest_taken(self) -> None:
        """Hand the fragments taken since the last call to the learner."""
        if self._taken:
            self.learner.ingest(self._taken)
            self._taken = []

    def settle(self, position: int, log_consumed: int) -> None:
        """Move the trained position up to ``position`` when nothing read waits in the buffer."""
        if self.learner.buffered_steps == 0 and position >= self.settled:
            self.settled, self.settled_consumed = position, self.consumed
            self.settled_log_consumed = log_consumed

    def read_report(self) -> dict[str, Any] | None:
        """A ``metrics`` message with its read counts when they grew since the last one.

        Sent after each read: a policy that updates rarely (or, frozen, never) still shows how
        much of the log was its own.
        """
        if self.consumed == self._reported_consumed:
            return None
        self._reported_consumed = self.consumed
        return {
            "type": "metrics",
            "policy_id": self.policy_id,
            "metrics": {
                "learner/steps_consumed": float(self.consumed),
                "learner/steps_skipped_frozen": float(self.skipped_frozen),
            },
        }

    def ready(self) -> bool:
        """Whether the policy trains and has a batch buffered."""
        return not self.frozen and self.learner.ready()

    # -- messages --------------------------------------------------------------------------

    def counter_metrics(self) -> dict[str, float]:
        """Its counters as metrics (sent when the learner starts, restored ones after a resume)."""
        counters = self.learner.counters()
        return {
            **{f"learner/{k}": float(v) for k, v in counters.items() if k != "version"},
            "learner/weights_version": float(self.learner.version),
        }

    def publication(self, metrics: dict[str, float]) -> dict[str, Any]:
        """The ``weights`` message with the current actor, or ``metrics`` without one.

        Only metrics when the version is the one already published (an update that applied no
        step, a frozen policy).
        """
        metrics = {
            **metrics,
            "learner/steps_consumed": float(self.consumed),
            "learner/steps_skipped_frozen": float(self.skipped_frozen),
        }
        self._reported_consumed = self.consumed
        if self.learner.version == self.published:
            return {"type": "metrics", "policy_id": self.policy_id, "metrics": metrics}
        self.published = self.learner.version
        return {
            "type": "weights",
            "policy_id": self.policy_id,
            "package": self.learner.weights().to_wire(),
            "metrics": metrics,
        }

    # -- checkpoints -----------------------------------------------------------------------

    def idle_behind(self) -> bool:
        """No update since its newest checkpoint, yet it has settled further in the log.

        Saving it again then costs one write and lets the log's clean-up move on.
        """
        idle = self.checkpointed_updates is None or self.checkpointed_updates == self.updates
        return idle and self.settled > self.checkpointed_through

    def save(self, reason: str) -> dict[str, Any]:
        """Write a checkpoint atomically, forget the oldest; return the ``checkpointed`` message."""
        if self.folder is None:
            raise RuntimeError(f"policy '{self.policy_id}' has no checkpoint folder of its own")
        extra = {
            "policy_id": self.policy_id,
            "trained_through": self.settled,
            "steps_consumed": self.settled_consumed,
            "log_steps_consumed": self.settled_log_consumed,
            "steps_skipped_frozen": self.skipped_frozen,
            "reason": reason,
        }
        path, kept = write_checkpoint(self.learner, self.folder, extra, self.keep, self.settled)
        self.checkpointed_updates = self.updates
        self.checkpointed_through = self.settled
        return {
            "type": "checkpointed",
            "policy_id": self.policy_id,
            "path": str(path),
            "reason": reason,
            "version": int(self.learner.version),
            "trained_through": self.settled,
            "log_needed_after": log_needed_after(kept),
            "untrained_steps": self.learner.buffered_steps,
        }
