"""Write tracking on this kernel (issue 35): a stopped process armed from outside (its seccomp
filter refusing userfaultfd, as a slot's does) counts only the pages it writes after, and
counts everything once the daemon lets go of its userfaultfd. Root; no desktop needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from drumsd.linux import write_track

WRITER = """
import ctypes, mmap, signal, sys, time
buf = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, len(buf), 4096):
    buf[i] = 1
if sys.argv[1] == "seccomp":  # the slot's filter: userfaultfd refused
    sys.path.insert(0, sys.argv[2])
    from drumsd.guest import seccomp
    seccomp.Lock().lock_self(())
done = []
def write(*_):
    for i in range(300):
        buf[i * 8192] = 2
    done.append(1)
signal.signal(signal.SIGUSR1, write)
print("ready", flush=True)
while True:
    time.sleep(0.02)
    if done:
        print("wrote", flush=True)
        done.clear()
"""


@pytest.mark.parametrize("lock", ["plain", "seccomp"])
def test_an_armed_process_counts_the_pages_it_writes(lock: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("arming needs root (ptrace with seccomp suspended, pidfd_getfd)")
    src = os.path.dirname(os.path.dirname(write_track.__file__))
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, lock, os.path.dirname(src)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.05)
        armed = write_track.arm_tree("c1", [proc.pid])
        write_track.resume([proc.pid])
        assert armed.failed == {} and set(armed.fds) == {proc.pid}, armed.failed
        before = write_track.page_counts(proc.pid)
        assert before.unwritten >= 4096, before  # the 16 MiB it filled are the parent's
        os.kill(proc.pid, signal.SIGUSR1)
        assert proc.stdout.readline().strip() == "wrote"
        after = write_track.page_counts(proc.pid)
        moved = before.unwritten - after.unwritten
        # the 300 pages it wrote, and the interpreter's own few: never the whole buffer
        assert 300 <= moved < 600, (before, after)
        armed.close()
        gone = write_track.page_counts(proc.pid)
        assert gone.unwritten == 0, gone  # let go: every page counts as written
    finally:
        proc.kill()
        proc.wait()
