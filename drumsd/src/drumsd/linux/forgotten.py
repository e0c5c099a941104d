"""What a destroyed slot leaves behind in `forgotten_dir` (a `.tar.zst` archive or a summary),
and what a deleted saved state or a rejected dump leaves (a small JSON record).

Layout: forgotten_dir/full/<time>-<slot>.tar.zst, forgotten_dir/summary/<time>-<slot>.json,
forgotten_dir/states/<time>-<checkpoint>.json and forgotten_dir/dumps/<time>-<checkpoint>.json.
Blocking I/O; the supervisor runs these in a worker thread.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from drumsd.core.records import SlotRecord
from drumsd.core.retention import CHECKPOINT_DIRS, Archived, CheckpointGone, Keep, slot_outcome

MAX_LOG_BYTES = 16 * 1024 * 1024


def _compress(data: bytes) -> bytes:
    try:
        import zstandard
    except ImportError:
        # Fall back to the zstd binary when the Python binding is absent.
        if shutil.which("zstd") is None:
            raise RuntimeError(
                "neither the zstandard module nor the zstd binary is available; "
                "pip install zstandard"
            ) from None
        return subprocess.run(
            ["zstd", "-q", "-c", "-"], input=data, capture_output=True, check=True
        ).stdout
    return zstandard.ZstdCompressor(level=6).compress(data)


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o600
    tar.addfile(info, io.BytesIO(data))


def write_forgotten(
    forgotten_dir: Path,
    kind: Keep,
    record: dict[str, Any],
    events: list[str],
    gate_report: dict[str, Any],
    screenshot: bytes | None,
    log_files: list[str],
) -> Path:
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    slot_id = record["id"]
    if kind == "summary":
        out_dir = forgotten_dir / "summary"
        out_dir.mkdir(parents=True, exist_ok=True)
        summary = {
            "id": slot_id,
            "checkpoint": record.get("checkpoint"),
            "image": record.get("image"),
            "task_id": record.get("task_id"),
            "episodes": record.get("episode"),
            "verdicts": record.get("verdicts"),
            "outcome": slot_outcome(SlotRecord.model_validate(record)),
            "pending_gates": [
                g["name"] for g in record.get("gates") or [] if g.get("status") == "pending"
            ],
            "created_at": record.get("created_at"),
            "destroyed_at": record.get("destroyed_at"),
            "labels": record.get("labels"),
        }
        path = out_dir / f"{stamp}-{slot_id}.json"
        path.write_text(json.dumps(summary, indent=1))
        return path
    out_dir = forgotten_dir / "full"
    out_dir.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add(tar, f"{slot_id}/record.json", json.dumps(record, indent=1).encode(), now)
        _add(tar, f"{slot_id}/events.jsonl", ("\n".join(events) + "\n").encode(), now)
        _add(tar, f"{slot_id}/gates.json", json.dumps(gate_report, indent=1).encode(), now)
        if screenshot:
            _add(tar, f"{slot_id}/last-screenshot.png", screenshot, now)
        for log in log_files:
            try:
                with open(log, "rb") as fh:
                    data = fh.read(MAX_LOG_BYTES)
            except OSError:
                continue
            _add(tar, f"{slot_id}/logs/{Path(log).name}", data, now)
    path = out_dir / f"{stamp}-{slot_id}.tar.zst"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(_compress(buf.getvalue()))
    tmp.replace(path)
    return path


def write_checkpoint_record(
    forgotten_dir: Path, gone: CheckpointGone, summary: dict[str, Any]
) -> Path:
    """A deleted state's or a rejected dump's record, written whole or not at all."""
    out_dir = forgotten_dir / CHECKPOINT_DIRS[gone]
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(summary["at"]))
    path = out_dir / f"{stamp}-{summary['id']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(path)
    return path


def scan_forgotten(forgotten_dir: Path) -> list[Archived]:
    """Every archive and record; the small ones (summaries, states, dumps) share summary_max_gib."""
    patterns = [("full", "full/*.tar.zst"), ("summary", "summary/*.json")]
    patterns += [("summary", f"{sub}/*.json") for sub in CHECKPOINT_DIRS.values()]
    out = []
    for kind, pattern in patterns:
        for path in forgotten_dir.glob(pattern):
            try:
                st = path.stat()
            except OSError:
                continue
            out.append(Archived(str(path), kind, st.st_size, st.st_mtime))  # type: ignore[arg-type]
    return out


def delete_archives(paths: list[str]) -> None:
    for p in paths:
        Path(p).unlink(missing_ok=True)
