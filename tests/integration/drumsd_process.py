"""Run `drumsd` as a real process (in-memory runtime) on a free loopback port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import httpx
from harness import memory_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_token(path: Path, token: str = "k" * 40, mode: int = 0o600) -> str:
    path.write_text(token + "\n")
    path.chmod(mode)
    return token


def base_config(tmp: Path, port: int, **overrides) -> dict:
    config = memory_config(
        tmp,
        listen=f"127.0.0.1:{port}",
        drain_timeout_s=5,
        admission={"min_available_mib": 0, "min_available_pct": 0, "min_state_free_mib": 0},
    )
    config.update(overrides)
    return config


def drumsd(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "drumsd.cli", *args],
        env={**os.environ, **(env or {})},
        **kw,
    )


def run_drumsd(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "drumsd.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class Daemon:
    dir: Path
    config_path: Path
    token: str
    url: str
    env: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    stopped: bool = False
    # Every daemon this process started: a failing test's report names those that exited on
    # their own (the root conftest), so "Connection refused" in CI comes with the cause.
    started: ClassVar[list[Daemon]] = []

    def start(self, limit_s: float = 30) -> Daemon:
        self.log_path = self.dir / f"drumsd-{time.monotonic_ns()}.log"
        self.stopped = False
        Daemon.started.append(self)
        log = open(self.log_path, "wb")
        self.proc = drumsd(
            "serve",
            "--config",
            str(self.config_path),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"drumsd exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        log = self.log()
        try:
            self.stop()  # a daemon that did not answer in time is not left running
        except subprocess.TimeoutExpired:
            pass  # stop() killed it
        raise AssertionError(f"drumsd did not answer in {limit_s}s:\n{log}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30, **kw
        )

    def died(self) -> bool:
        """Exited without a stop or kill from the test."""
        return not self.stopped and self.proc is not None and self.proc.poll() is not None

    def kill9(self) -> None:
        assert self.proc is not None
        self.stopped = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, limit_s: float = 20) -> int:
        if self.died():
            keep_log(self)
        self.stopped = True
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def keep_log(daemon: Daemon) -> Path | None:
    """Copy the log of a daemon that exited on its own where a test's cleanup does not remove
    it ($DRUMS_TEST_LOGS, default /var/tmp/drums-test-logs)."""
    if daemon.log_path is None or not daemon.log_path.exists():
        return None
    into = Path(os.environ.get("DRUMS_TEST_LOGS", "/var/tmp/drums-test-logs"))
    into.mkdir(parents=True, exist_ok=True)
    kept = into / f"{daemon.dir.name}-{daemon.log_path.name}"
    kept.write_bytes(daemon.log_path.read_bytes())
    return kept


def make_daemon(tmp: Path, env: dict | None = None, **overrides) -> Daemon:
    port = free_port()
    token = write_token(tmp / "token")
    config_path = tmp / "drumsd.json"
    config_path.write_text(json.dumps(base_config(tmp, port, **overrides)))
    return Daemon(tmp, config_path, token, f"http://127.0.0.1:{port}", env=env or {})
