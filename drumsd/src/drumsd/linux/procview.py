"""The per-slot /proc view (config `procview_dir`): LXCFS mounted at that directory answers
/proc/meminfo, cpuinfo, stat, uptime and loadavg from the reader's own cgroups and pid namespace,
and each slot has those files bind-mounted over its own /proc.

Stage 1 binds them when it boots a template, so every checkpoint made from it holds the binds;
CRIU cannot dump a FUSE mount, so each dump declares them external and each restore maps them back
to the same LXCFS files. A fork or a saved state therefore keeps the view with no step of its own.
`sysinfo(2)` is a system call, out of a file system's reach: `sysinfo_preload` answers it from
these files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

from drumsd.linux import mounts, procfs
from drumsd.linux import syscalls as sc

FILES = ("meminfo", "cpuinfo", "stat", "uptime", "loadavg")
FSTYPE = "fuse.lxcfs"
LXCFS = "lxcfs"
# --enable-cfs: CPUs from the slot's CPU quota; --enable-loadavg: the slot's own load average.
LXCFS_FLAGS = ("--enable-cfs", "--enable-loadavg", "--enable-pidfd")
START_TIMEOUT_S = 10.0


class ProcViewError(RuntimeError):
    """The view cannot be served: the message says what is missing and what to do."""


def slot_path(name: str) -> str:
    return f"/proc/{name}"


def source(view_dir: Path, name: str) -> Path:
    return view_dir / "proc" / name


def external_key(name: str) -> str:
    return f"drums-procview-{name}"


def dump_externals(held: list[str]) -> dict[str, str]:
    """criu dump's `--external mnt[PATH]:KEY` for the view's binds a slot holds."""
    return {slot_path(n): external_key(n) for n in held}


def restore_externals(view_dir: Path) -> dict[str, str]:
    """criu restore's `--external mnt[KEY]:PATH`: every key, bound back to the LXCFS file (a key
    the checkpoint does not hold is unused)."""
    return {external_key(n): str(source(view_dir, n)) for n in FILES}


def held_in(mountinfo: str) -> list[str]:
    """The view's files bound in a slot, from its init's mountinfo."""
    points = {point for point, fstype in mounts.parse_mountinfo(mountinfo) if fstype == FSTYPE}
    return [n for n in FILES if slot_path(n) in points]


def served(view_dir: Path, mountinfo: str | None = None) -> bool:
    """Whether LXCFS is mounted at `view_dir` (by us or by a host service)."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    want = str(view_dir)
    return any(p == want and t == FSTYPE for p, t in mounts.parse_mountinfo(text))


def unreachable_ancestors(view_dir: Path) -> list[str]:
    """Directories on the way to the view that other users cannot search: a hardened slot's
    root (an unprivileged host uid) binds the files through that path at boot."""
    out = []
    for d in [*reversed(view_dir.parents), view_dir]:
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                out.append(str(d))
        except FileNotFoundError:
            break  # made below, searchable
    return out


def ensure(view_dir: Path) -> bool:
    """Serve the view at `view_dir`: use an LXCFS already mounted there, else start one. Returns
    whether it started one. LXCFS is left running when the daemon exits: the slots it leaves for
    the next daemon to adopt read their /proc through it (`umount DIR` stops it)."""
    blocked = unreachable_ancestors(view_dir)
    if blocked:
        raise ProcViewError(
            f"procview_dir {view_dir}: {', '.join(blocked)} cannot be searched by other users, "
            "and a slot binds its /proc files through that path; chmod o+x them or choose "
            "another directory (e.g. /var/lib/drums-procview)"
        )
    view_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    if served(view_dir):
        return False
    if any(view_dir.iterdir()):
        raise ProcViewError(
            f"procview_dir {view_dir} is not empty and not an LXCFS mount; give an empty "
            "directory (the daemon mounts LXCFS there) or one where LXCFS is mounted"
        )
    # In the foreground, in a session of its own: it outlives the daemon, its output in a log
    # beside the directory (it keeps its stdio, so a daemonizing start would hold our pipes).
    argv = [LXCFS, "-f", *LXCFS_FLAGS, "-p", f"{view_dir}.pid", str(view_dir)]
    log = Path(f"{view_dir}.log")
    try:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
    except FileNotFoundError:
        raise ProcViewError(
            "procview_dir is set but lxcfs is not installed; `apt-get install lxcfs` "
            "(scripts/setup.sh does) or set procview_dir: null"
        ) from None
    deadline = time.monotonic() + START_TIMEOUT_S
    while not served(view_dir):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            raise ProcViewError(f"lxcfs did not mount {view_dir} (see {log}): {tail}")
        time.sleep(0.02)
    return True


def stop(view_dir: Path) -> None:
    """Unmount the view and end its LXCFS (it keeps a copy of its own mount in a mount namespace
    of its own, so an unmount alone does not end it); slots still binding it read ENOTCONN."""
    subprocess.run(["umount", str(view_dir)], capture_output=True, check=False)
    pidfile = Path(f"{view_dir}.pid")
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    # procfs.reap waits on a pidfd, which an exited process makes ready as a zombie too (this
    # process's child when it started LXCFS, then reaped): waiting for /proc/<pid> to go took
    # the whole START_TIMEOUT_S on every stop and left the zombie.
    if not procfs.reap(pid, START_TIMEOUT_S):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        procfs.reap(pid, 1.0)


def with_binds(plan: list[mounts.MountOp], view_dir: Path, root: str) -> list[mounts.MountOp]:
    """Stage 1's plan with the view's files bound over the slot's fresh /proc, right after it is
    mounted (before pivot_root, while the view's host path is still reachable)."""
    at = next(i for i, op in enumerate(plan) if op.kind == "mount" and op.fstype == "proc") + 1
    binds = [
        mounts.MountOp(
            "mount", f"{root}{slot_path(n)}", source=str(source(view_dir, n)), flags=sc.MS_BIND
        )
        for n in FILES
    ]
    return plan[:at] + binds + plan[at:]


def expected_mounts() -> list[str]:
    """The mount table entries the binds add ("<mount point> <fstype>")."""
    return [f"{slot_path(n)} {FSTYPE}" for n in FILES]
