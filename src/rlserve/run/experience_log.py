"""The experience log: every acknowledged fragment, on disk before any learner sees it.

The serving process appends a record for each fragment cut from a remote episode and for each
accepted ``report_samples`` batch, to ``runs/<name>/experience/``; the learner process reads the
records from there (the server only tells it how far the log goes). A record is written with one
``write`` call before anyone is told about it, so it survives a kill -9 of either process; a
background thread ``fsync``s the log so that reports are acknowledged only once they would also
survive a power loss, without an fsync on the per-step path. Checkpoints remember how far their
weights have trained (``trained_through``); ``--resume`` and a restarted learner read on from
there, and segments that every kept checkpoint has trained past are deleted.

Layout: segment files ``<first seq, 20 digits>.wal`` of records::

    magic  b"RLX1"        4 bytes
    header length          u32 big-endian
    payload length         u32 big-endian
    crc32(header+payload)  u32 big-endian
    header                 msgpack map: seq, kind ("fragments" | "report"), steps, batch_id
    payload                msgpack map: fragments (the codec's typed arrays)

A record cut short by a crash, or whose checksum fails, ends its segment: on opening, a torn tail
of the newest segment is truncated away (it was never acknowledged, since nobody was told of it).
The format is our own because no maintained Python library offers an append-only, checksummed,
multi-process-readable record log without a server; it is small and fully tested.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from rlserve.errors import ProtocolError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.limits import Limits

logger = logging.getLogger("rlserve.server")

MAGIC = b"RLX1"
_PREFIX = struct.Struct(">4sIII")
SEGMENT_SUFFIX = ".wal"
DEFAULT_SEGMENT_BYTES = 64 << 20
"""A segment is closed and a new one started once it holds this many bytes."""

# The log is written by our own serving process, but it is a file in a folder a user may copy
# around: decode it with limits, never with anything that can run code. Any number of containers
# (each is at least one byte of a record): a record of our own, with every step's info, is never
# refused.
LOG_LIMITS = Limits(
    max_frame_bytes=1 << 30,
    max_array_elements=1 << 28,
    max_container_len=1 << 20,
    max_containers_per_frame=1 << 30,
)


class LogCorruptError(Exception):
    """A record that cannot be read back (cut short or failing its checksum)."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record: its header fields and its still-encoded payload."""

    seq: int
    kind: str
    steps: int
    batch_id: str | None
    payload: bytes

    def fragments(self) -> list[dict[str, Any]]:
        """The payload's fragment maps (decoded now)."""
        return list(decode(self.payload, LOG_LIMITS)["fragments"])


def encode_record(seq: int, kind: str, steps: int, batch_id: str | None, payload: bytes) -> bytes:
    """The bytes of one record."""
    header = encode({"seq": seq, "kind": kind, "steps": steps, "batch_id": batch_id})
    crc = zlib.crc32(payload, zlib.crc32(header))
    return _PREFIX.pack(MAGIC, len(header), len(payload), crc) + header + payload


def encode_payload(fragments: list[dict[str, Any]]) -> bytes:
    """Encode fragment maps (``Fragment.to_wire()``) as a record payload."""
    return encode({"fragments": fragments})


def _read_record(fh: BinaryIO) -> LogRecord | None:
    """Read the record at the file position; None at a clean end of the file.

    Raises:
        LogCorruptError: The record is cut short or fails its checksum.
    """
    prefix = fh.read(_PREFIX.size)
    if not prefix:
        return None
    if len(prefix) < _PREFIX.size:
        raise LogCorruptError("record prefix cut short")
    magic, header_len, payload_len, crc = _PREFIX.unpack(prefix)
    if magic != MAGIC or header_len > 1 << 16:
        raise LogCorruptError("bad record prefix")
    header_bytes = fh.read(header_len)
    payload = fh.read(payload_len)
    if len(header_bytes) < header_len or len(payload) < payload_len:
        raise LogCorruptError("record cut short")
    if zlib.crc32(payload, zlib.crc32(header_bytes)) != crc:
        raise LogCorruptError("record checksum mismatch")
    try:
        header = decode(header_bytes, LOG_LIMITS)
        return LogRecord(
            int(header["seq"]),
            str(header["kind"]),
            int(header["steps"]),
            None if header.get("batch_id") is None else str(header["batch_id"]),
            payload,
        )
    except (ProtocolError, KeyError, TypeError, ValueError) as exc:
        raise LogCorruptError(f"bad record header: {exc}") from exc


def segment_files(directory: Path) -> list[tuple[int, Path]]:
    """The log's segments as ``(first seq, path)``, oldest first."""
    found = []
    for path in directory.glob(f"*{SEGMENT_SUFFIX}"):
        stem = path.name[: -len(SEGMENT_SUFFIX)]
        if stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


class ExperienceLog:
    """The writer's side, in the serving process.

    Args:
        directory: The log's folder (created if missing).
        segment_bytes: Size at which a new segment is started.
    """

    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES):
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.last_seq = 0
        """Seq of the newest record written (0: none yet)."""
        self.synced_seq = 0
        """Seq through which the log is known to be on the disk."""
        self._fd: int | None = None
        self._size = 0
        self._retired: list[int] = []
        self._sync_lock = threading.Lock()

    def open(self) -> list[LogRecord]:
        """Read back what is on disk, cut a torn tail off, and get ready to append.

        Returns:
            Every intact record, oldest first (payloads included, but not decoded).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        records: list[LogRecord] = []
        segments = segment_files(self.directory)
        for index, (_, path) in enumerate(segments):
            newest = index == len(segments) - 1
            good_end = 0
            with open(path, "rb") as fh:
                while True:
                    try:
                        record = _read_record(fh)
                    except LogCorruptError as exc:
                        logger.warning(
                            "rlserve: experience log %s ends in a damaged record at byte %d "
                            "(%s); it was never acknowledged and is cut off",
                            path.name,
                            good_end,
                            exc,
                        )
                        break
                    if record is None:
                        break
                    records.append(record)
                    good_end = fh.tell()
            if newest and path.stat().st_size != good_end:
                os.truncate(path, good_end)
        if records:
            self.last_seq = records[-1].seq
        self.synced_seq = self.last_seq
        if segments:
            path = segments[-1][1]
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            self._size = path.stat().st_size
        return records

    def append(self, kind: str, steps: int, payload: bytes, batch_id: str | None = None) -> int:
        """Write one record and return its seq.

        Raises:
            OSError: The write failed (disk full, read-only folder...). Nothing of the record
                remains in the log and its seq is not used.
        """
        if self._fd is None or self._size >= self.segment_bytes:
            self._rotate()
        assert self._fd is not None
        seq = self.last_seq + 1
        data = encode_record(seq, kind, steps, batch_id, payload)
        start = self._size
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            # Leave no torn record behind: the next record starts where this one did.
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                self._fd = None  # the next append starts a fresh segment
            raise
        self._size = start + len(data)
        self.last_seq = seq
        return seq

    def _rotate(self) -> None:
        path = self.directory / f"{self.last_seq + 1:020d}{SEGMENT_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if self._fd is not None:
            self._retired.append(self._fd)  # the sync thread flushes and closes it
        self._fd = fd
        self._size = 0

    def sync(self) -> int:
        """Flush written records to the disk (call from a worker thread); return the synced seq.

        Raises:
            OSError: The flush failed.
        """
        with self._sync_lock:
            target = self.last_seq
            retired, self._retired = self._retired, []
            for fd in retired:
                os.fsync(fd)
                os.close(fd)
            if self._fd is not None:
                os.fsync(self._fd)
            self.synced_seq = max(self.synced_seq, target)
            return self.synced_seq

    def delete_through(self, seq: int) -> int:
        """Delete segments whose records all have seq <= ``seq``; return how many."""
        segments = segment_files(self.directory)
        deleted = 0
        for (_, path), (next_first, _) in itertools.pairwise(segments):
            if next_first - 1 <= seq:
                path.unlink(missing_ok=True)
                deleted += 1
        return deleted

    def close(self) -> None:
        """Flush and close the log."""
        try:
            self.sync()
        finally:
            for fd in [*self._retired, *([] if self._fd is None else [self._fd])]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._retired, self._fd = [], None


class LogReader:
    """The reader's side, in the learner process: records in seq order from a position on."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._fh: BinaryIO | None = None
        self._segment_first = 0
        self._position = -1

    def records(self, after: int, through: int) -> Iterator[LogRecord]:
        """Yield the records with ``after < seq <= through``, in order.

        Raises:
            LogCorruptError: A record the server said was written cannot be read.
        """
        if through <= after:
            return
        if self._fh is None or self._position != after:
            self._seek(after)
        while self._position < through:
            assert self._fh is not None
            record = _read_record(self._fh)
            if record is None:
                if not self._next_segment():
                    raise LogCorruptError(
                        f"the experience log ends at seq {self._position}, before {through}"
                    )
                continue
            self._position = record.seq
            if record.seq > after:
                yield record

    def _seek(self, after: int) -> None:
        self.close()
        segments = segment_files(self.directory)
        start = [(first, path) for first, path in segments if first <= after + 1]
        chosen = start[-1] if start else (segments[0] if segments else None)
        if chosen is None:
            raise LogCorruptError(f"the experience log in {self.directory} has no segments")
        self._segment_first, path = chosen
        self._fh = open(path, "rb")  # noqa: SIM115 - kept open across calls
        self._position = chosen[0] - 1
        # Skip what was read before: records() yields only seq > after.
        while self._position < after:
            mark = self._fh.tell()
            record = _read_record(self._fh)
            if record is None:
                if not self._next_segment():
                    return
                continue
            if record.seq > after:
                self._fh.seek(mark)
                break
            self._position = record.seq

    def _next_segment(self) -> bool:
        later = [s for s in segment_files(self.directory) if s[0] > self._segment_first]
        if not later:
            return False
        assert self._fh is not None
        self._fh.close()
        self._segment_first, path = later[0]
        self._fh = open(path, "rb")  # noqa: SIM115 - kept open across calls
        return True

    def close(self) -> None:
        """Close the open segment."""
        if self._fh is not None:
            self._fh.close()
        self._fh = None
        self._position = -1
