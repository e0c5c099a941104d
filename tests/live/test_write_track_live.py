"""Write tracking on this kernel (issue 35): a stopped process armed from outside (its seccomp
filter refusing userfaultfd, as a slot's does) counts only the pages it writes after, and
counts everything once the daemon lets go of its userfaultfd; drums' CRIU dumps only those
pages and the delta stored from them restores the process's memory byte for byte. Root and
drums' CRIU; no desktop needed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from drumsd.linux import save_delta, write_track
from drumsd.linux.write_track import criu_tracks_writes

CRIU = Path(os.environ.get("DRUMS_CRIU", "/usr/local/sbin/criu"))

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


VICTIM = """
import mmap, os, signal, sys, time
buf = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, len(buf), 4096):
    buf[i : i + 16] = os.urandom(16)
def write(*_):
    for i in range(0, 1500 * 3, 3):  # every third page of the first 18 MiB
        buf[i * 4096 : i * 4096 + 16] = os.urandom(16)
    open(sys.argv[1], "w").write("wrote")
signal.signal(signal.SIGUSR1, write)
open(sys.argv[1], "w").write("ready")
while True:
    time.sleep(0.02)
"""


def _private_memory(pid: int) -> str:
    """sha256 of every readable private mapping's bytes, by address (not the stack: below its
    pointer, signal frames of the stop and of CRIU's restorer come and go)."""
    digest = hashlib.sha256()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            parts = line.split()
            special = line.rstrip().endswith("]") and not line.rstrip().endswith("[heap]")
            if parts[1][0] != "r" or parts[1][3] != "p" or special:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            mem.seek(lo)
            digest.update(parts[0].encode() + mem.read(hi - lo))
    return digest.hexdigest()


def _wait_for(path: Path, text: str) -> None:
    for _ in range(500):
        if path.exists() and path.read_text() == text:
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never said {text!r}")


def _criu(*argv: str) -> None:
    done = subprocess.run([str(CRIU), *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (argv, done.stderr[-2000:])


def _gone(pid: int) -> None:
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.01)
    raise AssertionError(f"{pid} still there")


def test_a_tracked_dump_stored_as_a_delta_restores_the_memory_byte_for_byte(
    tmp_path: Path,
) -> None:
    """drums' CRIU against a real process: a full dump, a restore left stopped and armed, a
    third of 18 MiB written, a tracked dump against the full one (CRIU writes only those),
    stored as a delta (store_tracked) and assembled: the process restored from it holds
    exactly the memory it had when dumped. Then once more from that delta: the second tracked
    dump refers to a parent whose images/ holds pagemaps but no pages images (its pages live
    in its parent's and its own pack), and CRIU still writes only what was written."""
    if os.geteuid() != 0 or not criu_tracks_writes(CRIU):
        pytest.skip(f"needs root and drums' CRIU at {CRIU} (scripts/setup.sh builds it)")
    flag = tmp_path / "flag"
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(flag)],
        # no rseq area: the kernel rewrites its cpu_id at every switch, so a page of a plain
        # dump and restore differs in 3 of 6 runs with it
        env={**os.environ, "GLIBC_TUNABLES": "glibc.pthread.rseq=0"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pid = proc.pid
    try:
        _wait_for(flag, "ready")
        parent = tmp_path / "parent"
        (parent / "images").mkdir(parents=True)
        (parent / "meta.json").write_text(json.dumps({"id": "parent"}))
        _criu("dump", "-t", str(pid), "-D", str(parent / "images"), "-o", "dump.log")
        proc.wait()
        whole = sum(p.stat().st_size for p in (parent / "images").glob("pages-*.img"))
        pid = _restore_stopped(parent / "images", tmp_path / "pid1")
        for depth, name in enumerate(("child", "grandchild"), 1):
            pid, written = _tracked_generation(tmp_path, pid, parent, name, depth)
            assert written < 0.4 * whole, (name, written, whole)  # ~6 of 32+ MiB, not all
            parent = tmp_path / name
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def _restore_stopped(images: Path, pidfile: Path) -> int:
    _criu(
        "restore", "-D", str(images), "-o", "restore.log", "--restore-detached",
        "--leave-stopped", "--pidfile", str(pidfile),
    )  # fmt: skip
    return int(pidfile.read_text())


def _tracked_generation(
    tmp_path: Path, pid: int, parent: Path, name: str, depth: int
) -> tuple[int, int]:
    """`pid`, restored stopped from `parent`, armed, made to write, dumped tracked into
    `name`, stored and restored: (the restored pid, holding the same memory; the bytes of
    pages CRIU wrote)."""
    parent_id = json.loads((parent / "meta.json").read_text())["id"]
    armed = write_track.arm_tree(parent_id, [pid])
    write_track.resume([pid])
    assert armed.failed == {}, armed.failed
    flag = tmp_path / "flag"
    flag.write_text("")
    os.kill(pid, signal.SIGUSR1)
    _wait_for(flag, "wrote")
    os.kill(pid, signal.SIGSTOP)  # nothing moves from here to the dump
    time.sleep(0.05)
    before = _private_memory(pid)
    child = tmp_path / name
    (child / "images").mkdir(parents=True)
    (child / "meta.json").write_text(json.dumps({"id": name}))
    _criu(
        "dump", "-t", str(pid), "-D", str(child / "images"), "-o", "dump.log",
        "--track-mem-uffd-wp", "--prev-images-dir", str(parent / "images"),
    )  # fmt: skip
    armed.close()
    _gone(pid)
    written = sum(p.stat().st_size for p in (child / "images").glob("pages-*.img"))
    stats = save_delta.store_tracked(child, parent, name, 8)
    assert stats is not None and stats.depth == depth
    restored = tmp_path / f"{name}-restore-images"
    shutil.copytree(child / "images", restored)
    assert save_delta.assemble(child, restored) >= 1
    pid = _restore_stopped(restored, tmp_path / f"{name}.pid")
    assert _private_memory(pid) == before
    return pid, written
