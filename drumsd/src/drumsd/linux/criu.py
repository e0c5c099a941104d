"""CRIU command lines and the dump action script (pure), plus reading CRIU's logs for errors.

Flags are the ones proven on this kind of host (shared/notes/criu-desktop.md): the slot's netns is
private (no network lock), file locks and ghost files are dumped, the upper layer is copied by a
post-dump action script while the tree is still frozen, and restores leave cgroups to us.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

GHOST_LIMIT = "64M"


def dump_argv(
    criu: Path,
    pid: int,
    images: Path,
    script: Path,
    *,
    leave_running: bool,
    externals: Mapping[str, str] | None = None,
    log: str = "dump.log",
) -> list[str]:
    argv = [
        str(criu),
        "dump",
        "-t",
        str(pid),
        "-D",
        str(images),
        "-o",
        log,
        "-v4",
        "--network-lock",
        "skip",
        "--file-locks",
        "--ghost-limit",
        GHOST_LIMIT,
        "--action-script",
        str(script),
    ]
    if leave_running:
        argv.append("--leave-running")
    for path, key in (externals or {}).items():
        argv += ["--external", f"mnt[{path}]:{key}"]
    return argv


def restore_argv(
    criu: Path,
    images: Path,
    work: Path,
    root: Path,
    pidfile: Path,
    *,
    externals: Mapping[str, str] | None = None,
    leave_stopped: bool = False,
    log: str = "restore.log",
) -> list[str]:
    argv = [
        str(criu),
        "restore",
        "-D",
        str(images),
        "-W",
        str(work),
        "-o",
        log,
        "--root",
        str(root),
        "--restore-detached",
        "--restore-sibling",
        "--pidfile",
        str(pidfile),
        "--file-locks",
        "--manage-cgroups=ignore",
    ]
    if leave_stopped:
        argv.append("--leave-stopped")
    for key, path in (externals or {}).items():
        argv += ["--external", f"mnt[{key}]:{path}"]
    return argv


def action_script(upper: Path, dest_upper: Path) -> str:
    """On post-dump the tasks are still frozen: the upper copy matches the memory image. Copying
    after `--leave-running` resumed the tree would race the desktop's writes."""
    src, dst = shlex.quote(str(upper)), shlex.quote(str(dest_upper))
    return (
        "#!/bin/sh\n"
        '[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] || exit 0\n'
        f"mkdir -p {dst} && exec cp -a {src}/. {dst}/\n"
    )


def log_errors(log_text: str, limit: int = 6) -> list[str]:
    """The lines of a CRIU log that explain a failure (CRIU marks them `Error`)."""
    lines = [ln.strip() for ln in log_text.splitlines() if "Error" in ln or "error" in ln]
    harmless = ("iptables-restore", "Address already assigned", "RLIMIT_NOFILE")
    return [ln for ln in lines if not any(h in ln for h in harmless)][-limit:]


def tail(path: Path, lines: int = 20) -> Sequence[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
