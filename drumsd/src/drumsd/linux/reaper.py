"""The launcher's own process: it forks every criu for the daemon and is the parent of every
desktop init that criu restores (`--restore-sibling` makes the init a sibling of criu, so a child
of this process), and a child subreaper, so whatever is orphaned below it comes to it as well.
It reaps each child the moment it exits and reports it, and it outlives the daemon: after a
kill -9 of drumsd the inits stay its children and are still reaped at once (under pid 1 they
would wait for whatever pid 1 does), until it has no child left.

Run as a script, stdlib only: `python -I reaper.py <socket fd> <jobs at once>`. One JSON object
per line each way. In: {"id", "argv", "log", "env", "timeout_s"}. Out: {"id", "returncode",
"elapsed_s", "cpu_s", "timed_out"} or {"id", "error"} for a job; {"reaped", "status"} for any
other child (a restored init), with its raw wait status.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass

PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Job:
    id: int
    started: float
    deadline: float | None
    timed_out: bool = False


class Reaper:
    def __init__(self, sock: socket.socket, size: int) -> None:
        self.sock = sock
        self.size = max(1, size)
        self.running: dict[int, Job] = {}  # pid -> its job
        self.waiting: deque[dict] = deque()  # requests beyond `size` at once
        self.owner_gone = False
        self.buffer = b""

    # ---- the owner's requests -------------------------------------------------------------

    def read_requests(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.owner_gone = True  # the daemon closed or died: finish, reap, then exit
            return
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self.waiting.append(json.loads(line))
        self.start_waiting()

    def start_waiting(self) -> None:
        while self.waiting and len(self.running) < self.size:
            self.spawn(self.waiting.popleft())

    def spawn(self, req: dict) -> None:
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        env = req.get("env")
        try:
            pid = os.posix_spawnp(
                req["argv"][0],
                req["argv"],
                os.environ if env is None else env,
                file_actions=actions,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD),
            )
        except OSError as exc:
            self.send({"id": req["id"], "error": f"{type(exc).__name__}: {exc}"})
            return
        now = time.monotonic()
        timeout = req.get("timeout_s")
        self.running[pid] = Job(req["id"], now, None if timeout is None else now + timeout)

    # ---- children --------------------------------------------------------------------------

    def reap(self) -> bool:
        """Reap every exited child; False once there is no child at all."""
        while True:
            try:
                pid, status, usage = os.wait3(os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            job = self.running.pop(pid, None)
            if job is None:
                self.send({"reaped": pid, "status": status})
                continue
            self.send(
                {
                    "id": job.id,
                    "returncode": os.waitstatus_to_exitcode(status),
                    "elapsed_s": time.monotonic() - job.started,
                    "cpu_s": usage.ru_utime + usage.ru_stime,
                    "timed_out": job.timed_out,
                }
            )
            self.start_waiting()

    def kill_overdue(self) -> float | None:
        """SIGKILL the jobs past their time limit; seconds until the next limit (None: none)."""
        now, nearest = time.monotonic(), None
        for pid, job in self.running.items():
            if job.deadline is None or job.timed_out:
                continue
            if job.deadline <= now:
                job.timed_out = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:
                left = job.deadline - now
                nearest = left if nearest is None else min(nearest, left)
        return nearest

    def send(self, message: dict) -> None:
        if self.owner_gone:
            return
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            self.owner_gone = True


def main(argv: list[str]) -> int:
    """Its stdout and stderr are /dev/null (it must not hold the daemon's pipes open after the
    daemon is gone): a failure of its own goes to the daemon as {"fatal": traceback}."""
    sock = socket.socket(fileno=int(argv[1]))
    try:
        return serve(sock, int(argv[2]))
    except BaseException:
        with contextlib.suppress(OSError):
            sock.sendall(json.dumps({"fatal": traceback.format_exc()}).encode() + b"\n")
        return 1


def serve(sock: socket.socket, size: int) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the daemon
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    reaper = Reaper(sock, size)
    sel = selectors.DefaultSelector()
    sel.register(reaper.sock, selectors.EVENT_READ, "owner")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    while True:
        has_children = reaper.reap()
        if reaper.owner_gone and not has_children and not reaper.running:
            return 0
        if reaper.owner_gone and "owner" in {k.data for k in sel.get_map().values()}:
            sel.unregister(reaper.sock)
            reaper.waiting.clear()  # nobody would hear of them
        timeout = reaper.kill_overdue()
        for key, _ in sel.select(timeout):
            if key.data == "owner":
                reaper.read_requests()
            else:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break


if __name__ == "__main__":
    sys.exit(main(sys.argv))
