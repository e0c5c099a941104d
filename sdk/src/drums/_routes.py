"""The daemon's routes as the SDK calls them: one function per route, building a `Call`.

A `Call` is everything needed to send a request and read its answer, without doing I/O; the sync
and async clients only differ in how they send it. Each route's deadline comes from `Timeouts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Optional, Type, TypeVar, Union
from urllib.parse import quote

import httpx

from . import models as m

T = TypeVar("T")
ModelT = TypeVar("ModelT", bound=m.ResponseModel)


@dataclass(frozen=True)
class Timeouts:
    """Client-side deadlines, in seconds. Every call has one; none waits forever."""

    default_s: float = 30.0  # lists, gates, screenshots, destroy, quarantine ...
    restore_s: float = 180.0  # create, reset, fork, save, load_task: CRIU plus task setup
    verify_s: float = 600.0  # the checker runs twice, plus a redundant checker and a scope scan
    margin_s: float = (
        15.0  # added to a deadline the daemon itself enforces (action, verify, quiesce)
    )
    cleanup_s: float = 30.0  # destroying everything on exit, in total


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    timeout_s: float
    json: Any = None
    params: Optional[Dict[str, str]] = None
    env_id: Optional[str] = None
    auth: bool = True

    @property
    def what(self) -> str:
        """How errors and logs name this call: method and path, never headers."""
        return f"{self.method} {self.path}"


def _model(cls: Type[ModelT]) -> Callable[[httpx.Response], ModelT]:
    return lambda response: cls.model_validate_json(response.content)


def _field(cls: Type[ModelT], name: str) -> Callable[[httpx.Response], Any]:
    return lambda response: getattr(cls.model_validate_json(response.content), name)


def _bytes(response: httpx.Response) -> bytes:
    return response.content


def _nothing(response: httpx.Response) -> None:
    return None


def _slot_path(env_id: str, tail: str = "") -> str:
    return f"/v1/slots/{quote(env_id, safe='')}{tail}"


def _body(model: m.WireModel) -> Dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


# --- daemon -------------------------------------------------------------------------------------


def healthz(t: Timeouts) -> Call[None]:
    return Call("GET", "/healthz", _nothing, t.default_s, auth=False)


def health(t: Timeouts) -> Call[m.Health]:
    return Call("GET", "/v1/health", _model(m.Health), t.default_s)


def metrics(t: Timeouts) -> Call[m.Metrics]:
    return Call("GET", "/v1/metrics", _model(m.Metrics), t.default_s)


def reset_metrics(t: Timeouts) -> Call[m.Metrics]:
    return Call("POST", "/v1/metrics/reset", _model(m.Metrics), t.default_s)


def list_tasks(t: Timeouts) -> Call[List[m.TaskInfo]]:
    return Call("GET", "/v1/tasks", _field(m.TaskList, "tasks"), t.default_s)


def get_task(task_id: str, t: Timeouts) -> Call[m.TaskInfo]:
    return Call("GET", f"/v1/tasks/{quote(task_id, safe='')}", _model(m.TaskInfo), t.default_s)


# --- saved states (checkpoints) -----------------------------------------------------------------


def list_checkpoints(t: Timeouts) -> Call[List[m.Checkpoint]]:
    return Call("GET", "/v1/checkpoints", _field(m.CheckpointList, "checkpoints"), t.default_s)


def get_checkpoint(state_id: str, t: Timeouts) -> Call[m.Checkpoint]:
    path = f"/v1/checkpoints/{quote(state_id, safe='')}"
    return Call("GET", path, _model(m.Checkpoint), t.default_s)


def delete_checkpoint(state_id: str, timeout_s: float, when_unused: bool = False) -> Call[None]:
    """when_unused: while live slots restore from it, delete it when the last one is gone."""
    params = {"when_unused": "true"} if when_unused else None
    path = f"/v1/checkpoints/{quote(state_id, safe='')}"
    return Call("DELETE", path, _nothing, timeout_s, params=params)


# --- slots --------------------------------------------------------------------------------------


def create_slot(body: m.SlotCreate, t: Timeouts) -> Call[m.Slot]:
    return Call("POST", "/v1/slots", _model(m.Slot), t.restore_s, json=_body(body))


def list_slots(include_destroyed: bool, t: Timeouts) -> Call[List[m.Slot]]:
    params = {"all": "true"} if include_destroyed else None
    return Call("GET", "/v1/slots", _field(m.SlotList, "slots"), t.default_s, params=params)


def get_slot(env_id: str, t: Timeouts) -> Call[m.Slot]:
    return Call("GET", _slot_path(env_id), _model(m.Slot), t.default_s, env_id=env_id)


def destroy_slot(env_id: str, timeout_s: float) -> Call[m.Destroyed]:
    return Call("DELETE", _slot_path(env_id), _model(m.Destroyed), timeout_s, env_id=env_id)


def reset_slot(env_id: str, t: Timeouts) -> Call[m.Slot]:
    path = _slot_path(env_id, "/reset")
    return Call("POST", path, _model(m.Slot), t.restore_s, json={}, env_id=env_id)


def step(env_id: str, request: m.StepRequest, t: Timeouts) -> Call[m.StepResult]:
    # The daemon enforces the action's own deadline (timeout_s, or a wait's seconds); allow for it.
    action = request.action
    own = 0.0
    if isinstance(action, m.Action):
        own = (action.timeout_s or 0.0) + (action.seconds or 0.0)
    timeout = max(t.default_s, own + t.margin_s)
    path = _slot_path(env_id, "/step")
    return Call("POST", path, _model(m.StepResult), timeout, json=_body(request), env_id=env_id)


def screenshot(env_id: str, t: Timeouts) -> Call[bytes]:
    return Call("GET", _slot_path(env_id, "/screenshot"), _bytes, t.default_s, env_id=env_id)


def _image(response: httpx.Response) -> "tuple[bytes, str]":
    return response.content, response.headers.get("content-type", "image/png")


def screenshot_as(
    env_id: str, options: m.ScreenshotOptions, t: Timeouts
) -> "Call[tuple[bytes, str]]":
    """A screenshot encoded as `options` ask (the daemon refuses bad values with a 400)."""
    params = {k: str(v) for k, v in options.model_dump(exclude_none=True).items()}
    path = _slot_path(env_id, "/screenshot")
    return Call("GET", path, _image, t.default_s, params=params or None, env_id=env_id)


def gates(env_id: str, t: Timeouts) -> Call[m.GateReport]:
    path = _slot_path(env_id, "/gates")
    return Call("GET", path, _model(m.GateReport), t.default_s, env_id=env_id)


def terminal(env_id: str, t: Timeouts) -> Call[m.TerminalOutput]:
    path = _slot_path(env_id, "/terminal")
    return Call("GET", path, _model(m.TerminalOutput), t.default_s, env_id=env_id)


def accessibility_tree(env_id: str, t: Timeouts) -> Call[m.AccessibilityTree]:
    path = _slot_path(env_id, "/accessibility")
    return Call("GET", path, _model(m.AccessibilityTree), t.default_s, env_id=env_id)


def capture(env_id: str, body: m.CaptureRequest, t: Timeouts) -> Call[m.Checkpoint]:
    path = _slot_path(env_id, "/capture")
    return Call("POST", path, _model(m.Checkpoint), t.restore_s, json=_body(body), env_id=env_id)


def prefork(env_id: str, body: m.PreforkRequest, t: Timeouts) -> Call[m.Checkpoint]:
    path = _slot_path(env_id, "/prefork")
    return Call("POST", path, _model(m.Checkpoint), t.restore_s, json=_body(body), env_id=env_id)


def fork(env_id: str, body: m.ForkRequest, t: Timeouts) -> Call[m.ForkResult]:
    path = _slot_path(env_id, "/fork")
    # n restores share max_concurrent_restores: give a big fork proportionally more time.
    timeout = t.restore_s * max(1.0, body.n / 4)
    return Call("POST", path, _model(m.ForkResult), timeout, json=_body(body), env_id=env_id)


def quiescent(env_id: str, body: m.QuiescentRequest, t: Timeouts) -> Call[m.QuiescentResult]:
    path = _slot_path(env_id, "/quiescent")
    timeout = max(t.default_s, (body.timeout_s or 30.0) + t.margin_s)
    return Call("POST", path, _model(m.QuiescentResult), timeout, json=_body(body), env_id=env_id)


def load_task(env_id: str, body: m.TaskLoad, t: Timeouts) -> Call[m.TaskLoaded]:
    path = _slot_path(env_id, "/task")
    return Call("POST", path, _model(m.TaskLoaded), t.restore_s, json=_body(body), env_id=env_id)


def verify(env_id: str, body: m.VerifyRequest, t: Timeouts) -> Call[m.VerifyResult]:
    path = _slot_path(env_id, "/verify")
    # timeout_s bounds one checker run; verify runs it twice plus the redundant checker.
    timeout = t.verify_s if body.timeout_s is None else 3 * body.timeout_s + t.margin_s
    return Call("POST", path, _model(m.VerifyResult), timeout, json=_body(body), env_id=env_id)


def slot_metrics(env_id: str, t: Timeouts) -> Call[m.SlotMetrics]:
    path = _slot_path(env_id, "/metrics")
    return Call("GET", path, _model(m.SlotMetrics), t.default_s, env_id=env_id)


def quarantine(env_id: str, body: m.QuarantineRequest, t: Timeouts) -> Call[m.Slot]:
    path = _slot_path(env_id, "/quarantine")
    return Call("POST", path, _model(m.Slot), t.default_s, json=_body(body), env_id=env_id)


def release(env_id: str, t: Timeouts) -> Call[m.Slot]:
    path = _slot_path(env_id, "/release")
    return Call("POST", path, _model(m.Slot), t.default_s, json={}, env_id=env_id)


StateRef = Union[str, m.Checkpoint]


def state_id(state: StateRef) -> str:
    return state.id if isinstance(state, m.Checkpoint) else str(state)
