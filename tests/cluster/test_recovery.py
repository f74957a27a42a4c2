"""The learner's recovery point: made from its checkpoints, held by the driver, installed anew."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlserve.cluster.merged_log import MergedLog, read_records
from rlserve.cluster.recovery import (
    HeldCheckpoints,
    RecoveryPoints,
    checkpoint_files,
    checkpoints_cover,
    covered_locally,
    install_checkpoints,
    install_point,
    load_point,
    point_key,
    save_point,
)
from rlserve.run.checkpoints import checkpoint_path, checkpoints_in, write_side_file


def _record(seq: int, batch_id: str | None = None) -> tuple[object, ...]:
    return (seq, "report" if batch_id else "fragments", 10, batch_id, b"payload-%d" % seq)


def _checkpoint(folder: Path, policy_id: str, updates: int, through: int) -> dict[str, Any]:
    """A checkpoint's files (their bytes are the learner's business) and its message."""
    folder.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(folder, updates)
    path.write_bytes(b"weights of %s after %d updates" % (policy_id.encode(), updates))
    write_side_file(path, through)
    return {
        "type": "checkpointed",
        "policy_id": policy_id,
        "path": str(path),
        "version": updates,
        "trained_through": through,
        "log_needed_after": through,
    }


def _policies(root: Path, *ids: str) -> list[dict[str, Any]]:
    return [{"policy_id": pid, "checkpoint_dir": str(root / pid)} for pid in ids]


def test_a_point_goes_on_where_its_checkpoints_are(tmp_path: Path) -> None:
    merged = MergedLog(tmp_path / "learner" / "experience")
    for seq in range(1, 4):
        merged.merge("A", [_record(seq, f"a{seq}")])
        merged.merge("B", [_record(seq)])
    policies = _policies(tmp_path / "learner", "p", "q")
    points = RecoveryPoints(["p", "q"], None)
    points.checkpointed(_checkpoint(tmp_path / "learner" / "p", "p", 4, 5), merged)
    assert points.offered is None  # q has no checkpoint yet
    points.checkpointed(_checkpoint(tmp_path / "learner" / "q", "q", 2, 3), merged)
    point = points.offered
    assert point is not None
    # q trained through 3 and p through 5: the records between go with the point.
    assert (point["after"], point["position"]) == (3, 5)
    assert [r[0] for r in point["records"]] == [4, 5]
    assert point["merged_through"] == {"A": 3, "B": 2}
    assert point["seen"] == ["a1", "a2", "a3"]
    assert points.held_through == {} and points.log_needed_after() == 0
    # The driver writes it and says so: the front-ends clean through what it includes.
    save_point(tmp_path / "driver.bin", point)
    held = load_point(tmp_path / "driver.bin")
    assert held is not None and point_key(held) == point_key(point)
    assert points.held(point_key(held)) and not points.held(point_key(held))
    assert points.held_through == {"A": 3, "B": 2} and points.offered is None
    assert points.log_needed_after() == 3
    merged.close()

    # The learner's node is lost with its disk: another node has nothing.
    other = tmp_path / "other"
    other_policies = _policies(other, "p", "q")
    empty = MergedLog(other / "experience")
    assert not covered_locally(held, empty, other_policies)
    empty.close()
    install_point(held, other / "experience", other_policies)
    again = MergedLog(other / "experience")
    assert covered_locally(held, again, other_policies)
    assert again.merged_through == {"A": 3, "B": 2} and again.log.last_seq == 5
    assert [r[1] for r in read_records(other / "experience", 3, 5)] == [
        "fragments B 2",
        "report A 3",
    ]
    for pid in ("p", "q"):
        [installed] = checkpoints_in(other / pid)
        [written] = checkpoints_in(tmp_path / "learner" / pid)
        assert installed.name == written.name
        assert installed.read_bytes() == written.read_bytes()
        assert (
            installed.with_suffix(".json").read_bytes() == written.with_suffix(".json").read_bytes()
        )
    # B ships what the point does not include; a copy of a3 re-sent through C is skipped.
    assert again.merge("B", [_record(2), _record(3)]) == 1
    assert again.merge("C", [_record(1, "a3")]) == 0
    again.close()
    # The same disk, still whole, keeps its own state.
    same = MergedLog(tmp_path / "learner" / "experience")
    assert covered_locally(held, same, policies)
    same.close()


def test_an_unreadable_point_is_none(tmp_path: Path) -> None:
    assert load_point(tmp_path / "none.bin") is None
    (tmp_path / "bad.bin").write_bytes(b"\xc1 not msgpack")
    assert load_point(tmp_path / "bad.bin") is None


def test_one_front_ends_point_is_every_policys_newest_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    held = HeldCheckpoints(["p", "q"], tmp_path / "run" / "learner_recovery.bin")
    assert held.load() is None and held.log_needed_after == 0
    learner = tmp_path / "learner"
    p4 = _checkpoint(learner / "p", "p", 4, 50)
    assert held.checkpointed("p", checkpoint_files(p4), 4) is None  # q has none yet
    q2 = _checkpoint(learner / "q", "q", 2, 30)
    point = held.checkpointed("q", checkpoint_files(q2), 2)
    assert point is not None and (point["after"], point["position"]) == (30, 50)
    assert held.log_needed_after == 0  # made, not held yet: the log keeps everything
    held.hold(point)
    assert held.log_needed_after == 30
    # The same checkpoints again make no newer point.
    assert held.checkpointed("q", checkpoint_files(q2), 2) is None
    # A new learner's start: a point is made of its own checkpoints only (p's is not yet).
    assert held.load() is not None
    q3 = _checkpoint(learner / "q", "q", 3, 60)
    assert held.checkpointed("q", checkpoint_files(q3), 3) is None
    # Read back by the next learner's start, and put on a disk that lost its own.
    reloaded = HeldCheckpoints(["p", "q"], tmp_path / "run" / "learner_recovery.bin").load()
    assert reloaded is not None and point_key(reloaded) == point_key(point)
    other = _policies(tmp_path / "other", "p", "q")
    assert checkpoints_cover(reloaded, _policies(learner, "p", "q"))
    assert not checkpoints_cover(reloaded, other)
    install_checkpoints(reloaded, other)
    assert checkpoints_cover(reloaded, other)
    for pid, written in (("p", Path(p4["path"])), ("q", Path(q2["path"]))):
        [installed] = checkpoints_in(tmp_path / "other" / pid)
        assert installed.name == written.name
        assert installed.read_bytes() == written.read_bytes()
