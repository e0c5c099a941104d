"""Records for the console: what destroyed slots, deleted saved states and rejected dumps left in
`forgotten_dir` (written by linux/forgotten.py): a listing, one archive's record, gates and last
screenshot, the file itself.
Blocking file I/O: the console calls these in a worker thread. Names are checked against the
listing, never joined from the request."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path
from typing import Any

import zstandard

from drumsd.core.retention import CHECKPOINT_DIRS

_NAME = re.compile(r"^(\d{8}T\d{6})-(.+)\.(tar\.zst|json)$")
SMALL_MEMBER = 8 * 1024 * 1024  # record, gates and screenshot; logs are only listed
MAX_LISTED = 500
# kind -> its subdirectory of forgotten_dir
KINDS: dict[str, str] = {"full": "full", "summary": "summary", **CHECKPOINT_DIRS}


def list_records(forgotten_dir: Path) -> list[dict[str, Any]]:
    """Newest first: name, kind (full | summary | state | dump), slot (the checkpoint for a
    state or a dump), stamp, size."""
    out = []
    for kind, sub in KINDS.items():
        for path in (forgotten_dir / sub).glob("*"):
            m = _NAME.match(path.name)
            if m is None:
                continue
            try:
                size = path.stat().st_size
            except OSError:
                continue
            out.append({"name": path.name, "kind": kind, "slot": m[2], "stamp": m[1], "size": size})
    out.sort(key=lambda r: (r["stamp"], r["name"]), reverse=True)
    return out[:MAX_LISTED]


def find_record(forgotten_dir: Path, name: str) -> Path | None:
    m = _NAME.match(name)
    if m is None or "/" in name:
        return None
    subs = ["full"] if m[3] == "tar.zst" else [s for s in KINDS.values() if s != "full"]
    for sub in subs:
        path = forgotten_dir / sub / name
        if path.is_file():
            return path
    return None


def read_record(path: Path) -> dict[str, Any]:
    """The record, gate report and member names of an archive (or a summary's, a deleted
    state's or a rejected dump's JSON)."""
    if path.suffix == ".json":
        kind = next((k for k, sub in KINDS.items() if sub == path.parent.name), "summary")
        return {
            "kind": kind,
            "record": json.loads(path.read_text()),
            "gates": None,
            "members": [],
            "screenshot": False,
        }
    record: dict[str, Any] = {}
    gates: dict[str, Any] | None = None
    members: list[str] = []
    screenshot = False
    for member, data in _members(path):
        members.append(member.name)
        if member.name.endswith("/record.json") and data is not None:
            record = json.loads(data)
        elif member.name.endswith("/gates.json") and data is not None:
            gates = json.loads(data)
        elif member.name.endswith("/last-screenshot.png"):
            screenshot = True
    return {
        "kind": "full",
        "record": record,
        "gates": gates,
        "members": members,
        "screenshot": screenshot,
    }


def read_screenshot(path: Path) -> bytes | None:
    if path.suffix == ".json":
        return None
    for member, data in _members(path):
        if member.name.endswith("/last-screenshot.png"):
            return data
    return None


def _members(path: Path):
    """(member, bytes or None when large) of a .tar.zst, streamed."""
    with path.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as raw:
        with tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                data = None
                if member.size <= SMALL_MEMBER:
                    extracted = tar.extractfile(member)
                    data = extracted.read() if extracted is not None else None
                yield member, data
