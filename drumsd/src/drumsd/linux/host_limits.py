"""Reading and raising the host's kernel limits slots share (inotify, open files), and counting
what a slot's processes hold of them. What is needed is core.host_limits' arithmetic."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from drumsd.core import host_limits
from drumsd.core.host_limits import LimitNeed

PROC_SYS = Path("/proc/sys")


def _sysctl_path(name: str, proc_sys: Path = PROC_SYS) -> Path:
    return proc_sys / name.replace(".", "/")


def read_sysctl(name: str, proc_sys: Path = PROC_SYS) -> int | None:
    try:
        return int(_sysctl_path(name, proc_sys).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def current(name: str) -> int | None:
    """The host's value of one limit core.host_limits names (the soft RLIMIT_NOFILE here)."""
    if name == host_limits.NOFILE:
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return read_sysctl(name)


def host_needs(slots: int) -> list[LimitNeed]:
    return host_limits.needs(
        slots,
        inotify_instances=read_sysctl(host_limits.INOTIFY_INSTANCES) or 0,
        inotify_watches=read_sysctl(host_limits.INOTIFY_WATCHES) or 0,
        nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    )


@dataclass(frozen=True)
class Raised:
    name: str
    before: int
    after: int | None  # None: could not be raised
    error: str = ""


def raise_short(needs: Iterable[LimitNeed], proc_sys: Path = PROC_SYS) -> list[Raised]:
    """Raise each limit that is below its need (never lower one). The open-file limit is this
    process's: the launcher and every criu it starts inherit it, so it is raised before them."""
    out: list[Raised] = []
    for need in needs:
        if not need.short:
            continue
        try:
            if need.name == host_limits.NOFILE:
                _raise_nofile(need.needed)
            else:
                _sysctl_path(need.name, proc_sys).write_text(f"{need.needed}\n")
        except (OSError, ValueError) as exc:
            out.append(Raised(need.name, need.current, None, f"{type(exc).__name__}: {exc}"))
            continue
        after = current(need.name) if proc_sys == PROC_SYS else read_sysctl(need.name, proc_sys)
        out.append(Raised(need.name, need.current, after))
    return out


def _raise_nofile(n: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if n > hard:
        # Root may raise the hard limit up to fs.nr_open.
        hard = min(n, read_sysctl("fs.nr_open") or n)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


@dataclass(frozen=True)
class SlotUse:
    """What a slot's processes hold of the shared limits."""

    inotify_instances: int
    inotify_watches: int
    fds: int


def slot_use(pids: Iterable[int], proc: Path = Path("/proc")) -> SlotUse:
    """Count inotify instances (fds on anon_inode:inotify, one per open description), their
    watches (fdinfo's `inotify wd:` lines) and all fds of `pids`."""
    instances: set[tuple[int, str]] = set()
    watches = fds = 0
    for pid in pids:
        fd_dir = proc / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in names:
            fds += 1
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target != "anon_inode:inotify":
                continue
            try:
                info = (proc / str(pid) / "fdinfo" / fd).read_text()
            except OSError:
                continue
            # Shared descriptions (an fd inherited across fork) are one instance: key on the
            # description's watch list, which two instances hardly ever share exactly.
            wds = tuple(ln for ln in info.splitlines() if ln.startswith("inotify wd:"))
            key = (len(wds), "\n".join(wds)) if wds else (pid, fd)
            if key not in instances:
                instances.add(key)
                watches += len(wds)
    return SlotUse(len(instances), watches, fds)
