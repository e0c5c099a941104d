"""Read the host figures admission decides on: MemAvailable, PSI memory, state-dir space."""

from __future__ import annotations

import os
import time
from pathlib import Path

from drumsd.core.admission import HostSample

MIB = 1024 * 1024


def read_meminfo(path: Path = Path("/proc/meminfo")) -> tuple[float | None, float | None]:
    """(MemAvailable, MemTotal) in MiB."""
    available = total = None
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key == "MemAvailable":
                available = int(rest.split()[0]) / 1024
            elif key == "MemTotal":
                total = int(rest.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        return None, None
    return available, total


def read_psi_some_avg10(path: Path = Path("/proc/pressure/memory")) -> float | None:
    """None when the kernel has no PSI (psi=0) or the file cannot be read."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("some "):
                for field in line.split()[1:]:
                    key, _, value = field.partition("=")
                    if key == "avg10":
                        return float(value)
    except (OSError, ValueError):
        return None
    return None


def read_space(path: Path) -> tuple[float | None, float | None]:
    """(free, total) MiB of the filesystem holding `path` (free as available to non-root)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None, None
    return st.f_bavail * st.f_frsize / MIB, st.f_blocks * st.f_frsize / MIB


def sample_host(state_dir: Path) -> HostSample:
    available, total = read_meminfo()
    free, state_total = read_space(state_dir)
    return HostSample(
        taken_at=time.time(),
        mem_available_mib=available,
        mem_total_mib=total,
        psi_memory_some_avg10=read_psi_some_avg10(),
        state_free_mib=free,
        state_total_mib=state_total,
    )


def read_host_namespaces(proc: Path = Path("/proc/self/ns")) -> dict[str, int]:
    """Namespace inodes of the daemon itself (the host's), for the isolation gates."""
    out: dict[str, int] = {}
    for name in ("pid", "mnt", "net", "ipc", "uts", "user", "cgroup"):
        try:
            out[name] = os.stat(proc / name).st_ino
        except OSError:
            continue
    return out
