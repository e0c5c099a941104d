"""A fake drumsd for tests without a desktop host: the daemon's HTTP API with canned screenshots.

It speaks the routes and JSON shapes of DESIGN.md's API table (slots, step, screenshot, gates,
fork, capture, verify, checkpoints, tasks, health) with the daemon's error envelope, and plays
scripted task outcomes so tests can reach every branch of the verifier contract. A task's
behaviour comes from an optional `"fake"` block in its JSON (inline or in the task directory):

    "fake": {
      "expect": {"type": "type", "text": "42"},  # score 1.0 iff an executed action matches
      "invalid_after_actions": 2,     # gate no_app_crash fails after the 2nd action
      "gone_after_actions": 1,        # the slot dies after the 1st action (410 env_gone)
      "checker_error": "boom",        # verify reports a checker failure, no score
      "audit_flags": ["nondeterministic"],
      "trust_unknown": true,          # verify says `trusted: null` (as a daemon without audit)
      "invalid_children": [1],        # fork child 1 starts with gate alive_after_resume failed
      "pending_gate_polls": 2         # the gate report is pending for the first 2 polls
    }

Fake-only route: `GET /fake/stats` (no auth) reports live slots, live checkpoints and counters,
so tests can prove that nothing leaked. Loopback only.

Run: python -m drums_verifiers.testing.fake_drumsd --tasks DIR --token-file F [--port 0]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import struct
import sys
import threading
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from drums.vocabulary import GATES

SCREEN = (1920, 1080)
PNG_SIZE = (192, 108)  # small on purpose: tests move many of them through JSON


def canned_png(shade: int, size: tuple[int, int] = PNG_SIZE) -> bytes:
    """A solid-colour PNG whose colour changes with `shade`, built with the stdlib only."""
    width, height = size
    rgb = bytes(((shade * 53) % 256, (shade * 97 + 40) % 256, (shade * 29 + 90) % 256))
    raw = b"".join(b"\x00" + rgb * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def canned_shot(shade: int, options: dict[str, Any] | None) -> tuple[bytes, str]:
    """The canned screen as screenshot options ask (format, quality, width, height), with its
    content type; like the daemon, one of width/height keeps the aspect ratio."""
    options = options or {}
    width, height = options.get("width"), options.get("height")
    if width and not height:
        height = max(1, round(PNG_SIZE[1] * int(width) / PNG_SIZE[0]))
    if height and not width:
        width = max(1, round(PNG_SIZE[0] * int(height) / PNG_SIZE[1]))
    png = canned_png(shade, (int(width), int(height)) if width else PNG_SIZE)
    fmt = str(options.get("format") or "png").lower().replace("jpg", "jpeg")
    if fmt == "png":
        return png, "image/png"
    from PIL import Image  # only for jpeg/webp, which a test asks for explicitly

    out = io.BytesIO()
    with Image.open(io.BytesIO(png)) as image:
        image.save(out, format=fmt.upper(), quality=int(options.get("quality") or 80))
    return out.getvalue(), f"image/{fmt}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class ApiError(Exception):
    STATUS = {
        "unauthorized": 401,
        "not_found": 404,
        "env_gone": 410,
        "invalid_request": 422,
        "checker_failed": 502,
        "quarantined": 423,
        "invalid_episode": 409,
    }

    def __init__(self, code: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail

    @property
    def status(self) -> int:
        return self.STATUS.get(self.code, 400)


@dataclass
class FakeSlot:
    id: str
    task: dict[str, Any] | None
    parent: str | None = None
    episode: int = 1
    actions: list[dict[str, Any]] = field(default_factory=list)
    failed_gates: list[str] = field(default_factory=list)
    gone: bool = False
    quarantine_reason: str | None = None
    gate_polls: int = 0
    created_at: str = field(default_factory=now_iso)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def fake(self) -> dict[str, Any]:
        return (self.task or {}).get("fake", {})

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": "destroyed"
            if self.gone
            else ("quarantined" if self.quarantine_reason else "ready"),
            "checkpoint": "template-fake",
            "image": "fake",
            "episode": self.episode,
            "episode_id": f"{self.id}-e{self.episode}",
            "parent": self.parent,
            "task_id": (self.task or {}).get("id"),
            "created_at": self.created_at,
            "last_used_at": now_iso(),
            "idle_timeout_s": 1800.0,
            "quarantine_reason": self.quarantine_reason,
            "valid": None
            if self.gate_polls <= self.fake.get("pending_gate_polls", 0)
            else not self.failed_gates,
            "labels": self.labels,
        }


class FakeDaemon:
    """All state of the fake, guarded by one lock (requests arrive on many threads)."""

    def __init__(self, tasks: dict[str, dict[str, Any]], token: str) -> None:
        self.tasks = tasks
        self.token = token
        self.slots: dict[str, FakeSlot] = {}
        self.checkpoints: dict[str, dict[str, Any]] = {}
        self.inline_tasks: dict[str, dict[str, Any]] = {}
        self.counters: dict[str, int] = {}
        self.lock = threading.Lock()

    # -- helpers -------------------------------------------------------------------------------

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def resolve_task(self, ref: Any) -> dict[str, Any] | None:
        if ref is None:
            return None
        if isinstance(ref, dict):
            if ref.get("id"):  # remembered so GET /v1/tasks/{id} answers for inline tasks too
                self.inline_tasks[str(ref["id"])] = ref
            return ref
        if ref in self.inline_tasks:
            return self.inline_tasks[ref]
        if ref in self.tasks:
            return self.tasks[ref]
        path = Path(str(ref))
        if path.suffix == ".json" and path.is_file():
            return json.loads(path.read_text())
        raise ApiError("not_found", f"no task {ref!r} on this host; list them with GET /v1/tasks")

    def slot(self, slot_id: str) -> FakeSlot:
        slot = self.slots.get(slot_id)
        if slot is None:
            raise ApiError("not_found", f"no slot {slot_id!r}", slot=slot_id)
        if slot.gone:
            raise ApiError("env_gone", f"slot {slot_id} is gone; create a new env", slot=slot_id)
        return slot

    def new_slot(self, task: dict[str, Any] | None, parent: str | None = None) -> FakeSlot:
        slot = FakeSlot(id=f"s{uuid.uuid4().hex[:8]}", task=task, parent=parent)
        self.slots[slot.id] = slot
        self.count("slots_created")
        return slot

    def after_action(self, slot: FakeSlot) -> None:
        n = len(slot.actions)
        if (k := slot.fake.get("invalid_after_actions")) is not None and n >= k:
            if "no_app_crash" not in slot.failed_gates:
                slot.failed_gates.append("no_app_crash")
                slot.quarantine_reason = "gate no_app_crash failed mid-episode"
        if (k := slot.fake.get("gone_after_actions")) is not None and n >= k:
            slot.gone = True
            self.count("slots_died")

    def gate_report(self, slot: FakeSlot) -> dict[str, Any]:
        slot.gate_polls += 1
        pending = slot.gate_polls <= slot.fake.get("pending_gate_polls", 0)
        gates = [
            {
                "name": g,
                "status": "pending"
                if pending and g == "alive_after_resume"
                else ("fail" if g in slot.failed_gates else "pass"),
                "evidence": {},
            }
            for g in GATES
        ]
        return {
            "slot": slot.id,
            "episode": slot.episode,
            "episode_id": f"{slot.id}-e1",
            "profile": "hardened",
            "gates": gates,
            "valid": None if pending else not slot.failed_gates,
            "failed": list(slot.failed_gates),
        }

    def score(self, slot: FakeSlot) -> float:
        expect = slot.fake.get("expect")
        if not expect:
            return 0.0
        for action in slot.actions:
            if all(action.get(k) == v for k, v in expect.items()):
                return 1.0
        return 0.0

    def verify(self, slot: FakeSlot) -> dict[str, Any]:
        fake = slot.fake
        valid = not slot.failed_gates
        checker_error = fake.get("checker_error")
        if checker_error:
            raise ApiError(
                "checker_failed",
                f"checker crashed: {checker_error}",
                slot=slot.id,
                checker_error=checker_error,
            )
        score = self.score(slot) if valid else None
        flags = list(fake.get("audit_flags", []))
        return {
            "slot": slot.id,
            "episode": slot.episode,
            "task_id": (slot.task or {}).get("id"),
            "score": score,
            "valid": valid,
            "verdict": "valid" if valid else "invalid",
            "invalid_reasons": [f"gate {g} failed" for g in slot.failed_gates],
            "failed_gates": list(slot.failed_gates),
            "checker_error": None,
            "audit": {"flags": flags, "checker_s": 0.01, "second_score": score},
            "trusted": None
            if fake.get("trust_unknown")
            else (valid and score is not None and not flags)
            if valid
            else False,
            "last_action": slot.actions[-1]["type"] if slot.actions else None,
            "actions": len(slot.actions),
        }

    # -- routes --------------------------------------------------------------------------------

    def handle(
        self, method: str, path: str, query: dict[str, str], body: Any, auth: str | None
    ) -> tuple[int, Any, str]:
        if path == "/healthz":
            return 200, {"ok": True}, "json"
        if path == "/fake/stats":
            live = [s.id for s in self.slots.values() if not s.gone]
            return (
                200,
                {
                    "live_slots": live,
                    "checkpoints": sorted(self.checkpoints),
                    "counters": dict(self.counters),
                },
                "json",
            )
        if auth != f"Bearer {self.token}":
            raise ApiError("unauthorized", "missing or wrong bearer token; read /etc/drums/token")
        parts = [p for p in path.split("/") if p]
        with self.lock:
            return self.route(method, parts, query, body)

    def route(
        self, method: str, parts: list[str], query: dict[str, str], body: Any
    ) -> tuple[int, Any, str]:
        match method, parts:
            case "GET", ["v1", "health"]:
                return (
                    200,
                    {
                        "status": "ok",
                        "version": "fake",
                        "profile": "hardened",
                        "slots_by_state": {
                            "ready": len([s for s in self.slots.values() if not s.gone])
                        },
                        "checkpoints": [],
                        "admission": {"enabled": False, "admitting": True},
                    },
                    "json",
                )
            case "GET", ["v1", "metrics"]:
                return (
                    200,
                    {
                        "window_started_at": now_iso(),
                        "window_s": 1.0,
                        "latencies": {},
                        "episodes_by_verdict": {},
                        "failures_by_class": {},
                        "counters": dict(self.counters),
                    },
                    "json",
                )
            case "GET", ["v1", "tasks"]:
                return 200, {"tasks": [self.task_info(t) for t in self.tasks.values()]}, "json"
            case "GET", ["v1", "tasks", task_id]:
                return 200, self.task_info(self.resolve_task(task_id) or {}), "json"
            case "GET", ["v1", "slots"]:
                include_all = query.get("all") in ("1", "true")
                return (
                    200,
                    {
                        "slots": [
                            s.to_wire() for s in self.slots.values() if include_all or not s.gone
                        ]
                    },
                    "json",
                )
            case "POST", ["v1", "slots"]:
                task = self.resolve_task((body or {}).get("task"))
                slot = self.new_slot(task)
                slot.labels = dict((body or {}).get("labels") or {})
                return 201, slot.to_wire(), "json"
            case "GET", ["v1", "slots", sid]:
                return 200, self.slot(sid).to_wire(), "json"
            case "DELETE", ["v1", "slots", sid]:
                slot = self.slots.get(sid)
                if slot is None:
                    raise ApiError("not_found", f"no slot {sid!r}")
                already = slot.gone
                slot.gone = True
                self.count("slots_destroyed")
                return 200, {"id": sid, "destroyed": True, "already": already}, "json"
            case "POST", ["v1", "slots", sid, "reset"]:
                slot = self.slot(sid)
                slot.episode += 1
                slot.actions.clear()
                slot.failed_gates.clear()
                return 200, slot.to_wire(), "json"
            case "POST", ["v1", "slots", sid, "step"]:
                return 200, self.step(self.slot(sid), body or {}), "json"
            case "GET", ["v1", "slots", sid, "screenshot"]:
                slot = self.slot(sid)
                self.count("screenshots")
                data, content_type = canned_shot(len(slot.actions), query)
                return 200, data, content_type
            case "GET", ["v1", "slots", sid, "gates"]:
                return 200, self.gate_report(self.slot(sid)), "json"
            case "POST", ["v1", "slots", sid, "quiescent"]:
                return 200, {"slot": self.slot(sid).id, "quiescent": True, "waited_s": 0.0}, "json"
            case "POST", ["v1", "slots", sid, "prefork"]:
                self.slot(sid)
                ckpt = self.new_checkpoint("prefork", sid)
                return 201, ckpt, "json"
            case "POST", ["v1", "slots", sid, "capture"]:
                self.slot(sid)
                return 201, self.new_checkpoint("saved", sid), "json"
            case "POST", ["v1", "slots", sid, "fork" | "branch"]:  # branch: the old path of fork
                return 201, self.fork(self.slot(sid), body or {}), "json"
            case "POST", ["v1", "slots", sid, "task"]:
                slot = self.slot(sid)
                slot.task = self.resolve_task((body or {}).get("task"))
                return (
                    200,
                    {"slot": sid, "task": self.task_info(slot.task or {}), "setup_s": 0.0},
                    "json",
                )
            case "POST", ["v1", "slots", sid, "verify"]:
                self.count("verifies")
                return 200, self.verify(self.slot(sid)), "json"
            case "GET", ["v1", "slots", sid, "metrics"]:
                slot = self.slot(sid)
                return (
                    200,
                    {
                        "slot": sid,
                        "episode": slot.episode,
                        "actions": len(slot.actions),
                        "latencies": {},
                    },
                    "json",
                )
            case "POST", ["v1", "slots", sid, "quarantine"]:
                slot = self.slot(sid)
                slot.quarantine_reason = (body or {}).get("reason", "quarantined")
                return 200, slot.to_wire(), "json"
            case "POST", ["v1", "slots", sid, "release"]:
                slot = self.slot(sid)
                slot.quarantine_reason = None
                return 200, slot.to_wire(), "json"
            case "GET", ["v1", "checkpoints"]:
                return 200, {"checkpoints": list(self.checkpoints.values())}, "json"
            case "GET", ["v1", "checkpoints", cid]:
                if cid not in self.checkpoints:
                    raise ApiError("not_found", f"no checkpoint {cid!r}")
                return 200, self.checkpoints[cid], "json"
            case "DELETE", ["v1", "checkpoints", cid]:
                if self.checkpoints.pop(cid, None) is None:
                    raise ApiError("not_found", f"no checkpoint {cid!r}")
                self.count("checkpoints_deleted")
                return 200, {"id": cid, "destroyed": True, "already": False}, "json"
        raise ApiError("not_found", f"no route {method} /{'/'.join(parts)}")

    def task_info(self, task: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": task.get("id", ""),
            "instruction": task.get("instruction", ""),
            "source": "fake",
            "domain": task.get("snapshot"),
            "supported": True,
        }

    def new_checkpoint(self, kind: str, source: str) -> dict[str, Any]:
        ckpt = {
            "id": f"c{uuid.uuid4().hex[:8]}",
            "kind": kind,
            "source_slot": source,
            "created_at": now_iso(),
            "size_mib": 100.0,
        }
        self.checkpoints[ckpt["id"]] = ckpt
        self.count(f"checkpoints_{kind}")
        return ckpt

    def step(self, slot: FakeSlot, body: dict[str, Any]) -> dict[str, Any]:
        action = body.get("action")
        if isinstance(action, str):
            action = {"type": "pyautogui", "code": action}
        if not isinstance(action, dict) or "type" not in action:
            raise ApiError(
                "invalid_request", "action must be pyautogui code or an action dict with a 'type'"
            )
        slot.actions.append(dict(action))
        self.count("steps")
        output = None
        if action["type"] == "execute":
            cmd = action.get("command")
            shown = cmd if isinstance(cmd, str) else " ".join(cmd or [])
            output = {"returncode": 0, "stdout": f"ran as user: {shown}\n", "stderr": ""}
        self.after_action(slot)
        result: dict[str, Any] = {
            "slot": slot.id,
            "episode": slot.episode,
            "action_type": action["type"],
            "elapsed_s": 0.001,
            "actions": len(slot.actions),
            "terminal": action["type"] if action["type"] in ("done", "fail") else None,
            "output": output,
        }
        options = body.get("screenshot_options")
        if body.get("screenshot") or options:
            data, content_type = canned_shot(len(slot.actions), options)
            encoded = base64.b64encode(data).decode()
            if content_type == "image/png":
                result["screenshot_png_b64"] = encoded
            else:
                result["screenshot_b64"], result["screenshot_content_type"] = encoded, content_type
            self.count("step_shots_" + content_type.removeprefix("image/"))
        return result

    def fork(self, parent: FakeSlot, body: dict[str, Any]) -> dict[str, Any]:
        n = int(body.get("n", 1))
        if not 1 <= n <= 64:
            raise ApiError("invalid_request", "n must be between 1 and 64")
        prefork = body.get("prefork")
        if prefork is not None and prefork not in self.checkpoints:
            raise ApiError("not_found", f"no prefork state {prefork!r}")
        # The SDK dumps ahead (prefork) and forks from that state; a bare fork makes one.
        ckpt = self.checkpoints[prefork] if prefork else self.new_checkpoint("prefork", parent.id)
        invalid = set(parent.fake.get("invalid_children", []))
        children = []
        for i in range(n):
            child = self.new_slot(parent.task, parent=parent.id)
            child.actions = [dict(a) for a in parent.actions]
            if i in invalid:
                child.failed_gates.append("alive_after_resume")
            children.append(child.to_wire())
        self.count("forks")
        return {
            "parent": parent.id,
            "children": children,
            "checkpoint": ckpt["id"],
            "elapsed_s": 0.01,
        }


def load_tasks(directory: Path | None) -> dict[str, dict[str, Any]]:
    tasks: dict[str, dict[str, Any]] = {}
    if directory is None:
        return tasks
    for path in sorted(directory.rglob("*.json")):
        task = json.loads(path.read_text())
        if isinstance(task, dict) and "id" in task:
            tasks[task["id"]] = task
    return tasks


class FakeDrumsd:
    """The HTTP face of a FakeDaemon; `serve()` runs it on 127.0.0.1 in a daemon thread."""

    def __init__(self, daemon: FakeDaemon) -> None:
        self.daemon = daemon
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        daemon = self.daemon

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, payload: Any, kind: str) -> None:
                image = kind.startswith("image/")
                data = payload if image else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", kind if image else "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _dispatch(self, method: str) -> None:
                path, _, raw_query = self.path.partition("?")
                query = dict(re.findall(r"([^&=]+)=([^&]*)", raw_query))
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                    status, payload, kind = daemon.handle(
                        method, path, query, body, self.headers.get("authorization")
                    )
                except ApiError as e:
                    status, kind = e.status, "json"
                    payload = {"error": {"code": e.code, "message": e.message, "detail": e.detail}}
                except json.JSONDecodeError:
                    status, kind = 422, "json"
                    payload = {
                        "error": {
                            "code": "invalid_request",
                            "message": "body is not JSON",
                            "detail": {},
                        }
                    }
                self._send(status, payload, kind)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def do_DELETE(self) -> None:
                self._dispatch("DELETE")

        return Handler

    def serve(self, port: int = 0) -> str:
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self.handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.url

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, help="directory of task JSON files")
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    args = parser.parse_args(argv)
    fake = FakeDrumsd(FakeDaemon(load_tasks(args.tasks), args.token_file.read_text().strip()))
    url = fake.serve(args.port)
    if args.port_file:
        args.port_file.write_text(url.rsplit(":", 1)[1])
    print(f"fake drumsd on {url}", file=sys.stderr, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
