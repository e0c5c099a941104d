"""A small in-memory stand-in for drumsd's API, as a plain ASGI app, for the SDK's unit tests.

It speaks the wire models of `drums.models` and the error envelope of DESIGN.md, keeps slots and
checkpoints in dicts, and behaves like the daemon where the SDK can tell: bearer auth, 404 for
unknown ids, 410 for destroyed slots, 423 for quarantined ones, 422 for bad bodies, idempotent
destroy. It knows nothing of desktops: screenshots are a tiny PNG, verify scores 1.0 once the
episode took an action. `FaultInjector` wraps any ASGI app (this one or the real daemon's) to
answer chosen requests with a chosen error, body, Retry-After or a hang.
"""

from __future__ import annotations

import hmac
import itertools
import json
import re
import struct
import zlib
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Set, Tuple

import anyio
import pydantic

from drums import models as m

Scope = Dict[str, Any]
Receive = Callable[[], Awaitable[Dict[str, Any]]]
Send = Callable[[Dict[str, Any]], Awaitable[None]]


def tiny_png(width: int = 4, height: int = 3) -> bytes:
    """A valid grey RGB PNG, built by hand so the fake needs no imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = b"".join(b"\x00" + b"\x80\x80\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


class ApiError(Exception):
    def __init__(self, code: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.detail = code, message, detail


def _now() -> datetime:
    return datetime.now(timezone.utc)


GATE_NAMES = ("lock_applied", "cgroup", "guest_ready", "state_hash", "not_quarantined")
DEFAULT_TASKS = [
    m.TaskInfo(id="task-ok", instruction="Type hello into the terminal.", supported=True),
    m.TaskInfo(
        id="task-gdrive",
        instruction="Upload the report to Google Drive.",
        supported=False,
        reason="googledrive tasks need network access",
    ),
]


@dataclass
class _SlotRec:
    slot: m.Slot
    actions: int = 0
    last_action: Optional[str] = None


class FakeDaemon:
    """`FakeDaemon(token=...)` is an ASGI app; `.slots` and `.checkpoints` show what is alive."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.slots: Dict[str, _SlotRec] = {}
        self.checkpoints: Dict[str, m.Checkpoint] = {}
        self.deleting: Set[str] = set()  # DELETE ?when_unused=true while slots restore from it
        self.tasks: Dict[str, m.TaskInfo] = {t.id: t for t in DEFAULT_TASKS}
        self.window_started = _now()
        self.counters: Dict[str, float] = {}
        self._ids = itertools.count(1)
        template = m.Checkpoint(id="tpl-office", kind="template", image="office", created_at=_now())
        self.checkpoints[template.id] = template
        self.routes: List[Tuple[str, re.Pattern[str], Callable[..., Any]]] = [
            ("GET", re.compile(r"/healthz"), self.healthz),
            ("GET", re.compile(r"/v1/health"), self.health),
            ("GET", re.compile(r"/v1/metrics"), self.metrics),
            ("POST", re.compile(r"/v1/metrics/reset"), self.reset_metrics),
            ("GET", re.compile(r"/v1/tasks"), self.list_tasks),
            ("GET", re.compile(r"/v1/tasks/(?P<tid>[^/]+)"), self.get_task),
            ("GET", re.compile(r"/v1/checkpoints"), self.list_checkpoints),
            ("GET", re.compile(r"/v1/checkpoints/(?P<cid>[^/]+)"), self.get_checkpoint),
            ("DELETE", re.compile(r"/v1/checkpoints/(?P<cid>[^/]+)"), self.delete_checkpoint),
            ("GET", re.compile(r"/v1/slots"), self.list_slots),
            ("POST", re.compile(r"/v1/slots"), self.create_slot),
            ("GET", re.compile(r"/v1/slots/(?P<sid>[^/]+)"), self.get_slot),
            ("DELETE", re.compile(r"/v1/slots/(?P<sid>[^/]+)"), self.destroy_slot),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/reset"), self.reset_slot),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/step"), self.step),
            ("GET", re.compile(r"/v1/slots/(?P<sid>[^/]+)/screenshot"), self.screenshot),
            ("GET", re.compile(r"/v1/slots/(?P<sid>[^/]+)/gates"), self.gates),
            ("GET", re.compile(r"/v1/slots/(?P<sid>[^/]+)/terminal"), self.terminal),
            ("GET", re.compile(r"/v1/slots/(?P<sid>[^/]+)/accessibility"), self.accessibility),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/capture"), self.capture),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/prefork"), self.prefork),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/fork"), self.fork),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/quiescent"), self.quiescent),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/task"), self.load_task),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/verify"), self.verify),
            ("GET", re.compile(r"/v1/slots/(?P<sid>[^/]+)/metrics"), self.slot_metrics),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/quarantine"), self.quarantine),
            ("POST", re.compile(r"/v1/slots/(?P<sid>[^/]+)/release"), self.release),
        ]

    # --- what tests look at ---------------------------------------------------------------------

    def live_slots(self) -> List[str]:
        return [i for i, r in self.slots.items() if r.slot.state != m.SlotState.destroyed]

    def saved_states(self) -> List[str]:
        return [i for i, c in self.checkpoints.items() if c.kind != m.CheckpointKind.template]

    # --- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            status, payload, content_type = self.dispatch(scope, body)
        except ApiError as err:
            status = m.ERROR_STATUS[err.code]
            envelope = {"error": {"code": err.code, "message": err.message, "detail": err.detail}}
            payload, content_type = json.dumps(envelope).encode(), "application/json"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", content_type.encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    def dispatch(self, scope: Scope, body: bytes) -> Tuple[int, bytes, str]:
        method, path = scope["method"], scope["path"]
        for route_method, pattern, handler in self.routes:  # noqa: B007 (used after the loop)
            match = pattern.fullmatch(path)
            if match and route_method == method:
                break
        else:
            raise ApiError("not_found", f"no route {method} {path}")
        if path != "/healthz":
            self.check_auth(scope)
        query = dict(
            pair.split("=", 1) for pair in scope["query_string"].decode().split("&") if "=" in pair
        )
        data: Any = None
        if body:
            try:
                data = json.loads(body)
            except ValueError as exc:
                raise ApiError("invalid_request", f"body is not JSON: {exc}") from exc
        try:
            result = handler(data=data, query=query, **match.groupdict())
        except pydantic.ValidationError as exc:
            raise ApiError("invalid_request", f"invalid body: {exc.errors()[0]['msg']}") from exc
        if isinstance(result, bytes):
            return 200, result, "image/png"
        if isinstance(result, pydantic.BaseModel):
            return 200, result.model_dump_json().encode(), "application/json"
        return 200, json.dumps(result).encode(), "application/json"

    def check_auth(self, scope: Scope) -> None:
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"").decode()
        if not hmac.compare_digest(given, f"Bearer {self.token}"):
            raise ApiError("unauthorized", "missing or wrong bearer token")

    # --- helpers --------------------------------------------------------------------------------

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):04d}"

    def live(self, sid: str, *, allow_quarantined: bool = True) -> _SlotRec:
        rec = self.slots.get(sid)
        if rec is None:
            raise ApiError("not_found", f"no slot {sid}", slot=sid)
        if rec.slot.state == m.SlotState.destroyed:
            raise ApiError("env_gone", f"slot {sid} was destroyed", slot=sid)
        if not allow_quarantined and rec.slot.state == m.SlotState.quarantined:
            raise ApiError(
                "quarantined",
                f"slot {sid} is quarantined ({rec.slot.quarantine_reason}); release then reset it",
                slot=sid,
            )
        rec.slot.last_used_at = _now()
        return rec

    def new_slot(self, checkpoint: str, task_id: Optional[str], parent: Optional[str]) -> m.Slot:
        slot = m.Slot(
            id=self.new_id("slot"),
            state=m.SlotState.ready,
            checkpoint=checkpoint,
            image="office",
            episode=1,
            episode_id=self.new_id("ep"),
            parent=parent,
            task_id=task_id,
            created_at=_now(),
            last_used_at=_now(),
            idle_timeout_s=1800.0,
            valid=True,
        )
        self.slots[slot.id] = _SlotRec(slot)
        return slot

    def resolve_task(self, task: m.TaskRef) -> m.TaskInfo:
        if isinstance(task, dict):
            info = m.TaskInfo(
                id=str(task.get("id") or self.new_id("inline")),
                instruction=str(task.get("instruction") or ""),
                source="inline",
                supported=True,
            )
            self.tasks[info.id] = info
            return info
        info = self.tasks.get(task)
        if info is None:
            raise ApiError("not_found", f"no task {task}", task=task)
        if not info.supported:
            raise ApiError("unsupported_task", f"task {task} is unsupported: {info.reason}")
        return info

    def checkpoint(self, kind: str, source: str) -> m.Checkpoint:
        cp = m.Checkpoint(
            id=self.new_id(kind), kind=kind, image="office", source_slot=source, created_at=_now()
        )
        self.checkpoints[cp.id] = cp
        return cp

    # --- routes ---------------------------------------------------------------------------------

    def healthz(self, **_: Any) -> Dict[str, str]:
        return {"status": "ok"}

    def health(self, **_: Any) -> m.Health:
        by_state: Dict[str, int] = {}
        for rec in self.slots.values():
            by_state[rec.slot.state.value] = by_state.get(rec.slot.state.value, 0) + 1
        return m.Health(
            status="ok",
            version="fake",
            profile="hardened",
            slots_by_state=by_state,
            checkpoints=[c for c in self.checkpoints.values() if c.kind == "template"],
            admission=m.AdmissionState(enabled=True, admitting=True),
        )

    def metrics(self, **_: Any) -> m.Metrics:
        return m.Metrics(
            window_started_at=self.window_started,
            window_s=(_now() - self.window_started).total_seconds(),
            latencies={},
            episodes_by_verdict={},
            failures_by_class={},
            counters=dict(self.counters),
        )

    def reset_metrics(self, **_: Any) -> m.Metrics:
        ended = self.metrics()
        self.window_started, self.counters = _now(), {}
        return ended

    def list_tasks(self, **_: Any) -> m.TaskList:
        return m.TaskList(tasks=list(self.tasks.values()))

    def get_task(self, tid: str, **_: Any) -> m.TaskInfo:
        if tid not in self.tasks:
            raise ApiError("not_found", f"no task {tid}", task=tid)
        return self.tasks[tid]

    def list_checkpoints(self, **_: Any) -> m.CheckpointList:
        return m.CheckpointList(checkpoints=list(self.checkpoints.values()))

    def get_checkpoint(self, cid: str, **_: Any) -> m.Checkpoint:
        if cid not in self.checkpoints:
            raise ApiError("not_found", f"no checkpoint {cid}", checkpoint=cid)
        return self.checkpoints[cid]

    def delete_checkpoint(
        self, cid: str, query: Optional[Dict[str, str]] = None, **_: Any
    ) -> Dict[str, Any]:
        cp = self.get_checkpoint(cid)
        if cp.kind == m.CheckpointKind.template:
            raise ApiError("conflict", f"{cid} is an image's template checkpoint")
        if (query or {}).get("when_unused") == "true" and self.users(cid):
            self.deleting.add(cid)  # as the daemon: deleted when its last slot is destroyed
            return {"id": cid, "deleted": False}
        del self.checkpoints[cid]
        return {"id": cid, "deleted": True}

    def users(self, cid: str) -> List[str]:
        return [
            i
            for i, r in self.slots.items()
            if r.slot.checkpoint == cid and r.slot.state != m.SlotState.destroyed
        ]

    def list_slots(self, query: Dict[str, str], **_: Any) -> m.SlotList:
        everything = query.get("all") == "true"
        slots = [r.slot for r in self.slots.values()]
        if not everything:
            slots = [s for s in slots if s.state != m.SlotState.destroyed]
        return m.SlotList(slots=slots)

    def create_slot(self, data: Any, **_: Any) -> m.Slot:
        body = m.SlotCreate.model_validate(data)
        checkpoint = "tpl-office"
        if body.from_state is not None:
            checkpoint = self.get_checkpoint(body.from_state).id
        task = self.resolve_task(body.task) if body.task is not None else None
        slot = self.new_slot(checkpoint, task.id if task else None, parent=None)
        self.counters["creates"] = self.counters.get("creates", 0) + 1
        return slot

    def get_slot(self, sid: str, **_: Any) -> m.Slot:
        rec = self.slots.get(sid)
        if rec is None:
            raise ApiError("not_found", f"no slot {sid}", slot=sid)
        return rec.slot

    def destroy_slot(self, sid: str, **_: Any) -> m.Destroyed:
        rec = self.slots.get(sid)
        if rec is None:
            raise ApiError("not_found", f"no slot {sid}", slot=sid)
        already = rec.slot.state == m.SlotState.destroyed
        rec.slot.state = m.SlotState.destroyed
        for cid in [c for c in self.deleting if not self.users(c)]:
            self.deleting.discard(cid)
            self.checkpoints.pop(cid, None)
        return m.Destroyed(id=sid, already=already)

    def reset_slot(self, sid: str, **_: Any) -> m.Slot:
        rec = self.live(sid)
        if rec.slot.state == m.SlotState.quarantined:
            raise ApiError("quarantined", f"slot {sid} is quarantined; release it first", slot=sid)
        rec.slot.episode += 1
        rec.slot.episode_id = self.new_id("ep")
        rec.actions, rec.last_action = 0, None
        return rec.slot

    def step(self, sid: str, data: Any, **_: Any) -> m.StepResult:
        rec = self.live(sid, allow_quarantined=False)
        request = m.StepRequest.model_validate(data)
        action = request.action
        kind = "pyautogui" if isinstance(action, str) else action.type
        output = None
        if isinstance(action, m.Action) and action.type == "execute":
            output = m.CommandOutput(returncode=0, stdout=f"ran {action.command}\n")
        rec.actions += 1
        rec.last_action = kind
        terminal = kind if kind in ("done", "fail") else None
        return m.StepResult(
            slot=sid,
            episode=rec.slot.episode,
            action_type=kind,
            elapsed_s=0.001,
            actions=rec.actions,
            terminal=terminal,
            output=output,
            screenshot_png_b64=None,
        )

    def screenshot(self, sid: str, **_: Any) -> bytes:
        self.live(sid)
        return tiny_png()

    def terminal(self, sid: str, **_: Any) -> m.TerminalOutput:
        rec = self.live(sid)
        return m.TerminalOutput(slot=sid, episode=rec.slot.episode, reason="the fake has no xterm")

    def accessibility(self, sid: str, **_: Any) -> m.AccessibilityTree:
        rec = self.live(sid)
        return m.AccessibilityTree(
            slot=sid, episode=rec.slot.episode, reason="the fake runs no AT-SPI"
        )

    def gates(self, sid: str, **_: Any) -> m.GateReport:
        rec = self.live(sid)
        quarantined = rec.slot.state == m.SlotState.quarantined
        results = [
            m.GateResult(
                name=name,
                status="fail" if (quarantined and name == "not_quarantined") else "pass",
            )
            for name in GATE_NAMES
        ]
        failed = [g.name for g in results if g.status == m.GateStatus.failed]
        return m.GateReport(
            slot=sid,
            episode=rec.slot.episode,
            episode_id=rec.slot.episode_id or "",
            profile="hardened",
            gates=results,
            valid=not failed,
            failed=failed,
        )

    def capture(self, sid: str, data: Any, **_: Any) -> m.Checkpoint:
        m.CaptureRequest.model_validate(data or {})
        self.live(sid, allow_quarantined=False)
        return self.checkpoint("saved", sid)

    def prefork(self, sid: str, data: Any, **_: Any) -> m.Checkpoint:
        m.PreforkRequest.model_validate(data or {})
        self.live(sid, allow_quarantined=False)
        return self.checkpoint("prefork", sid)

    def fork(self, sid: str, data: Any, **_: Any) -> m.ForkResult:
        request = m.ForkRequest.model_validate(data)
        rec = self.live(sid, allow_quarantined=False)
        if request.prefork is not None:
            checkpoint = self.get_checkpoint(request.prefork).id
        else:
            checkpoint = self.checkpoint("prefork", sid).id
        children = [
            self.new_slot(checkpoint, rec.slot.task_id, parent=sid) for _ in range(request.n)
        ]
        return m.ForkResult(parent=sid, children=children, checkpoint=checkpoint, elapsed_s=0.01)

    def quiescent(self, sid: str, data: Any, **_: Any) -> m.QuiescentResult:
        m.QuiescentRequest.model_validate(data or {})
        self.live(sid)
        return m.QuiescentResult(slot=sid, quiescent=True, waited_s=0.0)

    def load_task(self, sid: str, data: Any, **_: Any) -> m.TaskLoaded:
        request = m.TaskLoad.model_validate(data)
        rec = self.live(sid, allow_quarantined=False)
        info = self.resolve_task(request.task)
        rec.slot.task_id = info.id
        return m.TaskLoaded(slot=sid, task=info, setup_s=0.0)

    def verify(self, sid: str, data: Any, **_: Any) -> m.VerifyResult:
        m.VerifyRequest.model_validate(data or {})
        rec = self.live(sid, allow_quarantined=False)
        if rec.slot.task_id is None:
            raise ApiError("invalid_request", f"slot {sid} has no task to verify; load one first")
        score = 1.0 if rec.actions else 0.0
        return m.VerifyResult(
            slot=sid,
            episode=rec.slot.episode,
            task_id=rec.slot.task_id,
            score=score,
            valid=True,
            verdict="valid",
            audit=m.Audit(checker_s=0.01, second_score=score, flags=["scope_unchecked"]),
            trusted=False,
            last_action=rec.last_action,
            actions=rec.actions,
        )

    def slot_metrics(self, sid: str, **_: Any) -> m.SlotMetrics:
        rec = self.live(sid)
        return m.SlotMetrics(slot=sid, episode=rec.slot.episode, actions=rec.actions, latencies={})

    def quarantine(self, sid: str, data: Any, **_: Any) -> m.Slot:
        request = m.QuarantineRequest.model_validate(data)
        rec = self.live(sid)
        rec.slot.state, rec.slot.quarantine_reason = m.SlotState.quarantined, request.reason
        rec.slot.valid = False
        return rec.slot

    def release(self, sid: str, **_: Any) -> m.Slot:
        rec = self.live(sid)
        rec.slot.state, rec.slot.quarantine_reason = m.SlotState.ready, None
        return rec.slot


@asynccontextmanager
async def open_fake_app(token: str) -> AsyncIterator[FakeDaemon]:
    yield FakeDaemon(token=token)


# --- fault injection around any ASGI app -------------------------------------------------------


@dataclass
class Fault:
    method: str
    path: "re.Pattern[str]"
    status: int
    body: bytes
    headers: List[Tuple[bytes, bytes]]
    times: int  # how many matching requests it answers; then the app answers again
    hang: bool = False


@dataclass
class Seen:
    method: str
    path: str
    headers: Dict[bytes, bytes] = field(default_factory=dict)


class FaultInjector:
    """Wraps an ASGI app; answers matching requests with a canned error, body or hang."""

    def __init__(self, app: Optional[Callable[..., Awaitable[None]]]) -> None:
        self.app = app
        self.faults: List[Fault] = []
        self.seen: List[Seen] = []

    def error(
        self,
        method: str,
        path: str,
        code: str,
        *,
        message: str = "injected",
        detail: Optional[Dict[str, Any]] = None,
        status: Optional[int] = None,
        headers: Optional[Dict[str, str]] = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` matching requests with the daemon's error envelope for `code`."""
        envelope = {"error": {"code": code, "message": message, "detail": detail or {}}}
        self.respond(
            method,
            path,
            status or m.ERROR_STATUS.get(code, 500),
            json.dumps(envelope).encode(),
            headers=headers,
            times=times,
        )

    def respond(
        self,
        method: str,
        path: str,
        status: int,
        body: Any,
        *,
        headers: Optional[Dict[str, str]] = None,
        times: int = 1,
    ) -> None:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        raw = [(b"content-type", b"application/json")]
        raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self.faults.append(Fault(method, re.compile(path), status, body, raw, times))

    def hang(self, method: str, path: str, *, times: int = 1) -> None:
        """Never answer the next `times` matching requests (until the client gives up)."""
        self.faults.append(Fault(method, re.compile(path), 0, b"", [], times, hang=True))

    def count(self, method: str, path: str) -> int:
        pattern = re.compile(path)
        return sum(1 for s in self.seen if s.method == method and pattern.fullmatch(s.path))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(Seen(scope["method"], scope["path"], dict(scope["headers"])))
            for fault in self.faults:
                if fault.times > 0 and fault.method == scope["method"]:
                    if fault.path.fullmatch(scope["path"]):
                        fault.times -= 1
                        if fault.hang:
                            await anyio.sleep_forever()
                        await send(
                            {
                                "type": "http.response.start",
                                "status": fault.status,
                                "headers": fault.headers,
                            }
                        )
                        await send({"type": "http.response.body", "body": fault.body})
                        return
        assert self.app is not None, "FaultInjector.app is set when the app opens"
        await self.app(scope, receive, send)
