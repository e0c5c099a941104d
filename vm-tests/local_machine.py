"""A local stand-in for the NixOS test driver's `machine`: commands run on this host, and the unit
`drumsd` is a local process managed the way the NixOS module's systemd unit manages it.

What it honours: succeed, fail, execute, wait_until_succeeds, wait_until_fails, wait_for_unit,
wait_for_open_port, wait_for_closed_port, systemctl (start, stop, restart, kill, is-active,
show -p MainPID --value) for its units, log. Anything else (a VM's console, screenshots of the VM,
reboots, other units) raises `UnsupportedByStandIn`, so a scenario that needs it fails here
instead of passing without having run.

The unit emulation follows nixos-modules/drumsd.nix: ExecStartPre creates the token (umask 077)
if absent; Type=exec; Restart=on-failure with RestartSec; KillMode=process (stop and kill reach
the main process only); TimeoutStopSec then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launching thread exits (Linux prctl)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


V1_CONTROLLERS = ("memory", "cpu", "pids", "freezer")


@dataclass
class UnitCgroup:
    """The unit's own cgroup, as systemd gives a service with Delegate=yes: a child of the
    launcher's cgroup in each hierarchy drumsd uses (v1: memory, cpu, pids, freezer; else v2).
    drumsd nests its slots' groups below its own cgroup, so they are private to this unit: two
    daemons on one host never see (or sweep) each other's slots."""

    dirs: list[Path]

    @classmethod
    def create(cls, name: str) -> UnitCgroup:
        mounts: dict[str, Path] = {}
        unified: Path | None = None
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3].split(",")
            if fstype == "cgroup":
                for option in options:
                    if option in V1_CONTROLLERS:
                        mounts.setdefault(option, Path(fields[4]))
            elif fstype == "cgroup2" and unified is None:
                unified = Path(fields[4])
        own: dict[str, str] = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
        if mounts:
            parents = [mounts[c] / own.get(c, "/").lstrip("/") for c in sorted(mounts)]
        elif unified is not None:
            parents = [unified / own.get("", "/").lstrip("/")]
        else:
            raise UnsupportedByStandIn("no cgroup hierarchy is mounted; Delegate= needs one")
        dirs = [parent / f"{name}.service" for parent in parents]
        for d in dirs:
            d.mkdir(exist_ok=True)
        return cls(dirs)

    def enter(self) -> None:
        """In the child before exec: move this process into the unit's cgroup."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text("0")

    def remove(self) -> list[Path]:
        """Remove the unit's groups bottom-up; returns those still busy (processes left)."""
        busy = []
        for d in self.dirs:
            for sub in [*sorted((p for p in d.rglob("*") if p.is_dir()), reverse=True), d]:
                try:
                    sub.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    busy.append(sub)
        return busy


class UnsupportedByStandIn(NotImplementedError):
    """The scenario asked for something only a NixOS VM can do."""


class CommandFailed(Exception):
    """Mirrors the driver: a succeed() whose command exited non-zero."""


@dataclass
class LocalUnit:
    """One emulated systemd service: a command, a token to ensure, a restart policy."""

    name: str
    argv: Sequence[str]
    token_file: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    restart_sec: float = 2.0
    timeout_stop_s: float = 30.0
    start_limit_burst: int = 5
    # Delegate=yes: run in the unit's own cgroup (see UnitCgroup); needs root.
    delegate: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._wanted = False  # started and not stopped: a failure exit triggers a restart
        self._failed = False
        self._restarts = 0
        self._generation = 0
        self.cgroup: UnitCgroup | None = None

    # -- what systemctl sees

    @property
    def main_pid(self) -> int:
        with self._lock:
            proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else 0

    @property
    def state(self) -> str:
        with self._lock:
            if self._failed:
                return "failed"
            if self._proc is not None and self._proc.poll() is None:
                return "active"
            return "activating" if self._wanted else "inactive"

    # -- effects

    def _ensure_token(self) -> None:
        """ExecStartPre of the module: a random token, 0600 from its first byte, made atomically."""
        if self.token_file is None or self.token_file.exists():
            return
        self.token_file.parent.mkdir(parents=True, exist_ok=True)
        old = os.umask(0o077)
        try:
            tmp = self.token_file.with_name(self.token_file.name + f".{os.getpid()}")
            tmp.write_text(os.urandom(32).hex())
            tmp.rename(self.token_file)
        finally:
            os.umask(old)

    def _launch(self) -> tuple[subprocess.Popen[bytes], int]:
        """ExecStartPre, then the main process. It dies with the thread that launched it
        (PR_SET_PDEATHSIG): a test run killed mid-way leaves no daemon behind."""
        self._ensure_token()
        if self.delegate and self.cgroup is None:
            self.cgroup = UnitCgroup.create(self.name)
        cgroup = self.cgroup

        def prepare_child() -> None:
            _die_with_parent()
            if cgroup is not None:
                cgroup.enter()

        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, **self.env}
        try:
            proc = subprocess.Popen(
                list(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=prepare_child,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        with self._lock:
            self._proc = proc
            self._generation += 1
            return proc, self._generation

    def _watch(self, proc: subprocess.Popen[bytes], generation: int) -> None:
        """Restart=on-failure: a signal or non-zero exit of a wanted unit restarts it. The
        restarted process is launched from this thread, which then lives as long as it does."""
        while True:
            code = proc.wait()
            with self._lock:
                if generation != self._generation or not self._wanted:
                    return
                if code == 0:
                    self._wanted = False
                    return
                self._restarts += 1
                if self._restarts > self.start_limit_burst:
                    self._failed = True
                    self._wanted = False
                    return
            time.sleep(self.restart_sec)
            with self._lock:
                if generation != self._generation or not self._wanted:
                    return
            proc, generation = self._launch()

    def start(self) -> None:
        if self.main_pid:
            return
        with self._lock:
            self._wanted = True
            self._failed = False
            self._restarts = 0
        proc, generation = self._launch()
        threading.Thread(
            target=self._watch, args=(proc, generation), name=f"unit-{self.name}", daemon=True
        ).start()

    def stop(self) -> None:
        with self._lock:
            self._wanted = False
            proc = self._proc
            self._generation += 1  # the watcher of the old process must not restart it
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # KillMode=process: the main process only
        try:
            proc.wait(timeout=self.timeout_stop_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def kill(self, sig: int) -> None:
        pid = self.main_pid
        if pid:
            os.kill(pid, sig)

    def power_off(self, timeout_s: float = 10.0) -> list[Path]:
        """What a VM's shutdown does to the unit: stop it, kill whatever is left in its cgroup
        (slots KillMode=process kept), remove the cgroup. Returns groups still busy."""
        self.stop()
        if self.cgroup is None:
            return []
        deadline = time.monotonic() + timeout_s
        while True:
            pids = {
                int(pid)
                for d in self.cgroup.dirs
                for procs in d.rglob("cgroup.procs")
                for pid in procs.read_text().split()
            }
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        return self.cgroup.remove()


class LocalMachine:
    """Runs a scenario's commands on this host; see the module docstring for what it honours."""

    def __init__(self, units: Sequence[LocalUnit], name: str = "local") -> None:
        self.name = name
        self.units = {u.name: u for u in units}

    # -- commands

    def execute(
        self,
        command: str,
        check_return: bool = True,
        check_output: bool = True,
        timeout: int | None = 900,
    ) -> tuple[int, str]:
        if command.lstrip().startswith("systemctl "):
            return self.systemctl(command.split(None, 1)[1])
        # The NixOS test driver runs every command under these shell options: so does this.
        proc = subprocess.run(
            ["bash", "-c", f"set -euo pipefail; {command}"],
            stdout=subprocess.PIPE,
            stderr=None,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        out = proc.stdout.decode(errors="replace") if check_output else ""
        return proc.returncode, out

    def succeed(self, *commands: str, timeout: int | None = None) -> str:
        output = ""
        for command in commands:
            status, out = self.execute(command, timeout=timeout)
            if status != 0:
                raise CommandFailed(f"command `{command}` failed (exit code {status})")
            output += out
        return output

    def fail(self, *commands: str, timeout: int | None = None) -> str:
        output = ""
        for command in commands:
            status, out = self.execute(command, timeout=timeout)
            if status == 0:
                raise CommandFailed(f"command `{command}` unexpectedly succeeded")
            output += out
        return output

    def _poll(self, what: str, attempt, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            done, value = attempt()
            if done:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: timed out after {timeout}s waiting for {what}")
            time.sleep(0.2)

    def wait_until_succeeds(self, command: str, timeout: int = 900) -> str:
        def attempt() -> tuple[bool, str]:
            status, out = self.execute(command)
            return status == 0, out

        return self._poll(f"`{command}` to succeed", attempt, timeout)

    def wait_until_fails(self, command: str, timeout: int = 900) -> str:
        def attempt() -> tuple[bool, str]:
            status, out = self.execute(command)
            return status != 0, out

        return self._poll(f"`{command}` to fail", attempt, timeout)

    def wait_for_unit(self, unit: str, user: str | None = None, timeout: int = 900) -> None:
        if user is not None:
            raise UnsupportedByStandIn("user units need a NixOS VM")
        managed = self._unit(unit)

        def attempt() -> tuple[bool, str]:
            state = managed.state
            if state == "failed":
                raise CommandFailed(f"unit {unit} reached state failed (see its log)")
            if state == "inactive":
                raise CommandFailed(f"unit {unit} is inactive and will not start by itself")
            return state == "active", ""

        self._poll(f"unit {unit}", attempt, timeout)

    def wait_for_open_port(self, port: int, addr: str = "localhost", timeout: int = 900) -> None:
        def attempt() -> tuple[bool, str]:
            with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as sock:
                sock.settimeout(1)
                return sock.connect_ex((addr, port)) == 0, ""

        self._poll(f"port {addr}:{port} to open", attempt, timeout)

    def wait_for_closed_port(self, port: int, addr: str = "localhost", timeout: int = 900) -> None:
        def attempt() -> tuple[bool, str]:
            with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as sock:
                sock.settimeout(1)
                return sock.connect_ex((addr, port)) != 0, ""

        self._poll(f"port {addr}:{port} to close", attempt, timeout)

    # -- systemctl

    def _unit(self, unit: str) -> LocalUnit:
        name = unit.removesuffix(".service")
        if name not in self.units:
            raise UnsupportedByStandIn(
                f"unit {unit!r} is not emulated here (only {sorted(self.units)}); run the VM test"
            )
        return self.units[name]

    def systemctl(self, q: str, user: str | None = None) -> tuple[int, str]:
        if user is not None:
            raise UnsupportedByStandIn("systemctl --user needs a NixOS VM")
        words = shlex.split(q)
        if not words:
            raise UnsupportedByStandIn("empty systemctl command")
        verb, args = words[0], words[1:]
        flags = [a for a in args if a.startswith("-")]
        names = [a for a in args if not a.startswith("-")]
        if verb in ("start", "stop", "restart") and not flags and len(names) == 1:
            unit = self._unit(names[0])
            if verb in ("stop", "restart"):
                unit.stop()
            if verb in ("start", "restart"):
                unit.start()
            return 0, ""
        if verb == "is-active" and not flags and len(names) == 1:
            state = self._unit(names[0]).state
            return (0 if state == "active" else 3), state + "\n"
        if verb == "show" and args[:3] == ["-p", "MainPID", "--value"] and len(args) == 4:
            return 0, f"{self._unit(args[3]).main_pid}\n"
        if verb == "kill" and len(names) == 1:
            return self._kill(self._unit(names[0]), flags)
        raise UnsupportedByStandIn(f"systemctl {q!r} is not emulated by the local stand-in")

    def _kill(self, unit: LocalUnit, flags: list[str]) -> tuple[int, str]:
        sig = signal.SIGTERM
        whom = "all"
        for flag in flags:
            key, _, value = flag.partition("=")
            if key in ("--signal", "-s"):
                sig = signal.Signals[value if value.startswith("SIG") else "SIG" + value]
            elif key in ("--kill-whom", "--kill-who"):
                whom = value
            else:
                raise UnsupportedByStandIn(f"systemctl kill flag {flag!r} is not emulated")
        if whom != "main":
            # systemd would signal every process of the cgroup, slots included; not emulated.
            raise UnsupportedByStandIn("systemctl kill without --kill-whom=main is not emulated")
        unit.kill(sig)
        return 0, ""

    # -- the rest of the driver's Machine

    def log(self, message: str) -> None:
        print(f"[{self.name}] {message}", flush=True)

    @contextlib.contextmanager
    def nested(self, message: str) -> Iterator[None]:
        self.log(message)
        yield

    def start(self) -> None:
        """The VM is "booted": start every unit (multi-user.target's wants)."""
        for unit in self.units.values():
            unit.start()

    def shutdown(self) -> None:
        for unit in self.units.values():
            busy = unit.power_off()
            if busy:
                self.log(f"unit {unit.name}: cgroups still busy after power-off: {busy}")

    def __getattr__(self, name: str):
        # Only reached for names not defined above: crash, reboot, screenshot, send_key, ...
        if name.startswith("__"):
            raise AttributeError(name)
        raise UnsupportedByStandIn(
            f"machine.{name} is not available on the local stand-in; run the NixOS VM test"
        )
