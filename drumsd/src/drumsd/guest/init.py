"""desktop-init: pid 1 of a slot. Starts the desktop session as the desktop user, then reaps.

Run as root after the runtime's stage 1 (pivot_root, /dev, /proc). It starts, as uid 1000 with
HOME=/home/user and DISPLAY=:0: Xvfb, a session D-Bus, the image's session (session.py: openbox
and an xterm by default), any `--app` commands and the guest agent; writes /run/drums/ready once
the agent answers; then reaps every orphan and restarts the agent if it dies. Outside a pid
namespace it makes itself a child subreaper instead.

As root it locks every process it starts (seccomp.py: no_new_privs, empty bounding set, the
filter) and, once the session runs, itself (keeping only seccomp.INIT_KEEPS). It binds the agent's
socket itself in the root-owned /run/drums and hands the listening fd to the agent, so the desktop
user can neither replace the socket nor listen in the agent's place. The agent runs as the slot's
root (seccomp.AGENT_KEEPS, not dumpable), never as the desktop user: memory, descriptors and
signals of another uid are out of the desktop user's reach.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pwd
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import protocol, seccomp, session

PR_SET_CHILD_SUBREAPER = 36
SCREEN = f"{protocol.SCREEN_WIDTH}x{protocol.SCREEN_HEIGHT}x24"


def _xauth_entry(family: int, address: bytes, number: bytes, name: bytes, data: bytes) -> bytes:
    fields = (address, number, name, data)
    return struct.pack(">H", family) + b"".join(struct.pack(">H", len(f)) + f for f in fields)


# FamilyWild, display 65535: never matches, so clients connect without auth as Xvfb allows.
UNMATCHED_XAUTH_ENTRY = _xauth_entry(0xFFFF, b"", b"65535", b"MIT-MAGIC-COOKIE-1", bytes(16))


def log(message: str, **fields: Any) -> None:
    record = {"t": round(time.time(), 3), "component": "desktop-init", "msg": message, **fields}
    print(json.dumps(record), file=sys.stderr, flush=True)


def wait_for_socket(path: str, deadline: float, ping: bool = False) -> bool:
    """Poll until a unix socket accepts (and, for the agent, answers a ping) or time runs out."""
    while time.monotonic() < deadline:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                s.connect(path)
                if not ping:
                    return True
                s.sendall(protocol.encode_request({"op": "ping"}))
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
                header, _ = protocol.split_reply(data)
                if header.get("ok"):
                    return True
        except (OSError, protocol.ProtocolError):
            pass
        time.sleep(0.01)
    return False


class _Forked:
    """What reap() and shutdown() need of a child started with fork alone (the agent)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None


class DesktopInit:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pw = pwd.getpwnam(args.user)
        self.as_root = os.geteuid() == 0
        self.run_dir = Path(args.run_dir)
        self.log_dir = self.run_dir / "log"
        self.children: dict[int, tuple[str, subprocess.Popen | _Forked]] = {}
        self.agent_pid: int | None = None
        self.agent_restarts = 0
        self.next_agent_start = 0.0
        self.stopping = False
        self.lock = seccomp.Lock() if self.as_root else None
        self.listener: socket.socket | None = None
        uid = self.pw.pw_uid
        runtime_dir = f"/run/user/{uid}"
        self.env = {
            "HOME": self.pw.pw_dir,
            "USER": self.pw.pw_name,
            "LOGNAME": self.pw.pw_name,
            "SHELL": self.pw.pw_shell or "/bin/sh",
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games",
            "DISPLAY": args.display,
            "LANG": "C.UTF-8",
            "XDG_RUNTIME_DIR": runtime_dir,
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime_dir}/bus",
            "DRUMS_AGENT_SOCK": str(self.run_dir / "agent.sock"),
            # Xvfb runs without -auth (it is reachable only inside the slot). python-xlib still
            # reads an authority file and prints a warning into every client's stdout when it has
            # no entry, so the file holds one entry that matches no display.
            "XAUTHORITY": str(self.run_dir / "Xauthority"),
        }
        self.session = session.read_session(args.session_file)
        self.env = session.apply_env(self.env, self.session)

    # ------------------------------------------------ setup

    def prepare_dirs(self) -> None:
        uid, gid = self.pw.pw_uid, self.pw.pw_gid
        # run_dir and log_dir are root's: the desktop user must not swap the agent's socket, the
        # ready marker or a log file (opened by root here) for a link.
        for path, mode, owner in (
            (self.run_dir, 0o755, (0, 0)),
            (self.log_dir, 0o755, (0, 0)),
            (Path("/tmp/.X11-unix"), 0o1777, (0, 0)),
            (Path(self.env["XDG_RUNTIME_DIR"]), 0o700, (uid, gid)),
        ):
            path.mkdir(parents=True, exist_ok=True)
            if self.as_root:
                os.chown(path, *owner, follow_symlinks=False)
            path.chmod(mode)
        (self.run_dir / "ready").unlink(missing_ok=True)
        xauth = Path(self.env["XAUTHORITY"])
        xauth.unlink(missing_ok=True)
        xauth.write_bytes(UNMATCHED_XAUTH_ENTRY)
        if self.as_root:
            os.chown(xauth, uid, gid)

    def bind_agent_socket(self) -> None:
        """Bind the agent's listening socket (root-owned, 0600) for the agent to inherit."""
        path = self.env["DRUMS_AGENT_SOCK"]
        Path(path).unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
        self.listener = listener

    def spawn(
        self, name: str, argv: list[str], pass_fds: tuple[int, ...] = (), **env: str
    ) -> int | None:
        """Start one session process as the desktop user, locked, its output in the log dir."""
        logfile = open(self.log_dir / f"{name}.log", "ab")
        creds: dict[str, Any] = {}
        if self.lock is not None:
            # The lock needs root (CAP_SETPCAP) before the uid change, so the child does both.
            lock, uid, gid = self.lock, self.pw.pw_uid, self.pw.pw_gid
            creds = {"preexec_fn": lambda: lock.lock_child(uid, gid)}
        try:
            proc = subprocess.Popen(
                argv,
                env={**self.env, **env},
                pass_fds=pass_fds,
                cwd=self.pw.pw_dir,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **creds,
            )
        except OSError as exc:
            log("cannot start", name=name, argv=argv, error=str(exc))
            return None
        finally:
            logfile.close()
        self.children[proc.pid] = (name, proc)
        log("started", name=name, pid=proc.pid)
        return proc.pid

    def start(self) -> None:
        started = time.monotonic()
        self.prepare_dirs()
        display_no = self.args.display.lstrip(":").split(".")[0]
        # -noreset: the server must not reset when its last client leaves (the agent's
        # screenshot connections come and go). -shmem: the framebuffer is a SysV segment the
        # agent reads screenshots from in place (framebuffer.py), no GetImage through the socket.
        # -nocursor: Xvfb would draw the pointer into that framebuffer (GetImage hides it, and
        # X DAMAGE does not report it), so screenshots stay as they were: without the pointer.
        xvfb = [
            "Xvfb",
            self.args.display,
            "-screen",
            "0",
            SCREEN,
            "-nolisten",
            "tcp",
            "-dpi",
            "96",
            "-noreset",
            "-shmem",
            "-nocursor",
        ]
        self.spawn("xvfb", xvfb)
        if not wait_for_socket(f"/tmp/.X11-unix/X{display_no}", time.monotonic() + 15):
            log("X server did not come up in 15 s; see xvfb.log", log=str(self.log_dir))
        x_at = time.monotonic() - started
        self.spawn(
            "dbus",
            [
                "dbus-daemon",
                "--session",
                "--nofork",
                "--nopidfile",
                f"--address={self.env['DBUS_SESSION_BUS_ADDRESS']}",
            ],
        )
        for name, argv in self.session.programs:
            self.spawn(name, list(argv))
        # The same printer resources in the server's resource database: every xterm started
        # later (by a task's setup, a key binding, a shell) prints its text for the daemon too.
        merge = 'printf "%s\\n" "$@" | xrdb -nocpp -merge'
        self.spawn("xrdb", ["sh", "-c", merge, "xrdb", *protocol.XTERM_PRINTER_RESOURCES])
        if self.session.xterm and not self.args.no_xterm:
            # An Xft font: the image has no bitmap fonts (xterm's default "fixed"). The printer
            # resources let the daemon read its text (OSWorld's terminal observation).
            printer = [a for r in protocol.XTERM_PRINTER_RESOURCES for a in ("-xrm", r)]
            self.spawn(
                "xterm",
                ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-geometry", "100x30+40+40",
                 *printer],
            )  # fmt: skip
        for i, app in enumerate(self.args.app):
            self.spawn(f"app{i}", ["/bin/sh", "-c", app])
        self.start_agent()
        self.lock_self()
        agent_ok = wait_for_socket(self.env["DRUMS_AGENT_SOCK"], time.monotonic() + 20, ping=True)
        ready = {
            "pid": os.getpid(),
            "display": self.args.display,
            "agent": self.env["DRUMS_AGENT_SOCK"],
            "agent_ok": agent_ok,
            "x_s": round(x_at, 3),
            "ready_s": round(time.monotonic() - started, 3),
            "t": time.time(),
        }
        tmp = self.run_dir / ".ready.tmp"
        tmp.write_text(json.dumps(ready) + "\n")
        os.replace(tmp, self.run_dir / "ready")
        log("ready" if agent_ok else "agent did not answer in 20 s", **ready)

    def lock_self(self) -> None:
        if self.lock is None:
            return
        try:
            self.lock.lock_self()
        except OSError as exc:  # the lock_applied gate reports it; the slot still serves
            log("cannot lock desktop-init", error=str(exc))

    def start_agent(self) -> None:
        if self.listener is None:
            self.bind_agent_socket()
        assert self.listener is not None
        self.agent_pid = self.fork_agent(self.listener.fileno())
        if self.agent_pid is None:
            self.next_agent_start = time.monotonic() + 1.0

    def fork_agent(self, listen_fd: int) -> int | None:
        """Start the agent as a fork of this process that stays the slot's root.

        Not the desktop user: /proc/<pid>/mem, pidfd_getfd and signals are granted by uid, so
        an agent of uid 1000 is the desktop user's to rewrite (issue 14). It keeps only
        seccomp.AGENT_KEEPS (to run steps and commands as the desktop user, and kill them), is
        not dumpable, and does not exec: a root exec under an empty bounding set would drop
        those capabilities (see seccomp.Lock.lock_self)."""
        logfd = os.open(
            self.log_dir / "agent.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(logfd)
            log("cannot start", name="agent", error=str(exc))
            return None
        if pid == 0:  # the agent; never returns
            code = 1
            try:
                os.setsid()
                nullfd = os.open(os.devnull, os.O_RDONLY)
                os.dup2(nullfd, 0)
                os.dup2(logfd, 1)
                os.dup2(logfd, 2)
                for name in os.listdir("/proc/self/fd"):
                    if int(name) > 2 and int(name) != listen_fd:
                        try:
                            os.close(int(name))
                        except OSError:
                            pass
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                if self.lock is not None:
                    self.lock.lock_self(seccomp.AGENT_KEEPS)
                seccomp.set_not_dumpable()
                os.environ.clear()
                os.environ.update(self.env, DRUMS_AGENT_FD=str(listen_fd))
                os.chdir(self.pw.pw_dir)
                from . import agent

                code = agent.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0
            except BaseException as exc:  # nothing of desktop-init's may run on in the child
                log("agent failed", error=repr(exc))
            finally:
                os._exit(code or 0)
        os.close(logfd)
        self.children[pid] = ("agent", _Forked(pid))
        log("started", name="agent", pid=pid)
        return pid

    # ------------------------------------------------ reaping

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            entry = self.children.pop(pid, None)
            if entry is None:
                continue  # an orphan re-parented to us
            name, proc = entry
            proc.returncode = os.waitstatus_to_exitcode(status)
            log("exited", name=name, pid=pid, rc=proc.returncode)
            if pid == self.agent_pid and not self.stopping:
                self.agent_pid = None
                self.agent_restarts += 1
                backoff = min(5.0, 0.2 * 2 ** min(self.agent_restarts, 5))
                self.next_agent_start = time.monotonic() + backoff

    def serve(self) -> int:
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        if os.getpid() != 1:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.start()
        while not self.stopping:
            timeout = None
            if self.agent_pid is None:
                timeout = max(0.0, self.next_agent_start - time.monotonic())
            try:
                select.select([rfd], [], [], timeout)
                os.read(rfd, 4096)
            except (BlockingIOError, InterruptedError):
                pass
            self.reap()
            if (
                self.agent_pid is None
                and not self.stopping
                and time.monotonic() >= self.next_agent_start
            ):
                self.start_agent()
        return self.shutdown()

    def on_term(self, *_: Any) -> None:
        self.stopping = True

    def shutdown(self) -> int:
        log("stopping", children=len(self.children))
        for _name, proc in list(self.children.values()):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        for _name, proc in list(self.children.values()):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.reap()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="desktop-init", description=__doc__)
    parser.add_argument("--user", default="user")
    parser.add_argument("--display", default=":0")
    parser.add_argument("--run-dir", default=str(Path(protocol.SOCKET_PATH).parent))
    parser.add_argument(
        "--app",
        action="append",
        default=[],
        help="shell command to start in the session (repeatable)",
    )
    parser.add_argument("--no-xterm", action="store_true")
    parser.add_argument("--session-file", default=session.SESSION_FILE)
    parser.add_argument("--no-cursor", action="store_true", help="always on; kept for callers")
    return DesktopInit(parser.parse_args(argv)).serve()
