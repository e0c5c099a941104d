"""What a task's setup depends on, read for its task checkpoint's key, and the host-side files
a setup leaves (its run dir) carried with the checkpoint.

The key itself is pure (`drumsd.core.task_checkpoints`); this module does the file work: the
setup's plan names every host file it copies into the slot (downloads from the cache, assets,
a task's own files, the empty History template), and each is hashed (by content, remembered per
path, size, mtime and inode so a reset does not re-read them). A setup's `execute(stdout=...)`
writes into the episode's run dir on the host, which checkers read: a task checkpoint keeps a
copy and a cached episode starts with it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from drumsd.core.task_checkpoints import SetupFingerprint, check_cache_option, setup_cacheable

from .model import Task, TaskContext, TaskError, placeholder_values
from .setup import PutFile, SetupError, UpdateHistory, plan_steps

RUN_FILES_DIR = "task-run"  # beside a task checkpoint's images/ and upper/


class FileHashes:
    """sha256 of host files, remembered while a file's (size, mtime, inode) stay the same."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[int, int, int], str]] = {}
        self._lock = threading.Lock()  # fingerprints run in worker threads

    def sha256(self, path: Path) -> str:
        st = path.stat()
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        with self._lock:
            known = self._known.get(str(path))
        if known is not None and known[0] == stamp:
            return known[1]
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        value = digest.hexdigest()
        with self._lock:
            self._known[str(path)] = (stamp, value)
        return value


def task_option(task: Task) -> Any:
    """The task's `drums.cache_setup` (None when absent); TaskError when it is not a bool."""
    block = (task.model_extra or {}).get("drums")
    value = block.get("cache_setup") if isinstance(block, dict) else None
    problem = check_cache_option(value)
    if problem is not None:
        raise TaskError(f"task {task.id}: {problem}")
    return value


def setup_context(ctx: TaskContext) -> dict[str, Any]:
    """The host values a setup's commands are filled with (placeholders, browser, python)."""
    return {
        "placeholders": placeholder_values(ctx),
        "user_home": ctx.user_home,
        "chrome_command": list(ctx.chrome_command),
        "chrome_profile_dir": ctx.chrome_profile_dir,
        "devtools_port": ctx.devtools_port,
        "python_command": ctx.python_command,
        "timezone": ctx.timezone,
    }


def setup_fingerprint(
    task: Task, ctx: TaskContext, hashes: FileHashes, *, enabled: bool = True
) -> SetupFingerprint:
    """Everything the setup of `task` depends on (but its source checkpoint). A setup whose plan
    fails (a download missing from the cache) is not cacheable: its load reports the error."""
    task_json = task.model_dump(mode="json", exclude_none=True)
    cacheable, reason = setup_cacheable(
        [step.type for step in task.config], task_option(task), enabled=enabled
    )
    files: dict[str, str] = {}
    if cacheable:
        try:
            for op in plan_steps(task.config, task, ctx):
                source = op.source if isinstance(op, PutFile) else None
                if isinstance(op, UpdateHistory):
                    source = op.template
                if source is not None:
                    files[str(source)] = hashes.sha256(source)
        except (SetupError, OSError) as exc:
            cacheable, reason = False, f"its setup cannot be planned here: {exc}"
            files = {}
    return SetupFingerprint(
        task_id=task.id,
        task_json=task_json,
        files=files,
        context=setup_context(ctx),
        cacheable=cacheable,
        reason=reason,
    )


def save_run_files(run_dir: Path, checkpoint_dir: Path) -> None:
    """Keep what the setup wrote into the run dir with the task checkpoint."""
    dest = checkpoint_dir / RUN_FILES_DIR
    shutil.rmtree(dest, ignore_errors=True)
    if run_dir.is_dir():
        shutil.copytree(run_dir, dest, symlinks=True)
    else:
        dest.mkdir(mode=0o700, parents=True)


def restore_run_files(checkpoint_dir: Path, run_dir: Path) -> None:
    """A cached episode's run dir (already emptied): the files its setup left when captured."""
    source = checkpoint_dir / RUN_FILES_DIR
    if not source.is_dir():
        return
    for entry in os.scandir(source):
        target = run_dir / entry.name
        if entry.is_dir(follow_symlinks=False):
            shutil.copytree(entry.path, target, symlinks=True)
        else:
            shutil.copy2(entry.path, target, follow_symlinks=False)
