"""The /proc and cgroupfs reads the crash watch makes (synchronous; each tolerates a process that
is gone)."""

from __future__ import annotations

import os
from pathlib import Path


class ProcReader:
    """The /proc and cgroupfs reads the watch makes (a seam: tests of the folding logic give a
    fake). Every read tolerates a process that is gone: None or empty."""

    def cgroup(self, pid: int) -> str | None:
        return _read(f"/proc/{pid}/cgroup")

    def comm(self, pid: int) -> str | None:
        text = _read(f"/proc/{pid}/comm")
        return text.rstrip("\n") if text is not None else None

    def procs(self, path: str) -> list[int]:
        text = _read(path)
        return [int(x) for x in text.split()] if text else []

    def exists(self, pid: int) -> bool:
        return os.path.exists(f"/proc/{pid}")

    def mountinfo(self) -> str:
        return Path("/proc/self/mountinfo").read_text()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None  # ESRCH and friends from a task that is exiting
