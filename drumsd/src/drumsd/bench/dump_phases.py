"""Where a `criu dump` spends its time, read from its own log (`-v4`, every line stamped with the
seconds since it started): each line's time up to the next one is charged to the phase the last
marker line opened. Pure; `drumsd bench --saves` reports it per save."""

from __future__ import annotations

import re

# (substring of a log line, the phase it opens), first match wins. CRIU 4.2.1's wording.
MARKERS: tuple[tuple[str, str], ...] = (
    ("page-xfer: Transferring pages", "pages: write"),
    ("Dumping pages (type", "pages: scan, splice"),
    ("Pagemap generated", "pages: scan, splice"),
    ("Dumping core", "task: core, threads, cure"),
    ("Dumping task (pid", "task: infect, files, registers"),
    ("Seized task", "freeze"),
    ("Lock network", "collect: mounts, sockets, namespaces"),
    ("mnt: Dumping mountpoints", "mounts (tmpfs content), shmem, namespaces"),
    ("Dumping shared memory", "mounts (tmpfs content), shmem, namespaces"),
    ("'s namespaces", "mounts (tmpfs content), shmem, namespaces"),
    ("Running post-dump scripts", "post-dump script (upper copy)"),
    ("Unfreezing tasks", "unfreeze, finish"),
    ("Unseizing", "unfreeze, finish"),
)
START = "start: kerndat, cgroups"

_STAMP = re.compile(r"^\((\d+)\.(\d+)\)")


def dump_phases(log_text: str) -> dict[str, float]:
    """Seconds per phase of one dump log (lines without a stamp belong to the line before);
    "total" is the last stamp. {} for a log with no stamped line."""
    phases: dict[str, float] = {}
    phase, last = START, None
    for line in log_text.splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        t = int(m.group(1)) + int(m.group(2)) / 10 ** len(m.group(2))
        if last is not None:
            phases[phase] = phases.get(phase, 0.0) + max(0.0, t - last)
        last = t
        for marker, name in MARKERS:
            if marker in line:
                phase = name
                break
    if last is None:
        return {}
    phases["total"] = last
    return {k: round(v, 4) for k, v in phases.items()}
