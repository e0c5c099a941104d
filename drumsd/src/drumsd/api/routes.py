"""Every route of the API in one table: method, path, models, handler.

The app registers from this table and /openapi.json is generated from it, so a route cannot be
served without being documented or documented without being served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from drums import models as wire
from pydantic import BaseModel

from drumsd.api import convert
from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.core.metrics import prometheus_text
from drumsd.guest.protocol import SHOT_PARAMS, ProtocolError, ShotSpec, parse_shot
from drumsd.runtime.supervisor import Supervisor


@dataclass
class Ctx:
    supervisor: Supervisor
    config: Config
    query: dict[str, str]


@dataclass(frozen=True)
class Raw:
    """A non-JSON answer (PNG, Prometheus text)."""

    body: bytes | str
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


Reply = BaseModel | Raw
Handler = Callable[..., Awaitable[Reply]]


@dataclass(frozen=True)
class QueryParam:
    name: str
    description: str
    kind: str = "boolean"


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # OpenAPI style: /v1/slots/{slot_id}
    name: str
    summary: str
    handler: Handler
    request: type[BaseModel] | None = None
    body_required: bool = False
    response: type[BaseModel] | None = None
    content_type: str = "application/json"
    status: int = 200
    auth: bool = True
    query: tuple[QueryParam, ...] = field(default_factory=tuple)
    deprecated: bool = False  # an old path kept for existing clients (OpenAPI says so)

    @property
    def quart_path(self) -> str:
        return self.path.replace("{", "<").replace("}", ">")

    @property
    def path_params(self) -> list[str]:
        return [part[1:-1] for part in self.path.split("/") if part.startswith("{")]


def _bool_query(ctx: Ctx, name: str) -> bool:
    value = ctx.query.get(name)
    if value is None:
        return False
    lowered = value.lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no", ""):
        return False
    raise DrumsdError(
        "invalid_request", f"query {name}={value!r}: expected true or false", field=name
    )


# --- handlers ---------------------------------------------------------------------------------


async def healthz(ctx: Ctx) -> Reply:
    return Raw('{"ok":true}', "application/json")


async def health(ctx: Ctx) -> Reply:
    return convert.health(await ctx.supervisor.health())


async def get_metrics(ctx: Ctx) -> Reply:
    return convert.metrics(ctx.supervisor.metrics_report())


async def reset_metrics(ctx: Ctx, body: BaseModel | None) -> Reply:
    return convert.metrics(ctx.supervisor.reset_metrics())


async def prometheus(ctx: Ctx) -> Reply:
    sup = ctx.supervisor
    gauges: list[tuple[str, str, dict[str, str], float]] = []
    counts: dict[str, int] = {}
    for rec in sup.slots.values():
        counts[rec.status.value] = counts.get(rec.status.value, 0) + 1
    for state in ("creating", "ready", "busy", "quarantined", "failed", "destroyed"):
        gauges.append(("drums_slots", "Slots by state.", {"state": state}, counts.get(state, 0)))
    s = sup.sample
    if s is not None and s.mem_available_mib is not None:
        gauges.append(
            ("drums_host_mem_available_mib", "Host MemAvailable.", {}, s.mem_available_mib)
        )
    if s is not None and s.psi_memory_some_avg10 is not None:
        gauges.append(
            (
                "drums_host_memory_psi_some_avg10",
                "Host memory PSI some avg10.",
                {},
                s.psi_memory_some_avg10,
            )
        )
    gauges += sup.pool_gauges()
    text = prometheus_text(sup.metrics, sup.clock(), ctx.config.host_usd_per_hour, gauges)
    return Raw(text, "text/plain; version=0.0.4; charset=utf-8")


async def list_checkpoints(ctx: Ctx) -> Reply:
    return wire.CheckpointList(
        checkpoints=[convert.checkpoint(cp) for cp in ctx.supervisor.list_checkpoints()]
    )


async def adopt_checkpoint(ctx: Ctx, body: wire.CheckpointAdopt) -> Reply:
    return convert.checkpoint(await ctx.supervisor.adopt_checkpoint(body))


async def get_checkpoint(ctx: Ctx, checkpoint_id: str) -> Reply:
    return convert.checkpoint(ctx.supervisor.get_checkpoint(checkpoint_id))


async def delete_checkpoint(ctx: Ctx, checkpoint_id: str) -> Reply:
    when_unused = _bool_query(ctx, "when_unused")
    return convert.checkpoint(await ctx.supervisor.delete_checkpoint(checkpoint_id, when_unused))


async def list_slots(ctx: Ctx) -> Reply:
    include_all = _bool_query(ctx, "all")
    return wire.SlotList(
        slots=[convert.slot(r) for r in ctx.supervisor.list_slots(include_all=include_all)]
    )


async def create_slot(ctx: Ctx, body: wire.SlotCreate) -> Reply:
    return convert.slot(await ctx.supervisor.create(body))


async def get_slot(ctx: Ctx, slot_id: str) -> Reply:
    return convert.slot(ctx.supervisor.get_slot(slot_id))


async def destroy_slot(ctx: Ctx, slot_id: str) -> Reply:
    rec, already = await ctx.supervisor.destroy(slot_id)
    return wire.Destroyed(id=rec.id, destroyed=True, already=already)


async def reset_slot(ctx: Ctx, slot_id: str, body: BaseModel | None) -> Reply:
    return convert.slot(await ctx.supervisor.reset(slot_id))


async def step(ctx: Ctx, slot_id: str, body: wire.StepRequest) -> Reply:
    return convert.step(await ctx.supervisor.step(slot_id, body))


def shot_spec(query: dict[str, str]) -> ShotSpec:
    """Screenshot options from the query string (format, quality, width, height)."""
    raw = {k: v for k, v in query.items() if k in SHOT_PARAMS}
    try:
        return parse_shot(raw)
    except ProtocolError as exc:
        raise DrumsdError("invalid_request", exc.message, field=exc.field) from None


async def screenshot(ctx: Ctx, slot_id: str) -> Reply:
    shot = await ctx.supervisor.screenshot(slot_id, shot_spec(ctx.query))
    headers = {
        "X-Drums-Screenshot-Width": str(shot.width),
        "X-Drums-Screenshot-Height": str(shot.height),
        "X-Drums-Screenshot-Cached": "true" if shot.cached else "false",
    }
    return Raw(shot.data, shot.content_type, headers)


async def terminal(ctx: Ctx, slot_id: str) -> Reply:
    return await ctx.supervisor.terminal(slot_id)


async def accessibility(ctx: Ctx, slot_id: str) -> Reply:
    return await ctx.supervisor.accessibility_tree(slot_id)


async def gates(ctx: Ctx, slot_id: str) -> Reply:
    return convert.gate_report(await ctx.supervisor.gate_report(slot_id))


async def capture(ctx: Ctx, slot_id: str, body: wire.CaptureRequest | None) -> Reply:
    return convert.checkpoint(await ctx.supervisor.capture(slot_id, body or wire.CaptureRequest()))


async def fork(ctx: Ctx, slot_id: str, body: wire.ForkRequest) -> Reply:
    return convert.fork(await ctx.supervisor.fork(slot_id, body))


async def prefork(ctx: Ctx, slot_id: str, body: wire.PreforkRequest | None) -> Reply:
    return convert.checkpoint(await ctx.supervisor.prefork(slot_id, body or wire.PreforkRequest()))


async def quiescent(ctx: Ctx, slot_id: str, body: wire.QuiescentRequest | None) -> Reply:
    return await ctx.supervisor.quiescent(slot_id, body or wire.QuiescentRequest())


async def load_task(ctx: Ctx, slot_id: str, body: wire.TaskLoad) -> Reply:
    return await ctx.supervisor.load_task(slot_id, body.task)


async def verify(ctx: Ctx, slot_id: str, body: wire.VerifyRequest | None) -> Reply:
    return await ctx.supervisor.verify(slot_id, body or wire.VerifyRequest())


async def slot_metrics(ctx: Ctx, slot_id: str) -> Reply:
    return await ctx.supervisor.slot_metrics(slot_id)


async def quarantine(ctx: Ctx, slot_id: str, body: wire.QuarantineRequest) -> Reply:
    return convert.slot(await ctx.supervisor.quarantine(slot_id, body.reason))


async def release(ctx: Ctx, slot_id: str, body: BaseModel | None) -> Reply:
    return convert.slot(await ctx.supervisor.release(slot_id))


async def list_tasks(ctx: Ctx) -> Reply:
    return wire.TaskList(tasks=ctx.supervisor.tasks.list_tasks())


async def get_task(ctx: Ctx, task_id: str) -> Reply:
    info = ctx.supervisor.tasks.get_task(task_id)
    if info is None:
        raise DrumsdError("not_found", f"no task {task_id!r}; list tasks with GET /v1/tasks")
    return info


class Empty(wire.WireModel):
    """No fields; an empty body or {} is accepted."""


S = "/v1/slots/{slot_id}"

ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", "healthz", "Liveness; no auth", healthz, auth=False),
    Route(
        "GET",
        "/v1/health",
        "health",
        "Slots, checkpoints, admission, space, warnings",
        health,
        response=wire.Health,
    ),
    Route(
        "GET",
        "/v1/metrics",
        "metrics",
        "Metrics of the current window",
        get_metrics,
        response=wire.Metrics,
    ),
    Route(
        "POST",
        "/v1/metrics/reset",
        "metrics_reset",
        "Start a new metrics window; returns the closed one",
        reset_metrics,
        request=Empty,
        response=wire.Metrics,
    ),
    Route(
        "GET",
        "/metrics",
        "prometheus",
        "The metrics as Prometheus text",
        prometheus,
        content_type="text/plain",
    ),
    Route(
        "GET",
        "/v1/checkpoints",
        "checkpoints",
        "List checkpoints",
        list_checkpoints,
        response=wire.CheckpointList,
    ),
    Route(
        "POST",
        "/v1/checkpoints",
        "checkpoint_adopt",
        "Adopt a checkpoint made outside",
        adopt_checkpoint,
        request=wire.CheckpointAdopt,
        body_required=True,
        response=wire.Checkpoint,
        status=201,
    ),
    Route(
        "GET",
        "/v1/checkpoints/{checkpoint_id}",
        "checkpoint",
        "One checkpoint",
        get_checkpoint,
        response=wire.Checkpoint,
    ),
    Route(
        "DELETE",
        "/v1/checkpoints/{checkpoint_id}",
        "checkpoint_delete",
        "Delete a saved state",
        delete_checkpoint,
        response=wire.Checkpoint,
        query=(
            QueryParam(
                "when_unused",
                "while live slots restore from it: delete it when the last one is destroyed",
            ),
        ),
    ),
    Route(
        "GET",
        "/v1/slots",
        "slots",
        "List slots (live ones unless all=true)",
        list_slots,
        response=wire.SlotList,
        query=(QueryParam("all", "include destroyed and failed slots"),),
    ),
    Route(
        "POST",
        "/v1/slots",
        "slot_create",
        "Create a slot from an image or a saved state, optionally on a task",
        create_slot,
        request=wire.SlotCreate,
        response=wire.Slot,
        status=201,
    ),
    Route("GET", S, "slot", "One slot", get_slot, response=wire.Slot),
    Route(
        "DELETE",
        S,
        "slot_destroy",
        "Destroy a slot (idempotent)",
        destroy_slot,
        response=wire.Destroyed,
    ),
    Route(
        "POST",
        S + "/reset",
        "slot_reset",
        "Kill and restore again: a new episode",
        reset_slot,
        request=Empty,
        response=wire.Slot,
    ),
    Route(
        "POST",
        S + "/step",
        "slot_step",
        "Run one action",
        step,
        request=wire.StepRequest,
        body_required=True,
        response=wire.StepResult,
    ),
    Route(
        "GET",
        S + "/screenshot",
        "slot_screenshot",
        "The desktop as PNG (default), JPEG or WebP, optionally scaled; encoded once in the guest",
        screenshot,
        content_type="image/png",
        query=(
            QueryParam("format", "png (default), jpeg (or jpg) or webp", "string"),
            QueryParam("quality", "jpeg/webp quality, 1..100 (default 80)", "integer"),
            QueryParam("width", "scale to this width; alone, keeps the aspect ratio", "integer"),
            QueryParam("height", "scale to this height; alone, keeps the aspect ratio", "integer"),
        ),
    ),
    Route(
        "GET",
        S + "/terminal",
        "slot_terminal",
        "The desktop's terminal text (OSWorld's terminal observation); not an action",
        terminal,
        response=wire.TerminalOutput,
    ),
    Route(
        "GET",
        S + "/accessibility",
        "slot_accessibility",
        "The desktop's accessibility tree in OSWorld's XML (AT-SPI); not an action",
        accessibility,
        response=wire.AccessibilityTree,
    ),
    Route(
        "GET",
        S + "/gates",
        "slot_gates",
        "Gate report of the current episode",
        gates,
        response=wire.GateReport,
    ),
    Route(
        "POST",
        S + "/capture",
        "slot_capture",
        "Save the running slot as a checkpoint",
        capture,
        request=wire.CaptureRequest,
        response=wire.Checkpoint,
        status=201,
    ),
    Route(
        "POST",
        S + "/fork",
        "slot_fork",
        "Fork N children from the current state",
        fork,
        request=wire.ForkRequest,
        body_required=True,
        response=wire.ForkResult,
        status=201,
    ),
    # The fork's route before fork became its one name (issue 31); clients built on it still work.
    Route(
        "POST",
        S + "/branch",
        "slot_branch",
        "Fork N children from the current state (the old path of /fork)",
        fork,
        request=wire.ForkRequest,
        body_required=True,
        response=wire.ForkResult,
        status=201,
        deprecated=True,
    ),
    Route(
        "POST",
        S + "/prefork",
        "slot_prefork",
        "Dump ahead so a later fork is a restore",
        prefork,
        request=wire.PreforkRequest,
        response=wire.Checkpoint,
    ),
    Route(
        "POST",
        S + "/quiescent",
        "slot_quiescent",
        "Wait until the tree is quiescent",
        quiescent,
        request=wire.QuiescentRequest,
        response=wire.QuiescentResult,
    ),
    Route(
        "POST",
        S + "/task",
        "slot_task",
        "Load a task into a running slot",
        load_task,
        request=wire.TaskLoad,
        body_required=True,
        response=wire.TaskLoaded,
    ),
    Route(
        "POST",
        S + "/verify",
        "slot_verify",
        "Run the task's checker: score, validity, audit",
        verify,
        request=wire.VerifyRequest,
        response=wire.VerifyResult,
    ),
    Route(
        "GET",
        S + "/metrics",
        "slot_metrics",
        "Per-slot metrics",
        slot_metrics,
        response=wire.SlotMetrics,
    ),
    Route(
        "POST",
        S + "/quarantine",
        "slot_quarantine",
        "Take a slot out of service",
        quarantine,
        request=wire.QuarantineRequest,
        body_required=True,
        response=wire.Slot,
    ),
    Route(
        "POST",
        S + "/release",
        "slot_release",
        "Release a quarantined slot",
        release,
        request=Empty,
        response=wire.Slot,
    ),
    Route(
        "GET",
        "/v1/tasks",
        "tasks",
        "Tasks the host knows, each with supported and why not",
        list_tasks,
        response=wire.TaskList,
    ),
    Route("GET", "/v1/tasks/{task_id}", "task", "One task", get_task, response=wire.TaskInfo),
)


def find(name: str) -> Route:
    for route in ROUTES:
        if route.name == name:
            return route
    raise KeyError(name)


def handler_args(route: Route, body: Any, path: dict[str, str]) -> dict[str, Any]:
    args: dict[str, Any] = dict(path)
    if route.request is not None:
        args["body"] = body
    return args
