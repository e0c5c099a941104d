"""The host's kernel limits that slots use up together, sized for the slots the daemon admits,
and the CRIU errors that mean one of them was reached (pure: figures in, verdicts out).

Why they add up: a hardened slot runs in a user namespace the daemon (root) owns, and the kernel
charges an inotify instance or watch to the user at every level up to the initial namespace, where
the namespace's owner is charged (kernel/ucount.c). So every slot's inotify instances count against
root's `fs.inotify.max_user_instances` (128 by default), beside root's own on the host (the
trusted profile's identity-mapped namespace is root's too). A fork of 16 osworld desktops (GNOME
shell) ran out of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

INOTIFY_INSTANCES = "fs.inotify.max_user_instances"
INOTIFY_WATCHES = "fs.inotify.max_user_watches"
NOFILE = "RLIMIT_NOFILE"
FILE_MAX = "fs.file-max"

# One slot's use, measured on a live office slot (docs/runtime.md "Kernel limits per slot") and
# doubled for richer desktops (the osworld image's GNOME shell holds more than Calc's).
SLOT_INOTIFY_INSTANCES = 16
SLOT_INOTIFY_WATCHES = 2048
# What the daemon's process tree (the launcher and the criu it starts inherit its RLIMIT_NOFILE)
# holds per slot: pidfds, agent sockets, cgroup and event fds, a restore's image files.
SLOT_DAEMON_FDS = 64
# What the host itself uses under the same counters (root's own inotify users: systemd, udev...).
HOST_INOTIFY_INSTANCES = 128
HOST_INOTIFY_WATCHES = 65536
HOST_DAEMON_FDS = 4096
SLOT_MIB_FLOOR = 100  # the least memory a restored desktop holds (an idle office slot, KSM off)


@dataclass(frozen=True)
class LimitNeed:
    """One limit: what the host has, what `slots` admitted slots need, and how to raise it."""

    name: str
    current: int
    needed: int
    how: str  # the command or setting that raises it

    @property
    def short(self) -> bool:
        return self.current < self.needed


def max_admitted_slots(slot_range: tuple[int, int], mem_total_mib: float | None) -> int:
    """The most slots the host admits at once: slot numbers and memory bound them (admission
    refuses past memory; SLOT_MIB_FLOOR is the cheapest desktop). An unreadable MemTotal
    (None) leaves the slot numbers alone to bound it."""
    lo, hi = slot_range
    numbered = hi - lo + 1
    if mem_total_mib is None:
        return max(1, numbered)
    return max(1, min(numbered, int(mem_total_mib) // SLOT_MIB_FLOOR))


def needs(
    slots: int, *, inotify_instances: int, inotify_watches: int, nofile: int
) -> list[LimitNeed]:
    """The limits `slots` slots need, against the host's current values."""
    return [
        LimitNeed(
            INOTIFY_INSTANCES,
            inotify_instances,
            HOST_INOTIFY_INSTANCES + slots * SLOT_INOTIFY_INSTANCES,
            f"sysctl -w {INOTIFY_INSTANCES}=N (and in /etc/sysctl.d to keep it)",
        ),
        LimitNeed(
            INOTIFY_WATCHES,
            inotify_watches,
            HOST_INOTIFY_WATCHES + slots * SLOT_INOTIFY_WATCHES,
            f"sysctl -w {INOTIFY_WATCHES}=N (and in /etc/sysctl.d to keep it)",
        ),
        LimitNeed(
            NOFILE,
            nofile,
            HOST_DAEMON_FDS + slots * SLOT_DAEMON_FDS,
            "LimitNOFILE=N in the drumsd unit (or `ulimit -n N` before drumsd serve)",
        ),
    ]


@dataclass(frozen=True)
class LimitHit:
    """A restore that failed on a kernel limit: which one and the CRIU line that says so."""

    name: str
    line: str


def limit_hit(errors: Sequence[str]) -> LimitHit | None:
    """The kernel limit CRIU's error lines name, if any. inotify_init1 fails with EMFILE ("Too
    many open files") at the user's instance limit and inotify_add_watch with ENOSPC at the
    watch limit; the fd errors that follow ("Unable to open fd=9") are their consequence, so
    an inotify line wins over a plain EMFILE."""
    for line in errors:
        low = line.lower()
        if "inotify" in low and "too many open files" in low:
            return LimitHit(INOTIFY_INSTANCES, line)
        if "inotify" in low and "no space left on device" in low:
            return LimitHit(INOTIFY_WATCHES, line)
    for line in errors:
        low = line.lower()
        if "too many open files in system" in low:
            return LimitHit(FILE_MAX, line)
        if "too many open files" in low:
            return LimitHit(NOFILE, line)
    return None


def limit_message(hit: LimitHit, current: int | None, what: str) -> str:
    """The error a client sees: the limit, its value, what failed and how to raise it."""
    value = f"={current}" if current is not None else ""
    if hit.name == NOFILE:
        fix = "raise the daemon's open-file limit (LimitNOFILE= in its unit, or ulimit -n)"
    else:
        fix = f"raise it (sysctl -w {hit.name}=N; drumsd raises it at start when it can)"
    return (
        f"{hit.name}{value} reached {what} (CRIU: {hit.line}); {fix}, or run fewer slots. "
        "Not retried: a restore cannot succeed until the limit is raised. `drumsd doctor` "
        "reports the limits the admitted slots need"
    )
