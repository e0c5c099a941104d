"""A dump's files on the host, synchronous (the Linux runtime calls these through
trio.to_thread): the checkpoint dir, CRIU's post-dump script, the failure's log, meta.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from drumsd.linux import criu


def holds_checkpoint(dest: Path) -> bool:
    return (dest / "images").exists()


def prepare_dump(dest: Path, instance_upper: Path) -> Path:
    """The images dir and the post-dump script that copies the instance's upper layer into
    `dest/upper`; returns the script."""
    (dest / "images").mkdir(parents=True)
    script = dest / "post-dump.sh"
    script.write_text(criu.action_script(instance_upper, dest / "upper"))
    script.chmod(0o700)
    return script


def dump_written(dest: Path) -> bool:
    return (dest / "upper").is_dir()


def discard_failed_dump(dest: Path) -> list[str]:
    """The errors of dump.log; the half-written checkpoint dir is removed."""
    log = dest / "images" / "dump.log"
    errors = criu.log_errors(log.read_text(errors="replace") if log.exists() else "")
    shutil.rmtree(dest, ignore_errors=True)
    return errors


def dumped_tasks(dest: Path) -> list[criu.DumpedTask]:
    """The process tree a dump holds (its pstree.img)."""
    return criu.parse_pstree((dest / "images" / "pstree.img").read_bytes())


def finish_dump(script: Path) -> None:
    script.unlink()


def write_meta(dest: Path, meta: dict[str, Any]) -> None:
    (dest / "meta.json").write_text(json.dumps(meta, indent=1))


def update_meta(dest: Path, **fields: Any) -> None:
    meta = json.loads((dest / "meta.json").read_text())
    meta.update(fields)
    write_meta(dest, meta)
