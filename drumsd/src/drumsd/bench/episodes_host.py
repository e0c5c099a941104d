"""`drumsd bench episodes`, the host side: a daemon of one path (`drumsd serve` in a cpuacct
group of its own, so every process it starts is charged to it), the host's busy time from
/proc/stat and its background rate, and the config merge of a path's overrides."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drumsd.bench.common import (
    BenchError,
    clear_leftovers,
    held_bench_locks,
    mount_state_tmpfs,
)
from drumsd.bench.episode_options import EpisodeBenchOptions

TICK = os.sysconf("SC_CLK_TCK")


def host_busy_s(stat: str | None = None) -> float:
    """CPU-seconds the whole host has been busy (all CPUs: user, nice, system, irq, softirq,
    steal; idle and iowait left out), from /proc/stat's first line (`stat`: that file's text)."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    fields = [int(v) for v in text.split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


class CpuAccount:
    """A cgroup v1 cpuacct group that a daemon (or this process) and everything it starts stay
    in: drumsd moves slots into its own cpu, memory, freezer ... groups but not cpuacct, and CRIU
    restores with --manage-cgroups=ignore, so the desktops, their setup commands and the
    checkers are charged here, exited ones included. Other load on the host is not."""

    def __init__(self, name: str) -> None:
        self.dir: Path | None = None
        root = _cpuacct_root()
        if root is not None:
            self.dir = root / f"drums-bench-{name}-{os.getpid()}"
            self.dir.mkdir(exist_ok=True)

    def join(self, pid: int = 0) -> None:
        """Move `pid` (0: the calling process) into the group; safe in a preexec_fn."""
        if self.dir is not None:
            (self.dir / "cgroup.procs").write_text(str(pid or os.getpid()))

    def leave(self, pid: int = 0) -> None:
        if self.dir is not None:
            (self.dir.parent / "cgroup.procs").write_text(str(pid or os.getpid()))

    def usage_s(self) -> float | None:
        if self.dir is None:
            return None
        return int((self.dir / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        if self.dir is not None:
            try:
                self.dir.rmdir()
            except OSError:
                pass  # still holds a straggler; an empty group costs nothing


def _cpuacct_root() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and "cpuacct" in parts[3].split(","):
            return Path(parts[1])
    return None


def background_rate(seconds: float) -> float:
    """Host CPU-seconds per second while this bench does nothing (other load, idle daemons)."""
    if seconds <= 0:
        return 0.0
    b0, t0 = host_busy_s(), time.monotonic()
    time.sleep(seconds)
    return (host_busy_s() - b0) / (time.monotonic() - t0)


# The daemon's own account at rest: its loop and the parked spares (frozen) use next to nothing.
SETTLE_RATE = 0.05  # cores
SETTLE_WINDOW_S = 1.0
SETTLE_LIMIT_S = 60.0


def settle(cpu_s: Callable[[], float | None], limit_s: float = SETTLE_LIMIT_S) -> dict[str, float]:
    """Wait until the account `cpu_s` reads uses under SETTLE_RATE cores over a SETTLE_WINDOW_S
    window (what earlier episodes left behind is done: warm spares refilled, a new task
    checkpoint's probe), at most `limit_s`. The seconds waited and, over the last window, the
    account's rate and the host's (the rates at rest); no wait without an account."""
    t0 = time.monotonic()
    last, host = cpu_s(), host_busy_s()
    out = {"waited_s": 0.0, "rest_rate": 0.0, "host_rest_rate": 0.0}
    while last is not None:
        time.sleep(SETTLE_WINDOW_S)
        now, host_now = cpu_s(), host_busy_s()
        if now is None:
            break
        out["rest_rate"] = round((now - last) / SETTLE_WINDOW_S, 4)
        out["host_rest_rate"] = round((host_now - host) / SETTLE_WINDOW_S, 4)
        last, host = now, host_now
        out["waited_s"] = round(time.monotonic() - t0, 2)
        if out["rest_rate"] < SETTLE_RATE or out["waited_s"] >= limit_s:
            break
    return out


def merge_config(base: dict[str, Any], *overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with each override applied; a dict value merges into the block of the same name."""
    out = json.loads(json.dumps(base))
    for override in overrides:
        for key, value in override.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge_config(out[key], value)
            else:
                out[key] = value
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class BenchDaemon:
    """`drumsd serve` in a directory of its own, its state_dir a tmpfs as a deployment's is
    (`state_tmpfs`; else on the state root's filesystem)."""

    name: str
    dir: Path
    config: dict[str, Any]
    url: str = ""
    token: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=Path)
    account: CpuAccount | None = None
    state_tmpfs: bool = True
    state_fs: str = ""  # the fs type the daemon's state_dir was on (for the results)

    @classmethod
    def configure(
        cls, name: str, opts: EpisodeBenchOptions, overrides: dict[str, Any]
    ) -> BenchDaemon:
        d = opts.state_root / name
        clear_leftovers(d)  # a crashed run's tmpfs (the root's bench lock is held)
        shutil.rmtree(d, ignore_errors=True)
        (d / "state").mkdir(parents=True, mode=0o755)
        d.chmod(0o755)
        (d / "state").chmod(0o755)
        token = secrets.token_hex(24)
        token_file = d / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        port = _free_port()
        base = {
            "listen": f"127.0.0.1:{port}",
            "token_file": str(token_file),
            "state_dir": str(d / "state"),
            "journal_dir": str(d / "journal"),
            "forgotten_dir": str(d / "forgotten"),
            "images_dir": str(opts.cache_root / "images"),
            "default_image": opts.image,
            "criu": str(opts.criu),
            "alive_after_s": opts.alive_after_s,
            "tasks": {"dirs": [str(opts.tasks_dir.resolve())]},
            # The bench sizes its own load; admission keeps only a floor that fits a small host.
            "admission": {
                "min_available_mib": 1024,
                "min_available_pct": 2,
                "min_state_free_mib": 256,
            },
        }
        config = merge_config(base, overrides)
        return cls(
            name,
            d,
            config,
            f"http://127.0.0.1:{port}",
            token,
            log_path=d / "drumsd.log",
            state_tmpfs=opts.state_tmpfs,
        )

    def start(self, template_limit_s: float = 300.0) -> float:
        """Start it and wait for the image's template checkpoint; returns the seconds taken."""
        import httpx

        from drumsd.linux import mounts

        config_path = self.dir / "drumsd.json"
        config_path.write_text(json.dumps(self.config, indent=1))
        state = Path(self.config["state_dir"])
        if self.state_tmpfs:  # unmounted by stop(), with the runtime's mounts under the dir
            mount_state_tmpfs(state, "drumsd's state_dir")
        self.state_fs = mounts.fs_type_of(state)
        t0 = time.monotonic()
        self.account = CpuAccount(self.name)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "drumsd.cli", "serve", "--config", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=self.account.join,  # before exec: nothing it starts escapes
                # The run's bench lock, held while the daemon lives: a run that dies leaves
                # its daemon's dirs alone until the daemon is gone too.
                pass_fds=held_bench_locks(),
            )
        deadline = t0 + template_limit_s
        image = self.config["default_image"]
        headers = {"Authorization": f"Bearer {self.token}"}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(
                    f"drumsd ({self.name}) exited {self.proc.returncode} before its template "
                    f"was ready; its log {self.log_path} ends:\n{self.log_tail()}"
                )
            try:
                body = httpx.get(self.url + "/v1/checkpoints", headers=headers, timeout=2).json()
                if any(
                    cp.get("kind") == "template" and cp.get("image") == image
                    for cp in body.get("checkpoints", [])
                ):
                    return time.monotonic() - t0
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.25)
        raise BenchError(
            f"drumsd ({self.name}) had no template of image {image!r} within "
            f"{template_limit_s:.0f} s; its log {self.log_path} ends:\n{self.log_tail()}"
        )

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def cpu_s(self) -> float | None:
        """CPU of the daemon, its slots, their setup and its checkers so far (None: no cgroup
        v1 cpuacct on this host)."""
        return self.account.usage_s() if self.account is not None else None

    def stop(self, keep_logs: bool) -> None:
        """Destroy what is left, stop the daemon (SIGTERM, then SIGKILL after 60 s), unmount
        what its runtime keeps mounted under its state dir, remove the dir."""
        import httpx

        from drumsd.linux import mounts

        if self.proc is not None and self.proc.poll() is None:
            try:
                headers = {"Authorization": f"Bearer {self.token}"}
                with httpx.Client(base_url=self.url, headers=headers, timeout=60) as http:
                    for slot in http.get("/v1/slots").json().get("slots", []):
                        http.delete(f"/v1/slots/{slot['id']}")
            except (httpx.HTTPError, ValueError):
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for target in sorted(mounts.mounts_under(self.dir), reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)
        if self.account is not None:
            self.account.remove()
        if keep_logs:
            shutil.rmtree(self.dir / "state", ignore_errors=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
