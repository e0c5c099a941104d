"""A slot's process tree on the host, synchronous: pidfds, kills and bounded reaps, the restore's
pidfile and logs, facts read from /proc, the cold boot's spawn inputs, KSM counters.

Called by the Linux runtime: blocking work (kills, reaps, log reads) through trio.to_thread; the
few /proc reads and fd syscalls that take microseconds (a pidfd open or close, an exists check
polled while a desktop starts) inline, as `procfs` is."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from drumsd.core.host_limits import LimitHit, limit_hit
from drumsd.guest import protocol
from drumsd.linux import cgroups, criu, mounts, procfs, slot_fs

REAP_TIMEOUT_S = 10.0  # a SIGKILLed tree's init exits within this (bounded pidfd wait)
DEVNULL = subprocess.DEVNULL


def pidfd_open(pid: int) -> int:
    return os.pidfd_open(pid)


def close_fd(fd: int) -> None:
    os.close(fd)


def dup_fd(fd: int) -> int:
    """A copy of `fd` (-1 for none) that its holder closes, whoever closes the original."""
    return os.dup(fd) if fd >= 0 else -1


def reap_nohang(pid: int) -> int | None:
    """Reap `pid` if it is our exited child (restore-sibling makes a slot init one); never
    blocks (WNOHANG). Its wait status, or None when it was not ours to reap."""
    with contextlib.suppress(ChildProcessError, OSError):
        reaped, status = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return status
    return None


def exit_text(status: int | None) -> str:
    """How a process ended, from its wait status: what a quarantine reason says of an init."""
    if status is None:
        return "exit status unknown: not this daemon's child to reap"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}" + (" (core dumped)" if os.WCOREDUMP(status) else "")
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def kill_tree(driver: Any, dirs: Mapping[str, str], pid: int, pidfd: int) -> None:
    """Blocking: kill the tree (its cgroups, its init by pidfd), reap the init (bounded), kill
    again and remove the cgroups. `pidfd` must stay the caller's until this returns: the kill
    ends the init, and a number closed by whoever watches it is soon another process's pidfd."""
    if dirs:
        with contextlib.suppress(cgroups.CgroupError, OSError):
            driver.kill(dirs)
    if pid:
        with contextlib.suppress(ProcessLookupError, OSError):
            if pidfd >= 0:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        # Bounded: pidfd readiness, then a WNOHANG reap (never an unbounded waitpid).
        procfs.reap(pid, REAP_TIMEOUT_S, pidfd)
    if dirs:
        driver.kill(dirs)
        driver.remove(dirs)


def kill_leftover(driver: Any, dirs: Mapping[str, str], init: object) -> None:
    """Blocking: kill what a previous daemon left of an instance (its cgroups; its init by
    identity from owner.json, whose cgroups may live elsewhere), reap, remove the cgroups."""
    pids = driver.pids(dirs) if Path(dirs["pids"]).exists() else []
    if isinstance(init, list) and len(init) == 2 and procfs.is_same_process(*init):
        # Its cgroups may live elsewhere (a daemon run in another cgroup): kill the init,
        # which takes the whole pid namespace with it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(init[0], signal.SIGKILL)
        pids.append(init[0])
    with contextlib.suppress(cgroups.CgroupError, OSError):
        driver.kill(dirs)
    # A slot init restored by this process (restore-sibling) is our child: reap it.
    for pid in pids:
        procfs.reap(pid, REAP_TIMEOUT_S)
    with contextlib.suppress(cgroups.CgroupError, OSError):
        driver.remove(dirs)


def kill_group(pgid: int) -> None:
    """SIGKILL a process group (a command started in its own session), if any of it is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_pending(pid: int) -> bool:
    """A SIGKILL waits on a frozen task (it lands on thaw): such a spare is already dead."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & (
            1 << (signal.SIGKILL - 1)
        ):
            return True
    return False


@dataclass(frozen=True)
class RestoreOutcome:
    """What a criu restore left in its work dir: the restored init (pid, a pidfd, starttime),
    or the errors."""

    pid: int | None
    pidfd: int = -1
    starttime: int = 0
    log_errors: Sequence[str] = ()
    out_tail: Sequence[str] = ()
    limit: LimitHit | None = None  # a kernel limit the log says was reached (no retry helps)


def restore_outcome(
    work: Path, succeeded: bool, paths: mounts.SlotPaths | None = None
) -> RestoreOutcome:
    """After criu restore: the init's pid from the pidfile, pinned by a pidfd, and (with
    `paths`) recorded in the instance's owner.json; else the errors of its logs."""
    pidfile = work / "pid"
    if succeeded and pidfile.exists():
        pid = int(pidfile.read_text().strip())
        pidfd = os.pidfd_open(pid)
        start = procfs.starttime(pid) or 0
        if paths is not None:
            slot_fs.write_owner(paths, None, init=(pid, start))
        return RestoreOutcome(pid, pidfd, start)
    log = work / "restore.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    # The limit is looked for in every error line: the first one names it, and the fd errors
    # that follow it can push it out of the last few.
    return RestoreOutcome(
        None,
        log_errors=criu.log_errors(text),
        out_tail=criu.tail(work / "criu.out", 3),
        limit=limit_hit(criu.log_errors(text, limit=10_000)),
    )


def init_log(paths: mounts.SlotPaths) -> Path:
    """The desktop init's log (stage 1 sends its output there) as the host sees it."""
    return paths.upper / protocol.INIT_LOG_PATH.lstrip("/")


def init_log_size(paths: mounts.SlotPaths) -> int:
    """Where the init's log ends now (0 when it has none): a restore's own lines come after."""
    try:
        return init_log(paths).stat().st_size
    except OSError:
        return 0


def restore_evidence(paths: mounts.SlotPaths, init_log_from: int, lines: int = 6) -> str:
    """What a restored tree that died or did not answer left in its slot, to keep in the error
    before the slot's files go: the last lines its init logged since the restore (offset
    `init_log_from`; none means it died without a word: killed, or stuck before its loop) and
    the error lines of CRIU's restore log."""
    try:
        with open(init_log(paths), "rb") as f:
            f.seek(init_log_from)
            since = f.read().decode(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        since = [f"(unreadable: {exc.strerror})"]
    logged = " | ".join(ln.strip() for ln in since if ln.strip()) or "nothing"
    text = f"desktop-init.log since the restore: {logged}"
    try:
        errors = criu.log_errors((paths.rw / "criu" / "restore.log").read_text(errors="replace"))
    except OSError:
        errors = []
    return text + (f"; criu restore.log errors: {' | '.join(errors)}" if errors else "")


def cpu_seconds(ticks: int) -> float:
    return ticks / os.sysconf("SC_CLK_TCK")


def slot_proc_files(pid: int) -> tuple[list[str], list[str], list[str]]:
    """/proc/<pid>/mountinfo lines, the net links, the uid_map fields (empty when gone)."""
    try:
        mountinfo = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        netdev = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    except OSError:
        mountinfo, netdev = [], []
    links = [ln.split(":")[0].strip() for ln in netdev]
    try:
        uid_map = Path(f"/proc/{pid}/uid_map").read_text().split()
    except OSError:
        uid_map = []
    return mountinfo, links, uid_map


def nsenter_path() -> str:
    return shutil.which("nsenter") or "/usr/bin/nsenter"


def boot_env(pkg_root: Path) -> dict[str, str]:
    """The environment of a cold boot's stage 1: the daemon's PATH and its package root."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(pkg_root)}


def open_boot_log(path: Path) -> IO[bytes]:
    return open(path, "ab")


def in_slot_exists(pid: int, rel: str) -> bool:
    """Whether `rel` exists inside the slot's mount namespace (through /proc/<pid>/root)."""
    return Path(f"/proc/{pid}/root/{rel}").exists()


def ksm_counters(ksm_dir: Path) -> dict[str, int]:
    """KSM's counters and the memory it saves right now (saved_bytes)."""
    out: dict[str, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for name in ("pages_shared", "pages_sharing", "pages_unshared", "full_scans"):
        with contextlib.suppress(OSError, ValueError):
            out[name] = int((ksm_dir / name).read_text())
    out["saved_bytes"] = int(out.get("pages_sharing", 0)) * page
    return out
