"""The journal on disk: one JSON file per record, written atomically, and `events.jsonl`.

Layout of journal_dir:
  slots/<id>.json         the slot record (temp file, fsync, rename, fsync of the directory)
  checkpoints/<id>.json   the checkpoint record
  events.jsonl            one JSON event per state change, fsync'd; compacted on start
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from drumsd.core.journal import Event, JournalState, RecordKind, fold, parse_event_lines

_DIRS: dict[str, str] = {"slot": "slots", "checkpoint": "checkpoints"}


Fsync = Callable[[int], None]


def fsync_dir(path: Path, fsync: Fsync = os.fsync) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, fsync: Fsync = os.fsync) -> None:
    """Readers see the old content or the new one, never a torn file, even after a crash."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent, fsync)


class Journal:
    """Blocking file I/O; the supervisor's RecordStore calls it from a worker thread. `fsync` is
    injectable so tests can make the disk slow."""

    def __init__(self, root: Path, *, fsync: Fsync = os.fsync) -> None:
        self.root = root
        self.fsync = fsync
        self.events_path = root / "events.jsonl"
        self._seq = 0
        for sub in _DIRS.values():
            (root / sub).mkdir(parents=True, exist_ok=True)

    @property
    def last_seq(self) -> int:
        return self._seq

    def record_path(self, kind: RecordKind, record_id: str) -> Path:
        return self.root / _DIRS[kind] / f"{record_id}.json"

    def save(
        self, kind: RecordKind, record: dict[str, Any], event: str, now: float, *, file: bool = True
    ) -> None:
        """Write the record file, then log the change (either alone is enough to recover).
        Hot-path changes (reset, gate results) pass file=False: the event alone is durable
        (one fsync), and the next compaction rewrites the record file."""
        if file:
            write_atomic(
                self.record_path(kind, record["id"]),
                json.dumps(record, separators=(",", ":")).encode(),
                self.fsync,
            )
        self.append(Event(seq=0, ts=now, kind=kind, id=record["id"], event=event, record=record))

    def delete(self, kind: RecordKind, record_id: str, event: str, now: float) -> None:
        self.append(Event(seq=0, ts=now, kind=kind, id=record_id, event=event, record=None))
        path = self.record_path(kind, record_id)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        fsync_dir(path.parent, self.fsync)

    def append(self, event: Event) -> None:
        self._seq += 1
        line = event.model_copy(update={"seq": self._seq}).model_dump_json() + "\n"
        fd = os.open(self.events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
            self.fsync(fd)
        finally:
            os.close(fd)

    def _record_files(self) -> Iterator[tuple[RecordKind, dict[str, Any]]]:
        for kind, sub in _DIRS.items():
            for path in sorted((self.root / sub).glob("*.json")):
                try:
                    yield kind, json.loads(path.read_text())  # type: ignore[misc]
                except (OSError, json.JSONDecodeError):
                    continue  # a torn temp never has this name; a broken file: events win

    def load(self) -> JournalState:
        """At start-up, before any write: remove temp files left by a crash, then fold."""
        for sub in _DIRS.values():
            for tmp in (self.root / sub).glob(".*.tmp-*"):
                tmp.unlink(missing_ok=True)
        return self.read()

    def read(self) -> JournalState:
        """Fold record files and events without touching anything: safe beside a running
        writer (load's temp clean-up would pull a write's temp file from under its rename)."""
        lines: list[str] = []
        if self.events_path.exists():
            lines = self.events_path.read_text(errors="replace").splitlines()
        events, skipped = parse_event_lines(lines)
        state = fold(self._record_files(), events)
        state.skipped_lines += skipped
        self._seq = state.last_seq
        return state

    def compact(self, events: list[Event]) -> None:
        """Replace events.jsonl by a snapshot, and make the record files match it."""
        data = "".join(e.model_dump_json() + "\n" for e in events).encode()
        write_atomic(self.events_path, data, self.fsync)
        self._seq = max([self._seq, *(e.seq for e in events)])
        keep = {(e.kind, e.id) for e in events}
        for kind, sub in _DIRS.items():
            for path in (self.root / sub).glob("*.json"):
                if (kind, path.stem) not in keep:
                    path.unlink(missing_ok=True)
        for e in events:
            if e.record is not None:
                path = self.record_path(e.kind, e.id)
                want = json.dumps(e.record, separators=(",", ":")).encode()
                if not path.exists() or path.read_bytes() != want:
                    write_atomic(path, want, self.fsync)

    def events_size(self) -> int | None:
        """Bytes in events.jsonl (None when it cannot be read): the reaper compacts past a cap."""
        try:
            return self.events_path.stat().st_size
        except OSError:
            return None

    def events_of(self, record_id: str) -> list[str]:
        """The raw event lines of one record (for the forgotten archive)."""
        if not self.events_path.exists():
            return []
        needle = f'"id":"{record_id}"'
        return [
            ln for ln in self.events_path.read_text(errors="replace").splitlines() if needle in ln
        ]


def journal_state_empty() -> JournalState:
    return JournalState()
