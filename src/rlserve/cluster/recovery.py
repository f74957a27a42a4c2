"""The learner's recovery point, held by the driver so that it outlives the learner's node.

With several front-ends the learner's state (its checkpoints and its merged log) is on its node's
disk. A *recovery point* is what a learner needs to go on elsewhere: each policy's newest
checkpoint (the files' bytes), the merge state at the position ``position`` through which those
checkpoints include merged records (per front-end, the seq of its log merged through there, and
the batch ids seen), and, with several policies, the merged records between the lowest and the
highest of their trained positions (``after`` to ``position``), so every policy goes on from
its own. The learner makes one after each checkpoint (:class:`RecoveryPoints`) and hands it to
the driver in its next exchange; the driver writes it into its run folder (:func:`save_point`)
and says so in the exchange after, and only then do the front-ends clean their logs through it
and the learner its merged log. A learner started anywhere is handed the driver's point and
takes it (:func:`install_point`) unless its own disk holds one at least as new.

With one front-end (``--ray`` alone) the learner trains on the front-end's own log, which the
driver keeps, so its point is the checkpoints alone (:class:`HeldCheckpoints`): the learner
attaches each checkpoint's files to its ``checkpointed`` message, the driver writes the point
into its run folder before it cleans its log, and only through what the point's checkpoints
have trained; a learner started anywhere takes the point's checkpoints
(:func:`install_checkpoints`) unless its own disk has checkpoints at least as new.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlserve.cluster.merged_log import MergedLog, read_records
from rlserve.protocol.codec import decode, encode
from rlserve.run.checkpoints import checkpoints_in, trained_through_of
from rlserve.run.durable import atomic_write_bytes
from rlserve.run.experience_log import LOG_LIMITS

__all__ = [
    "RECOVERY_FILE",
    "HeldCheckpoints",
    "RecoveryPoints",
    "checkpoint_files",
    "checkpoints_cover",
    "covered_locally",
    "install_checkpoints",
    "install_point",
    "load_point",
    "point_key",
    "save_point",
]

logger = logging.getLogger("rlserve.learner")

RECOVERY_FILE = "learner_recovery.bin"
"""The driver's copy of the newest recovery point, in its run folder (msgpack)."""


def point_key(point: dict[str, Any] | None) -> list[int]:
    """What orders recovery points: their position, then their policies' weights versions."""
    if point is None:
        return [0, 0]
    return [int(point["position"]), int(point.get("versions", 0))]


def save_point(path: Path, point: dict[str, Any]) -> None:
    """Write a recovery point (atomically: the older one stays until the new one is whole).

    Raises:
        OSError: The write failed.
    """
    atomic_write_bytes(path, encode(point))


def load_point(path: Path) -> dict[str, Any] | None:
    """The recovery point at ``path`` (None: none, or unreadable, which is said)."""
    try:
        return decode(path.read_bytes(), LOG_LIMITS)
    except FileNotFoundError:
        return None
    except Exception as exc:
        logger.warning("rlserve: the learner's recovery point %s is unreadable (%s)", path, exc)
        return None


def _folders(policies: Sequence[dict[str, Any]]) -> dict[str, Path]:
    return {str(p["policy_id"]): Path(p["checkpoint_dir"]) for p in policies}


def covered_locally(
    point: dict[str, Any], merged: MergedLog, policies: Sequence[dict[str, Any]]
) -> bool:
    """Whether this disk holds state at least as new as ``point`` (its own is then used)."""
    return merged.log.last_seq >= int(point["position"]) and checkpoints_cover(point, policies)


def checkpoints_cover(point: dict[str, Any], policies: Sequence[dict[str, Any]]) -> bool:
    """Whether this disk has, for every policy, a checkpoint trained as far as ``point``'s."""
    for policy_id, folder in _folders(policies).items():
        wanted = point["checkpoints"].get(policy_id)
        if wanted is None:
            continue
        kept = checkpoints_in(folder)
        if not kept or trained_through_of(kept[-1]) < int(wanted["trained_through"]):
            return False
    return True


def install_point(
    point: dict[str, Any], merged_dir: Path, policies: Sequence[dict[str, Any]]
) -> None:
    """Put ``point`` on this disk: its checkpoints in their folders, a merged log started anew.

    What the folders held before is deleted: it is older than the point (or another node's).
    """
    install_checkpoints(point, policies)
    state = {k: point[k] for k in ("position", "merged_through", "seen")}
    MergedLog.install(merged_dir, state, point.get("records", []))


def install_checkpoints(point: dict[str, Any], policies: Sequence[dict[str, Any]]) -> None:
    """Put ``point``'s checkpoints in their policies' folders, instead of what was there."""
    folders = _folders(policies)
    for policy_id, files in point["checkpoints"].items():
        folder = folders.get(str(policy_id))
        if folder is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for old in checkpoints_in(folder):
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
        path = folder / str(files["name"])
        atomic_write_bytes(path, bytes(files["pt"]))
        atomic_write_bytes(path.with_suffix(".json"), bytes(files["json"]))


def checkpoint_files(message: dict[str, Any]) -> dict[str, Any]:
    """The files of the checkpoint a ``checkpointed`` message names, as a point carries them.

    Raises:
        OSError: They cannot be read (pruned meanwhile, a disk error).
    """
    path = Path(message["path"])
    return {
        "name": path.name,
        "trained_through": int(message["trained_through"]),
        "pt": path.read_bytes(),
        "json": path.with_suffix(".json").read_bytes(),
    }


class RecoveryPoints:
    """The learner's side: recovery points made from its checkpoints, and the one held.

    Args:
        policy_ids: Every policy the learner trains (a point needs a checkpoint of each).
        held: The point the driver holds (None: none yet).
    """

    def __init__(self, policy_ids: Sequence[str], held: dict[str, Any] | None) -> None:
        self._policy_ids = list(policy_ids)
        self._newest: dict[str, dict[str, Any]] = {}
        self._log_needed: dict[str, int] = {}
        self.offered: dict[str, Any] | None = None
        """The newest point not yet held by the driver."""
        self._made: dict[tuple[int, ...], dict[str, Any]] = {}
        self.held_key = point_key(held)
        self.held_through: dict[str, int] = dict(held["merged_through"]) if held else {}
        """Per front-end, the seq of its log the held point includes: it is cleaned through it."""
        self.held_after = int(held.get("after", held["position"])) if held else 0

    def checkpointed(self, message: dict[str, Any], merged: MergedLog) -> None:
        """Note a policy's checkpoint; make a point once every policy has one."""
        policy_id = str(message["policy_id"])
        self._newest[policy_id] = message
        self._log_needed[policy_id] = int(message["log_needed_after"])
        if set(self._newest) < set(self._policy_ids):
            return
        newest = [self._newest[pid] for pid in self._policy_ids]
        position = max(int(m["trained_through"]) for m in newest)
        after = min(int(m["trained_through"]) for m in newest)
        try:
            checkpoints = {str(m["policy_id"]): checkpoint_files(m) for m in newest}
            records = read_records(merged.directory, after, position)
        except Exception as exc:  # a checkpoint pruned meanwhile, a disk error: the next one
            logger.warning("rlserve: no recovery point of checkpoint %s (%s)", message["path"], exc)
            return
        state = merged.state_at(position)
        versions = sum(int(m.get("version", 0)) for m in newest)
        point = {**state, "after": after, "versions": versions}
        point.update(checkpoints=checkpoints, records=records)
        if point_key(point) > self.held_key:
            self.offered = point
            self._made[tuple(point_key(point))] = {
                "merged_through": state["merged_through"],
                "after": after,
            }

    def held(self, key: Sequence[int]) -> bool:
        """The driver holds the point of ``key``; whether that is newer than the one it held."""
        made = self._made.get(tuple(key))
        if made is None or list(key) <= self.held_key:
            return False
        self.held_key = list(key)
        self.held_through = dict(made["merged_through"])
        self.held_after = int(made["after"])
        self._made = {k: v for k, v in self._made.items() if list(k) > self.held_key}
        if self.offered is not None and point_key(self.offered) <= self.held_key:
            self.offered = None
        return True

    def log_needed_after(self) -> int:
        """The merged-log position through which it may be cleaned.

        What the held point needs (nothing before ``after``), and what this disk's kept
        checkpoints need (their fallback when the newest is damaged).
        """
        if set(self._log_needed) < set(self._policy_ids):
            return 0
        return min(self.held_after, *self._log_needed.values())


class HeldCheckpoints:
    """The one front-end's side (``--ray`` alone): the recovery point the driver holds.

    A point is each policy's newest checkpoint (the files the learner attached to its
    ``checkpointed`` message), ``position`` the highest log position they trained through and
    ``after`` the lowest: the front-end's own log keeps every record after ``after``, so a
    learner that goes on from the point reads them from there.

    Args:
        policy_ids: Every policy the learner trains (a point needs a checkpoint of each).
        path: The driver's copy of the point (:data:`RECOVERY_FILE` in its run folder).
    """

    def __init__(self, policy_ids: Sequence[str], path: Path) -> None:
        self._policy_ids = list(policy_ids)
        self._path = path
        self._newest: dict[str, dict[str, Any]] = {}
        self.point: dict[str, Any] | None = None
        """The point held (read back by :meth:`load`)."""

    def load(self) -> dict[str, Any] | None:
        """The point held in the run folder (None: none yet), for a learner starting now.

        The checkpoints an earlier learner wrote after that point no longer count: the next
        point is made of this learner's.
        """
        self._newest.clear()
        self.point = load_point(self._path)
        return self.point

    def checkpointed(
        self, policy_id: str, files: dict[str, Any], version: int
    ) -> dict[str, Any] | None:
        """Note a policy's checkpoint; a newer point to hold once every policy has one."""
        self._newest[policy_id] = {**files, "version": int(version)}
        if set(self._newest) < set(self._policy_ids):
            return None
        newest = {pid: self._newest[pid] for pid in self._policy_ids}
        through = [int(f["trained_through"]) for f in newest.values()]
        point = {
            "position": max(through),
            "after": min(through),
            "versions": sum(f["version"] for f in newest.values()),
            "checkpoints": {
                pid: {k: v for k, v in f.items() if k != "version"} for pid, f in newest.items()
            },
        }
        return point if point_key(point) > point_key(self.point) else None

    def hold(self, point: dict[str, Any]) -> None:
        """Write ``point`` into the run folder; it is held from now on.

        Raises:
            OSError: The write failed (the older point stays held).
        """
        save_point(self._path, point)
        self.point = point

    @property
    def log_needed_after(self) -> int:
        """The log position through which the held point lets the log be cleaned."""
        return 0 if self.point is None else int(self.point["after"])
