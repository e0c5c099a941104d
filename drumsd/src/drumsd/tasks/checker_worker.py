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

Protocol, one JSON line each way per connection:
  drumsd -> child: {"request": {...}, "scratch": DIR, "log": PATH, "uid": N, "gid": N,
                    "env": {...}}
  child -> drumsd: {"pid": PID} as soon as it runs, then the runner's answer, then EOF.
"""

from __future__ import annotations

import json
import os
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
    root = runner._desktop_env_root()
    runner._desktop_env_root = lambda: root
    _memoize_static_reads(runner)
    probe = runner._probe()
    import pandas  # noqa: F401  (xlsx_last_row decoding; most metric modules import it anyway)

    runner._quiet_tldextract()
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


def _reap() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


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
    while True:
        _reap()  # also after a wake-up byte lost to a full buffer
        for key, _events in selector.select(timeout=5):
            if key.data == "sigchld":
                wake_read.recv(4096)
                _reap()
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
            conn.close()


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
