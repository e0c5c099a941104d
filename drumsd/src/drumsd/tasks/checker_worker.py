"""The resident checker worker: the checker venv's metric modules imported once, one fork per call.

drumsd starts this file with the checker venv's python (as root, like drumsd) and the path of the
venv's checker_runner.py. It imports every metric module and the heavy libraries they use, listens
on a Unix socket in a root-only directory, says {"ready": ...} on stdout, and then for each
connection forks a child that gives the call exactly what a fresh checker process gets: its own
session (drumsd kills the group at the deadline), the unprivileged uid and gid with no extra
groups, the scratch directory as working directory and HOME/TMPDIR, the same environment, stdin
from /dev/null, stdout and stderr into a log drumsd reads, and the answer alone on the socket.
Forking from the imported state is what makes a call cheap; the child's writes to module state stay
in its own copy, so no call sees another's. The worker reads no input but drumsd's, exits when its
stdin closes (drumsd gone), and uses only the standard library (it runs in the venv).

Each child runs under the call's limits (issue 39, D5: a 63 MiB XML drove one checker to 1.5 GiB
and 30.7 s): RLIMIT_AS at its address space when forked plus the call's memory_mib (a MemoryError,
answered as the runner answers a crash), RLIMIT_CPU at cpu_s (SIGXCPU), no core file. The worker
holds each call's connection until it reaps the child, and a child that died without answering
(a signal, an exit code) gets its answer from the worker: cpu_limit for SIGXCPU, else a crash
saying how it ended.

Protocol, one JSON line each way per connection:
  drumsd -> child: {"request": {...}, "scratch": DIR, "log": PATH, "uid": N, "gid": N,
                    "env": {...}, "limits": {"memory_mib": N|null, "cpu_s": S|null}}
  child -> drumsd: {"pid": PID} as soon as it runs, then the runner's answer, then EOF
                   (the worker's answer instead when the child died without one).
"""

from __future__ import annotations

import json
import math
import os
import resource
import selectors
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any


def _memoize_static_reads(runner: Any) -> None:
    """Each call reads the metrics package's __init__ and its module's source as syntax trees
    (tens of ms for the large modules): the files do not change under a worker, so read once."""
    exported = runner.exported_metrics
    needing = runner.functions_needing
    exported_seen: dict[Any, Any] = {}
    needing_seen: dict[Any, Any] = {}

    def exported_once(metrics_dir: Any) -> Any:
        if metrics_dir not in exported_seen:
            exported_seen[metrics_dir] = exported(metrics_dir)
        return dict(exported_seen[metrics_dir])

    def needing_once(source: str, libraries: set[str]) -> Any:
        key = (source, frozenset(libraries))
        if key not in needing_seen:
            needing_seen[key] = needing(source, libraries)
        return dict(needing_seen[key])

    runner.exported_metrics = exported_once
    runner.functions_needing = needing_once


def preload(runner: Any) -> dict[str, Any]:
    """Import what checker calls import: every metric module (as the probe does) and pandas."""
    started = time.monotonic()
    # The runner finds desktop_env with find_spec, which fails once its stand-in package is in
    # sys.modules (a fresh process looks once, before that): look once here, for every child.
    # The runner is the checker venv's copy of checker_runner.py (a script; its text is part of
    # the venv's content hash, so renaming its functions would rebuild every checker venv).
    root = runner._desktop_env_root()  # noqa: SLF001 - the venv's runner script
    runner._desktop_env_root = lambda: root  # noqa: SLF001 - the venv's runner script
    _memoize_static_reads(runner)
    probe = runner._probe()  # noqa: SLF001 - the venv's runner script
    import pandas  # noqa: F401  (xlsx_last_row decoding; most metric modules import it anyway)

    runner._quiet_tldextract()  # noqa: SLF001 - the venv's runner script
    return {"preload_s": round(time.monotonic() - started, 3), "unsupported": probe["unsupported"]}


def _read_line(conn: socket.socket, limit: int = 64 * 2**20) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n") or size > limit:
            break
    return b"".join(chunks)


def _vm_size() -> int:
    """This process's address space in bytes (VmSize)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def apply_limits(limits: dict[str, Any]) -> None:
    """The call's limits on this process (see the module doc); lowering needs no privilege."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu_s = limits.get("cpu_s")
    if cpu_s:
        seconds = max(1, math.ceil(cpu_s))
        # Soft: SIGXCPU (fatal, and told apart from other deaths); hard a second later: SIGKILL.
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    memory_mib = limits.get("memory_mib")
    if memory_mib:
        ceiling = _vm_size() + int(memory_mib) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))


def death_answer(status: int, cpu_s: float) -> dict[str, Any]:
    """The answer for a child that exited with `status` (from wait) without answering."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return {
                "ok": False,
                "error_class": "cpu_limit",
                "error": f"the checker reached its CPU limit (RLIMIT_CPU, tasks.checker_cpu_s) "
                f"after {cpu_s:.1f} s of CPU and was killed",
            }
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return {
            "ok": False,
            "error_class": "crash",
            "error": f"the checker process was killed by {name} after {cpu_s:.1f} s of CPU",
        }
    return {
        "ok": False,
        "error_class": "crash",
        "error": f"the checker process exited {os.waitstatus_to_exitcode(status)} without an "
        "answer (its traceback is in drumsd's log)",
    }


def _run_child(conn: socket.socket, runner: Any) -> None:
    """In the forked child: become a checker process, answer one call, never return."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # as in a fresh process
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setsid()
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        call = json.loads(_read_line(conn))
        log_fd = os.open(call["log"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        keep = conn.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, 65536)
        sys.stdout = sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(call["env"])
        tempfile.tempdir = None  # the worker's TMPDIR may be cached; use the call's
        scratch = Path(call["scratch"])
        os.chdir(scratch)
        apply_limits(call.get("limits") or {})
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(call["gid"])
            os.setuid(call["uid"])
        answer = runner.handle(call["request"], scratch)
        sys.stderr.flush()
        conn.sendall(json.dumps(answer).encode())
    except BaseException:  # the child must never fall back into the worker's loop
        code = 70
        traceback.print_exc()
    finally:
        os._exit(code)


def _reap(calls: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = calls.pop(pid, None)
        if conn is None:
            continue
        try:
            if status != 0:  # exit 0 is a child that sent its answer
                conn.settimeout(1.0)
                cpu_s = usage.ru_utime + usage.ru_stime
                conn.sendall(json.dumps(death_answer(status, cpu_s)).encode())
        except OSError:
            pass  # drumsd gave up on the call (its deadline) and closed its end
        finally:
            conn.close()


def serve(sock: socket.socket, runner: Any) -> None:
    # Children are reaped here (not by SIGCHLD=SIG_IGN) so their CPU time is added to the
    # worker's, where drumsd's figures of checker CPU can read it.
    wake_read, wake_write = socket.socketpair()
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    selector.register(wake_read, selectors.EVENT_READ, "sigchld")
    calls: dict[int, socket.socket] = {}  # child pid -> its call's connection, until reaped
    while True:
        _reap(calls)  # also after a wake-up byte lost to a full buffer
        for key, _events in selector.select(timeout=5):
            if key.data == "sigchld":
                wake_read.recv(4096)
                _reap(calls)
                continue
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):
                    return  # drumsd closed our stdin: stop (children run on, owned by drumsd)
                continue
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                continue
            conn.setblocking(True)
            try:
                pid = os.fork()
            except OSError as exc:
                conn.close()
                print(f"checker worker: fork failed: {exc}", file=sys.stderr, flush=True)
                continue
            if pid == 0:
                signal.set_wakeup_fd(-1)
                selector.close()
                sock.close()
                _run_child(conn, runner)
            calls[pid] = conn


def main(argv: list[str]) -> int:
    runner_path, socket_path = Path(argv[1]), argv[2]
    # No PR_SET_PDEATHSIG: it fires when the *thread* that forked us exits, and trio starts
    # processes from its worker threads, which end when idle. drumsd's death closes our stdin.
    # Metric prints (and C libraries') must not reach the control pipe: stdout carries one line.
    control = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, str(runner_path.parent))
    import checker_runner as runner  # the venv's copy, the same file fresh processes run

    info = preload(runner)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(socket_path)
    os.chmod(socket_path, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    control.write(json.dumps({"ready": True, "pid": os.getpid(), **info}) + "\n")
    control.flush()
    serve(sock, runner)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
