"""A dump's files on the host, synchronous (the Linux runtime calls these through
trio.to_thread): the checkpoint dir, CRIU's post-dump script, the failure's log, meta.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from drumsd.linux import criu, save_delta, upper_links


def holds_checkpoint(dest: Path) -> bool:
    return (dest / "images").exists()


def prepare_dump(dest: Path, instance_upper: Path, links: tuple[Path, Path] | None = None) -> Path:
    """The images dir and the post-dump script that copies the instance's upper layer into
    `dest/upper`; returns the script. With `links` (the instance's record of its restore, the
    parent checkpoint's upper) the files still as restored are hard-linked to the parent's
    (`upper_links`) when this host's cp allows it."""
    (dest / "images").mkdir(parents=True)
    copier = None
    if links is not None:
        record, parent_upper = links
        copier = upper_links.post_dump_argv(
            instance_upper, dest / "upper", record, parent_upper, dest / upper_links.STATS_NAME
        )
    script = dest / "post-dump.sh"
    script.write_text(criu.action_script(instance_upper, dest / "upper", copier))
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


def image_names(dest: Path) -> list[str]:
    """The file names in a dump's images dir."""
    return sorted(p.name for p in (dest / "images").iterdir())


def holds_stopped_task(images: Path) -> bool:
    """Whether a dump holds a task that was stopped (SIGSTOP, a shell's ^Z) when dumped: a
    restore that leaves the tree stopped could not tell it from the rest when it resumes
    them. True when a core image cannot be read (the careful answer)."""
    try:
        tasks = criu.parse_pstree((images / "pstree.img").read_bytes())
        return any(
            criu.task_state((images / f"core-{t.pid}.img").read_bytes()) == criu.TASK_STOPPED
            for t in tasks
        )
    except (OSError, ValueError):
        return True


def finish_dump(script: Path) -> None:
    script.unlink()


def write_meta(dest: Path, meta: dict[str, Any]) -> None:
    (dest / "meta.json").write_text(json.dumps(meta, indent=1))


def update_meta(dest: Path, **fields: Any) -> None:
    meta = json.loads((dest / "meta.json").read_text())
    meta.update(fields)
    write_meta(dest, meta)


# inventory.img starts with CRIU's two 4-byte magics (the image set's, then its own); page
# images are raw and may be empty, so other images are only read, not measured.
_IMAGE_MAGIC_LEN = 8


def dump_problems(dest: Path, meta: dict[str, Any]) -> list[str]:
    """What keeps `dest` from being restored as a CRIU checkpoint of this layout, checked before
    it is adopted: images/ with pstree.img, inventory.img and each listed thread's
    core-<tid>.img, every image readable, the process and thread counts meta.json states, and
    upper/. [] when it looks restorable."""
    images = dest / "images"
    if not images.is_dir():
        return [f"{images} is missing: a checkpoint holds CRIU's images there"]
    problems: list[str] = []
    try:
        names = image_names(dest)
    except OSError as exc:
        return [f"{images} cannot be listed ({exc.strerror})"]
    for name in names:
        if not name.endswith(".img"):
            continue
        try:
            with (images / name).open("rb") as f:
                head = f.read(_IMAGE_MAGIC_LEN)
        except OSError as exc:
            problems.append(f"images/{name} is not readable ({exc.strerror})")
            continue
        if name == "inventory.img" and len(head) < _IMAGE_MAGIC_LEN:
            problems.append(f"images/inventory.img is {len(head)} bytes: not a CRIU image")
    for required in ("pstree.img", "inventory.img"):
        if required not in names:
            problems.append(f"images/{required} is missing")
    tasks: list[criu.DumpedTask] = []
    if "pstree.img" in names:
        try:
            tasks = dumped_tasks(dest)
        except (OSError, ValueError) as exc:
            problems.append(f"images/pstree.img cannot be read as CRIU's process tree ({exc})")
    if tasks:
        coreless = criu.threads_without_core(tasks, names)
        if coreless:
            problems.append(
                f"images/ lacks the core-<tid>.img of threads {coreless[:8]} that pstree.img lists"
            )
        threads = sum(len(t.threads) for t in tasks)
        for key, found in (("processes", len(tasks)), ("threads", threads)):
            stated = meta.get(key)
            if isinstance(stated, int) and stated != found:
                problems.append(f"meta.json says {key} {stated}, pstree.img holds {found}")
    if not (dest / "upper").is_dir():
        problems.append(f"{dest / 'upper'} is missing: a checkpoint holds its upper layer there")
    return problems + save_delta.delta_problems(dest)
