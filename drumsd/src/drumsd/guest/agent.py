"""The guest agent: serves the host over a unix socket inside the desktop (see protocol.py).

One thread, one selector loop, no thread or process per request: a fork bomb in the desktop must not
make the agent unreachable (only `exec` and a worker restart need a fork). Steps run one at a time
in the worker process; screenshots, files, windows and processes are answered in this process.
Connections are closed after each reply so none is open when CRIU dumps the slot.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import protocol, seccomp
from .desktop import desktop_creds, list_processes, list_windows, read_file
from .screen import Screen, shot_header
from .worker import _LEN

MAX_CONNECTIONS = 64
# A worker message (a step's result) larger than this is the worker misbehaving: it runs as the
# desktop user, who can write anything to its end of the pair.
MAX_WORKER_MESSAGE = 16 << 20
EXEC_OUTPUT_LIMIT = 8 << 20
WORKER_START_TIMEOUT_S = 20.0


def log(message: str, **fields: Any) -> None:
    record = {"t": round(time.time(), 3), "component": "agent", "msg": message, **fields}
    print(json.dumps(record), file=sys.stderr, flush=True)


# ---------------------------------------------------------------- connections and jobs


@dataclass
class Conn:
    sock: socket.socket
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: memoryview | None = None
    request: dict[str, Any] | None = None
    deadline: float | None = None


@dataclass
class ExecJob:
    conn: Conn
    proc: subprocess.Popen
    pidfd: int
    deadline: float
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)


class Agent:
    def __init__(self, sock_path: str, display: str, worker_argv: list[str]) -> None:
        self.sock_path = sock_path
        self.display = display
        self.worker_argv = worker_argv
        self.sel = selectors.DefaultSelector()
        self.screen = Screen(display)
        self.conns: dict[int, Conn] = {}
        self.exec_jobs: dict[int, ExecJob] = {}  # by pidfd
        self.steps: collections.deque[Conn] = collections.deque()
        self.current_step: Conn | None = None
        self.worker: subprocess.Popen | None = None
        self.worker_sock: socket.socket | None = None
        self.worker_ready = False
        self.worker_buf = bytearray()
        self.worker_started_at = 0.0
        self.worker_restarts = 0
        # A worker that dies before it is ready (no X, broken pyautogui) is retried with backoff
        # instead of in a tight loop; steps meanwhile fail fast with the reason.
        self.worker_error: str | None = None
        self.worker_backoff = 0.0
        self.worker_retry_at = 0.0
        self.started_at = time.time()
        self.stop = False
        self.child_creds = desktop_creds()
        # How often the agent found itself dumpable again (after exec it is; a CRIU restore
        # restores the flag): each time it is set back to 0 before a request is read.
        self.dumpable_reasserted = 0

    # ------------------------------------------------ setup

    def listen(self) -> None:
        inherited = os.environ.pop("DRUMS_AGENT_FD", None)
        if inherited:
            # desktop-init bound it as root in a directory the desktop user cannot write.
            listener = socket.socket(fileno=int(inherited))
            os.set_inheritable(listener.fileno(), False)
            listener.setblocking(False)
            self.listener = listener
            self.sel.register(listener, selectors.EVENT_READ, ("listen", None))
            return
        path = Path(self.sock_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(self.sock_path)
        # Owner only: the desktop user, and root on the host (which bypasses the mode).
        os.chmod(self.sock_path, 0o600)
        listener.listen(128)
        listener.setblocking(False)
        self.listener = listener
        self.sel.register(listener, selectors.EVENT_READ, ("listen", None))

    def start_worker(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.worker = subprocess.Popen(
                [*self.worker_argv, str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                **self.child_creds,
            )
        except OSError as exc:  # e.g. EAGAIN under a fork bomb: try again at the next step
            log("worker start failed", error=str(exc))
            parent.close()
            self.worker = None
            return
        finally:
            child.close()
        parent.setblocking(False)
        self.worker_sock = parent
        self.worker_ready = False
        self.worker_buf = bytearray()
        self.worker_started_at = time.monotonic()
        self.sel.register(parent, selectors.EVENT_READ, ("worker", None))
        log("worker started", pid=self.worker.pid)

    def kill_worker(self, why: str) -> None:
        if self.worker_sock is not None:
            self.sel.unregister(self.worker_sock)
            self.worker_sock.close()
            self.worker_sock = None
        if self.worker is not None:
            try:
                self.worker.kill()
            except ProcessLookupError:
                pass
            rc = self.worker.wait()
            log("worker stopped", why=why, rc=rc)
            self.worker = None
        self.worker_ready = False
        self.worker_restarts += 1

    # ------------------------------------------------ loop

    def stay_undumpable(self) -> None:
        try:
            if seccomp.set_not_dumpable():
                self.dumpable_reasserted += 1
        except OSError as exc:
            log("cannot clear dumpable", error=str(exc))

    def run(self) -> int:
        self.stay_undumpable()
        self.listen()
        self.start_worker()
        log("listening", socket=self.sock_path, display=self.display)
        while not self.stop:
            timeout = self.next_timeout()
            for key, events in self.sel.select(timeout):
                kind, obj = key.data
                try:
                    if kind == "listen":
                        self.accept()
                    elif kind == "conn":
                        self.on_conn(obj, events)
                    elif kind == "worker":
                        self.on_worker()
                    elif kind == "exec_pidfd":
                        self.finish_exec(obj)
                    elif kind == "exec_out":
                        job = self.exec_jobs.get(obj)
                        if job is not None:
                            self.drain_exec(job)
                except Exception as exc:
                    log("handler error", kind=kind, error=repr(exc))
                    if kind == "conn":
                        self.reply_error(obj, "failed", f"agent error: {exc!r}")
            self.check_deadlines()
        return 0

    def next_timeout(self) -> float | None:
        deadlines = [j.deadline for j in self.exec_jobs.values()]
        if self.current_step is not None and self.current_step.deadline is not None:
            deadlines.append(self.current_step.deadline)
        if self.worker is not None and not self.worker_ready:
            deadlines.append(self.worker_started_at + WORKER_START_TIMEOUT_S)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def check_deadlines(self) -> None:
        now = time.monotonic()
        step = self.current_step
        if step is not None and step.deadline is not None and now >= step.deadline:
            self.current_step = None
            self.kill_worker("step timeout")
            self.reply_error(
                step,
                "timeout",
                "the step did not finish in time; its worker was killed and "
                "restarted (apps it started keep running)",
            )
            self.start_worker()
        if (
            self.worker is not None
            and not self.worker_ready
            and now >= self.worker_started_at + WORKER_START_TIMEOUT_S
        ):
            self.kill_worker("worker start timeout")
            self.worker_error = "the action worker did not start in time (is X up?)"
            self.worker_backoff = min(10.0, max(0.5, self.worker_backoff * 2))
            self.worker_retry_at = now + self.worker_backoff
            self.fail_queued_steps(self.worker_error)
        for pidfd, job in list(self.exec_jobs.items()):
            if now >= job.deadline:
                try:
                    os.killpg(job.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.finish_exec(pidfd, timed_out=True)
        self.dispatch_step()

    # ------------------------------------------------ connections

    def accept(self) -> None:
        self.stay_undumpable()
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            conn = Conn(sock)
            if len(self.conns) >= MAX_CONNECTIONS:
                self.conns[sock.fileno()] = conn
                self.sel.register(sock, selectors.EVENT_WRITE, ("conn", conn))
                self.reply_error(conn, "failed", "agent busy: too many open requests")
                continue
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, ("conn", conn))

    def on_conn(self, conn: Conn, events: int) -> None:
        if conn.outbuf is not None:
            self.flush(conn)
            return
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            if conn.request is None:
                self.close(conn)  # the client went away before asking anything
            else:
                # Half-closed while its request runs: stop watching reads (EOF stays readable
                # and would spin the loop); reply() re-registers the socket for writing.
                self.sel.unregister(conn.sock)
            return
        if conn.request is not None:
            return  # one request per connection; ignore anything after it
        conn.inbuf += chunk
        newline = conn.inbuf.find(b"\n")
        if newline < 0:
            if len(conn.inbuf) > protocol.MAX_REQUEST_BYTES:
                self.reply_error(conn, "invalid_action", "request line longer than 1 MiB")
            return
        try:
            conn.request = protocol.decode_request(bytes(conn.inbuf[:newline]))
            self.handle(conn)
        except protocol.ProtocolError as exc:
            self.reply_error(conn, exc.code, exc.message)

    def handle(self, conn: Conn) -> None:
        request = conn.request
        assert request is not None
        op = request["op"]
        if op == "ping":
            self.reply(
                conn,
                {
                    "ok": True,
                    "pid": os.getpid(),
                    "uptime_s": round(time.time() - self.started_at, 3),
                    "worker_ready": self.worker_ready,
                    "worker_restarts": self.worker_restarts,
                    "uid": os.getuid(),
                    "dumpable": seccomp.dumpable(),
                    "dumpable_reasserted": self.dumpable_reasserted,
                },
            )
        elif op == "screenshot":
            started = time.monotonic()
            spec = protocol.parse_shot(request.get("shot"))
            shot = self.screen.grab(spec, fresh=request.get("fresh") is True)
            self.reply(
                conn,
                {
                    "ok": True,
                    **shot_header(spec, shot),
                    "elapsed_s": round(time.monotonic() - started, 4),
                },
                shot.data,
            )
        elif op == "read_file":
            header, data = read_file(request)
            self.reply(conn, header, data)
        elif op == "windows":
            self.reply(conn, {"ok": True, "windows": list_windows(self.display)})
        elif op == "procs":
            self.reply(conn, {"ok": True, "procs": list_processes()})
        elif op == "exec":
            self.start_exec(conn, request)
        elif op == "step":
            timeout = protocol.check_timeout(request, None)
            if "actions" in request:  # a batch, run in order by the worker in one message
                batch = protocol.parse_batch(request["actions"])
                limit = sum(protocol.step_timeout(a, None) for a in batch)
                limit = timeout if timeout is not None else limit
                request["actions"] = [a.to_dict() for a in batch]
            else:
                action = protocol.parse_action(request.get("action"))
                limit = protocol.step_timeout(action, timeout)
                request["action"] = action.to_dict()
            # Absolute from arrival: a step that waited out its time in the queue is not run
            # after the client has given up on it.
            conn.deadline = time.monotonic() + limit
            wanted = request.get("screenshot")
            if wanted:
                # Checked before the step runs: a bad spec must not cost the step's result.
                request["screenshot_spec"] = protocol.parse_shot(
                    wanted if isinstance(wanted, dict) else None
                )
            self.steps.append(conn)
            self.dispatch_step()

    def reply(self, conn: Conn, header: dict[str, Any], payload: bytes = b"") -> None:
        if conn.outbuf is not None:
            return
        conn.outbuf = memoryview(protocol.encode_reply(header, payload))
        if conn.sock.fileno() < 0:
            return
        try:
            self.sel.modify(conn.sock, selectors.EVENT_WRITE, ("conn", conn))
        except KeyError:
            self.sel.register(conn.sock, selectors.EVENT_WRITE, ("conn", conn))
        self.flush(conn)

    def reply_error(self, conn: Conn, code: str, message: str, **extra: Any) -> None:
        self.reply(conn, {"ok": False, "error": {"code": code, "message": message}, **extra})

    def flush(self, conn: Conn) -> None:
        assert conn.outbuf is not None
        try:
            while conn.outbuf:
                sent = conn.sock.send(conn.outbuf)
                conn.outbuf = conn.outbuf[sent:]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass  # the client went away; nothing more to do for it
        self.close(conn)

    def close(self, conn: Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            self.conns.pop(fd, None)
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.sock.close()

    # ------------------------------------------------ steps (worker)

    def fail_queued_steps(self, message: str) -> None:
        while self.steps:
            self.reply_error(self.steps.popleft(), "failed", message)

    def dispatch_step(self) -> None:
        if self.current_step is not None or not self.steps:
            return
        if self.worker is None:
            if time.monotonic() < self.worker_retry_at:
                self.fail_queued_steps(f"the action worker is unavailable: {self.worker_error}")
                return
            self.start_worker()
            if self.worker is None:
                self.fail_queued_steps("cannot start the action worker (out of processes?)")
                return
        if not self.worker_ready:
            return  # dispatched when the worker says it is ready
        conn = self.steps.popleft()
        assert conn.request is not None and conn.deadline is not None
        if time.monotonic() >= conn.deadline:
            self.reply_error(conn, "timeout", "the step timed out waiting for earlier steps")
            self.dispatch_step()
            return
        self.current_step = conn
        key = "actions" if "actions" in conn.request else "action"
        data = json.dumps({key: conn.request[key]}).encode()
        assert self.worker_sock is not None
        self.worker_sock.setblocking(True)
        try:
            self.worker_sock.sendall(_LEN.pack(len(data)) + data)
        except OSError as exc:
            self.current_step = None
            self.kill_worker(f"send failed: {exc}")
            self.reply_error(conn, "failed", "the action worker died; it has been restarted")
            self.start_worker()
        finally:
            if self.worker_sock is not None:
                self.worker_sock.setblocking(False)

    def on_worker(self) -> None:
        assert self.worker_sock is not None
        try:
            chunk = self.worker_sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            step, self.current_step = self.current_step, None
            rc = self.worker.poll() if self.worker else None
            was_ready = self.worker_ready
            self.kill_worker("worker exited")
            if not was_ready:
                self.worker_backoff = min(10.0, max(0.5, self.worker_backoff * 2))
                self.worker_retry_at = time.monotonic() + self.worker_backoff
                self.fail_queued_steps(
                    f"the action worker cannot start: {self.worker_error}; "
                    f"retrying in {self.worker_backoff:.1f} s"
                )
                return
            if step is not None:
                self.reply_error(
                    step,
                    "failed",
                    f"the action crashed its worker process (exit {rc}); a new worker was started",
                )
            self.start_worker()
            return
        self.worker_buf += chunk
        while len(self.worker_buf) >= _LEN.size:
            (n,) = _LEN.unpack(self.worker_buf[: _LEN.size])
            if n > MAX_WORKER_MESSAGE:
                step, self.current_step = self.current_step, None
                self.kill_worker(f"worker message of {n} bytes")
                if step is not None:
                    self.reply_error(step, "failed", "the action worker sent an oversized reply")
                self.start_worker()
                return
            if len(self.worker_buf) < _LEN.size + n:
                return
            message = json.loads(self.worker_buf[_LEN.size : _LEN.size + n])
            del self.worker_buf[: _LEN.size + n]
            self.on_worker_message(message)

    def on_worker_message(self, message: dict[str, Any]) -> None:
        if message.get("ready"):
            self.worker_ready = True
            self.worker_error = None
            self.worker_backoff = 0.0
            log(
                "worker ready",
                pid=message.get("pid"),
                seconds=round(time.monotonic() - self.worker_started_at, 3),
            )
            self.dispatch_step()
            return
        step, self.current_step = self.current_step, None
        if step is None:
            if not message.get("ok"):
                self.worker_error = (message.get("error") or {}).get("message")
                log("worker error outside a step", error=self.worker_error)
            return
        if message.get("ok"):
            header = {
                "ok": True,
                "result": message.get("result", {}),
                "elapsed_s": message.get("elapsed_s"),
            }
            payload = b""
            assert step.request is not None
            spec = step.request.get("screenshot_spec")
            if spec is not None:
                # `fresh` (linux.screen_grab: full): the grab path before the framebuffer/DAMAGE one
                shot = self.screen.grab(spec, fresh=step.request.get("fresh") is True)
                payload = shot.data
                header.update(shot_header(spec, shot))
            self.reply(step, header, payload)
        else:
            err = message.get("error", {})
            self.reply_error(step, err.get("code", "failed"), err.get("message", ""))
        self.dispatch_step()

    # ------------------------------------------------ exec

    def start_exec(self, conn: Conn, request: dict[str, Any]) -> None:
        argv, shell = request.get("argv"), request.get("shell")
        if (argv is None) == (shell is None):
            raise protocol.ProtocolError("invalid_action", "exec: give argv (list) or shell (str)")
        if argv is not None and (
            not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv)
        ):
            raise protocol.ProtocolError("invalid_action", "exec: argv must be a list of strings")
        if shell is not None and not isinstance(shell, str):
            raise protocol.ProtocolError("invalid_action", "exec: shell must be a string")
        env_extra = request.get("env") or {}
        if not isinstance(env_extra, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_extra.items()
        ):
            raise protocol.ProtocolError("invalid_action", "exec: env must map str to str")
        timeout = protocol.check_timeout(request, protocol.DEFAULT_STEP_TIMEOUT_S)
        cwd = request.get("cwd") or os.environ.get("HOME", "/")
        command = ["/bin/sh", "-c", shell] if shell is not None else argv
        detach = request.get("detach", False)
        if not isinstance(detach, bool):
            raise protocol.ProtocolError("invalid_action", "exec: detach must be true or false")
        if detach:
            # Launch an app and answer at once: `setsid -f` forks it off so desktop-init adopts
            # and reaps it, and its output goes nowhere (apps log a lot and run for hours).
            command = ["setsid", "-f", *command]
        out = subprocess.DEVNULL if detach else subprocess.PIPE
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env={**os.environ, **env_extra},
                cwd=cwd,
                start_new_session=True,
                **self.child_creds,
            )
        except OSError as exc:
            code = "failed"
            hint = " (out of processes: pids limit reached?)" if exc.errno == errno.EAGAIN else ""
            raise protocol.ProtocolError(code, f"exec: cannot start: {exc}{hint}") from exc
        pidfd = os.pidfd_open(proc.pid)
        assert timeout is not None
        job = ExecJob(conn, proc, pidfd, time.monotonic() + timeout)
        self.exec_jobs[pidfd] = job
        self.sel.register(pidfd, selectors.EVENT_READ, ("exec_pidfd", pidfd))
        # Output is read as it comes (and dropped past the limit), so a chatty command cannot
        # fill its pipe and stall.
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                os.set_blocking(pipe.fileno(), False)
                self.sel.register(pipe, selectors.EVENT_READ, ("exec_out", pidfd))

    def drain_exec(self, job: ExecJob) -> None:
        """Read what the command wrote so far; past the limit output is read and dropped so a
        chatty command never blocks on a full pipe."""
        for pipe, buf in ((job.proc.stdout, job.out), (job.proc.stderr, job.err)):
            if pipe is None or pipe.closed:
                continue
            while True:
                try:
                    chunk = os.read(pipe.fileno(), 65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    chunk = b""
                if not chunk:  # EOF: stop watching it (it would stay readable forever)
                    try:
                        self.sel.unregister(pipe)
                    except (KeyError, ValueError):
                        pass
                    pipe.close()
                    break
                if len(buf) < EXEC_OUTPUT_LIMIT:
                    buf += chunk[: EXEC_OUTPUT_LIMIT - len(buf)]

    def finish_exec(self, pidfd: int, timed_out: bool = False) -> None:
        job = self.exec_jobs.pop(pidfd, None)
        if job is None:
            return
        rc = job.proc.wait()
        self.drain_exec(job)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        # Background children (`app &`) may hold the pipes open: answer now, do not wait for EOF.
        for pipe in (job.proc.stdout, job.proc.stderr):
            if pipe is not None and not pipe.closed:
                self.sel.unregister(pipe)
                pipe.close()
        out = job.out.decode(errors="replace")
        err = job.err.decode(errors="replace")
        if timed_out:
            self.reply_error(
                job.conn, "timeout", "exec: killed after its timeout", stdout=out, stderr=err
            )
        else:
            self.reply(job.conn, {"ok": True, "rc": rc, "stdout": out, "stderr": err})


def main(argv: list[str] | None = None) -> int:
    sock_path = os.environ.get("DRUMS_AGENT_SOCK", protocol.SOCKET_PATH)
    display = os.environ.get("DISPLAY", ":0")
    package_dir = Path(__file__).resolve().parent
    package = __package__ or "drums_guest"
    # Start the worker the same way in the image (drums_guest) and in a source tree (drumsd.guest).
    bootstrap = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        f"from {package}.worker import main; sys.exit(main())"
    )
    sys_path_root = str(package_dir.parents[len(package.split(".")) - 1])
    worker_argv = [sys.executable, "-I", "-c", bootstrap, sys_path_root]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    agent = Agent(sock_path, display, worker_argv)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
