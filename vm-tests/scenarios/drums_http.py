"""The drums API as seen from a NixOS test `machine`: every request is a curl run on the machine.

Scenarios talk to drumsd only through `machine.succeed(...)`, so the same code drives a NixOS VM
(the test driver's Machine) and a local daemon (vm-tests/local_machine.py's stand-in).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol


class MachineLike(Protocol):
    """The subset of the NixOS test driver's Machine that scenarios use."""

    def succeed(self, *commands: str, timeout: int | None = None) -> str: ...
    def fail(self, *commands: str, timeout: int | None = None) -> str: ...
    def execute(
        self,
        command: str,
        check_return: bool = True,
        check_output: bool = True,
        timeout: int | None = 900,
    ) -> tuple[int, str]: ...
    def wait_until_succeeds(self, command: str, timeout: int = 900) -> str: ...
    def wait_for_unit(self, unit: str, user: str | None = None, timeout: int = 900) -> None: ...
    def wait_for_open_port(
        self, port: int, addr: str = "localhost", timeout: int = 900
    ) -> None: ...
    def systemctl(self, q: str, user: str | None = None) -> tuple[int, str]: ...


Subtest = Callable[[str], contextlib.AbstractContextManager[Any]]


@contextlib.contextmanager
def plain_subtest(name: str) -> Iterator[None]:
    """A stand-in for the driver's `subtest` that names the failing block."""
    print(f"subtest: {name}", flush=True)
    try:
        yield
    except Exception as exc:
        raise AssertionError(f"subtest {name!r} failed: {exc}") from exc


@dataclass(frozen=True)
class Target:
    """Where the daemon under test is: NixOS module defaults unless told otherwise."""

    base_url: str = "http://127.0.0.1:7070"
    token_file: str = "/var/lib/drums/token"
    state_dir: str = "/run/drums"
    journal_dir: str = "/var/lib/drums/journal"
    config_path: str | None = None
    unit: str = "drumsd"

    @property
    def host(self) -> str:
        return self.base_url.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1].split("/", 1)[0])


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any
    raw: str

    @property
    def error_code(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return self.body["error"].get("code")
        return None


@dataclass(frozen=True)
class Screenshot:
    status: int
    sha256: str
    size: int
    is_png: bool


class ScenarioFailure(AssertionError):
    """A scenario's expectation did not hold; the message says what was seen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ScenarioFailure(message)


class DrumsHttp:
    """Requests against the daemon of `target`, made with curl on `machine`."""

    def __init__(self, machine: MachineLike, target: Target) -> None:
        self.machine = machine
        self.target = target

    def _auth(self, token: bool | str) -> str:
        if token is True:
            return f'-H "Authorization: Bearer $(cat {shlex.quote(self.target.token_file)})"'
        if isinstance(token, str):
            return "-H " + shlex.quote(f"Authorization: Bearer {token}")
        return ""

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: bool | str = True,
        max_time_s: int = 300,
    ) -> Reply:
        data = ""
        if body is not None:
            data = "-H 'Content-Type: application/json' --data-binary " + shlex.quote(
                json.dumps(body)
            )
        url = shlex.quote(self.target.base_url + path)
        command = (
            f"curl -sS --max-time {max_time_s} -X {method} {self._auth(token)} {data} "
            f"-w '\\n%{{http_code}}' {url}"
        )
        out = self.machine.succeed(command)
        text, _, code = out.rstrip("\n").rpartition("\n")
        try:
            status = int(code.strip())
        except ValueError:
            raise ScenarioFailure(
                f"{method} {path}: no HTTP status in curl output {out!r}"
            ) from None
        try:
            parsed = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            parsed = None
        return Reply(status, parsed, text)

    def ok(self, method: str, path: str, body: Any = None, max_time_s: int = 300) -> Any:
        reply = self.request(method, path, body, max_time_s=max_time_s)
        check(
            200 <= reply.status < 300,
            f"{method} {path} answered {reply.status}, expected 2xx: {reply.raw[:2000]}",
        )
        return reply.body

    def screenshot(self, slot: str) -> Screenshot:
        url = shlex.quote(f"{self.target.base_url}/v1/slots/{slot}/screenshot")
        out = self.machine.succeed(
            'f="$(mktemp)"; '
            f'code="$(curl -sS --max-time 120 {self._auth(True)} -o "$f" '
            f'-w "%{{http_code}}" {url})"; '
            'echo "$code $(sha256sum < "$f" | cut -d" " -f1) $(stat -c %s "$f") '
            '$(head -c 8 "$f" | od -An -tx1 | tr -d " \\n")"; rm -f "$f"'
        )
        code, sha, size, magic = out.split()
        return Screenshot(int(code), sha, int(size), magic == "89504e470d0a1a0a")

    def create_slot(
        self, body: dict[str, Any] | None = None, timeout_s: float = 300.0
    ) -> dict[str, Any]:
        """Create a slot; a 503 (the image's template checkpoint is still being built on a fresh
        host) is retried until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self.request("POST", "/v1/slots", body or {})
            if reply.status != 503 or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        check(200 <= reply.status < 300, f"create answered {reply.status}: {reply.raw[:2000]}")
        slot = reply.body
        check(isinstance(slot, dict) and "id" in slot, f"create answered no slot id: {slot!r}")
        return slot

    def slot(self, slot_id: str) -> Reply:
        return self.request("GET", f"/v1/slots/{slot_id}")

    def destroy(self, slot_id: str) -> None:
        reply = self.request("DELETE", f"/v1/slots/{slot_id}")
        check(reply.status == 200, f"destroy {slot_id} answered {reply.status}: {reply.raw}")

    def live_slot_ids(self) -> set[str]:
        body = self.ok("GET", "/v1/slots")
        return {s["id"] for s in body["slots"]}

    def step(self, slot_id: str, action: dict[str, Any]) -> Reply:
        return self.request("POST", f"/v1/slots/{slot_id}/step", {"action": action})

    def execute(self, slot_id: str, command: str) -> dict[str, Any]:
        """Run a shell command as the desktop user; returns {returncode, stdout, stderr}."""
        reply = self.step(slot_id, {"type": "execute", "command": ["sh", "-c", command]})
        check(reply.status == 200, f"execute in {slot_id} answered {reply.status}: {reply.raw}")
        output = reply.body.get("output")
        check(isinstance(output, dict), f"execute in {slot_id} returned no output: {reply.body!r}")
        return output

    def wait_gates(self, slot_id: str, timeout_s: float = 120.0) -> dict[str, Any]:
        """Poll the gate report until it has a verdict (valid is not null)."""
        deadline = time.monotonic() + timeout_s
        while True:
            report = self.ok("GET", f"/v1/slots/{slot_id}/gates")
            if report.get("valid") is not None:
                return report
            check(time.monotonic() < deadline, f"gates of {slot_id} still pending: {report!r}")
            time.sleep(0.5)

    def wait_slot_state(self, slot_id: str, state: str, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self.slot(slot_id)
            if reply.status == 200 and reply.body.get("state") == state:
                return reply.body
            check(
                time.monotonic() < deadline,
                f"slot {slot_id} never reached state {state!r}; last: {reply.status} {reply.raw}",
            )
            time.sleep(0.5)

    def wait_healthy(self, timeout_s: int = 120) -> None:
        self.machine.wait_until_succeeds(
            f"curl -sf --max-time 5 {shlex.quote(self.target.base_url + '/healthz')}",
            timeout=timeout_s,
        )


def gate_status(report: dict[str, Any], name: str) -> str | None:
    for gate in report.get("gates", []):
        if gate.get("name") == name:
            return gate.get("status")
    return None


def mounts_under(machine: MachineLike, path: str, containing: str = "") -> list[str]:
    """Mount points inside `path` (the state dir), optionally only those whose path contains
    `containing` (a slot id: the runtime names a slot's directories after it)."""
    out = machine.succeed(
        f"findmnt -rn -o TARGET | grep -F -- {shlex.quote(path.rstrip('/') + '/')} "
        f"| grep -F -- {shlex.quote(containing)} || true"
    )
    return sorted(line for line in out.splitlines() if line)


def processes_of(machine: MachineLike, name: str) -> list[int]:
    """Pids whose cgroup path names `name` (a slot id: the runtime names a slot's cgroup after
    it). A process's root cannot be used: from the host, a pivoted root reads as "/"."""
    out = machine.succeed(
        "for p in /proc/[0-9]*; do "
        f'grep -qF -- {shlex.quote(name)} "$p/cgroup" 2>/dev/null && echo "${{p#/proc/}}"; '
        "done; true"
    )
    return sorted(int(line) for line in out.split())
