"""Wire models of the drumsd API, shared by the daemon and the SDK.

These are the only shapes that cross the HTTP boundary. The daemon converts its core records to
and from them, so internal state never leaks into the API. Python 3.9 compatible (the SDK's floor).
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field

from drums.vocabulary import ACTION_TYPES as ACTION_TYPES  # re-exported: drums.models.ACTION_TYPES
from drums.vocabulary import ActionType


class WireModel(BaseModel):
    """Strict on input (unknown fields are an error), stable on output."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResponseModel(BaseModel):
    """Tolerant on input so an older SDK can read a newer daemon's answers."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --- errors -----------------------------------------------------------------------------------


class ErrorCode(str, Enum):
    """Stable error codes; each maps to one HTTP status and one SDK exception class."""

    unauthorized = "unauthorized"
    not_found = "not_found"
    env_gone = "env_gone"
    invalid_request = "invalid_request"
    overloaded = "overloaded"
    state_dir_full = "state_dir_full"
    not_quiescent = "not_quiescent"
    quarantined = "quarantined"
    restore_failed = "restore_failed"
    checker_failed = "checker_failed"
    conflict = "conflict"
    invalid_episode = "invalid_episode"
    unsupported_task = "unsupported_task"
    action_failed = "action_failed"
    timeout = "timeout"
    runtime_error = "runtime_error"
    shutting_down = "shutting_down"
    setup_failed = "setup_failed"  # a task's setup steps failed in the slot (drumsd.tasks.bridge)


ERROR_STATUS: Dict[str, int] = {
    "unauthorized": 401,
    "not_found": 404,
    "env_gone": 410,
    "invalid_request": 422,
    "overloaded": 429,
    "state_dir_full": 507,
    "not_quiescent": 409,
    "quarantined": 423,
    "restore_failed": 502,
    "checker_failed": 502,
    "conflict": 409,
    "invalid_episode": 409,
    "unsupported_task": 422,
    "action_failed": 422,
    "timeout": 504,
    "runtime_error": 503,
    "shutting_down": 503,
    "setup_failed": 502,
}


class ErrorBody(ResponseModel):
    code: str
    message: str
    detail: Dict[str, Any] = Field(default_factory=dict)


class ErrorEnvelope(ResponseModel):
    error: ErrorBody


# --- actions ----------------------------------------------------------------------------------


class Action(WireModel):
    """One agent action. `pyautogui` carries code; the rest are structured.

    Coordinates are screen pixels (1920x1080 by default). `execute` runs a command as the desktop
    user. `done` and `fail` are the terminal actions (OSWorld's DONE and FAIL).
    """

    type: ActionType
    code: Optional[str] = Field(default=None, description="pyautogui code (type=pyautogui)")
    x: Optional[int] = Field(default=None, ge=0, le=16384)
    y: Optional[int] = Field(default=None, ge=0, le=16384)
    to_x: Optional[int] = Field(default=None, ge=0, le=16384, description="drag target x")
    to_y: Optional[int] = Field(default=None, ge=0, le=16384, description="drag target y")
    button: Optional[Literal["left", "middle", "right", "back", "forward"]] = None
    clicks: Optional[int] = Field(default=None, ge=-100, le=100, description="scroll amount")
    dx: Optional[int] = Field(default=None, ge=-100, le=100)
    text: Optional[str] = Field(default=None, max_length=100_000)
    key: Optional[str] = Field(default=None, max_length=64)
    keys: Optional[List[str]] = Field(default=None, max_length=8)
    seconds: Optional[float] = Field(default=None, ge=0, le=60)
    modifiers: Optional[List[str]] = Field(
        default=None, max_length=4, description="keys held down during a click, drag or scroll"
    )
    command: Optional[Union[str, List[str]]] = None
    timeout_s: Optional[float] = Field(default=None, gt=0, le=600)


class ScreenshotOptions(WireModel):
    """How the daemon encodes a screenshot (in the guest, once): format png (default, lossless),
    jpeg or webp with a quality (1..100, default 80), scaled to width x height (give one to keep
    the aspect ratio; at most the screen's size)."""

    format: Optional[str] = Field(default=None, description="png (default), jpeg or webp")
    quality: Optional[int] = Field(default=None, description="jpeg/webp quality, 1..100")
    width: Optional[int] = Field(default=None, description="scale to this width (pixels)")
    height: Optional[int] = Field(default=None, description="scale to this height (pixels)")
    region: Optional[List[int]] = Field(
        default=None,
        description="[x0, y0, x1, y1] in screen pixels: only that region, at full resolution "
        "unless width/height scale it (a zoom)",
    )


class ScreenSize(WireModel):
    """The model's screen: the size of the screenshots it sees, the space of its coordinates."""

    width: int = Field(ge=16, le=1920)
    height: int = Field(ge=16, le=1080)


class StepRequest(WireModel):
    """A step: pyautogui code as a string, or an action object; or, with a `dialect`, a batch of
    a vendor's computer-tool calls (`actions`, run in order in one round trip)."""

    action: Optional[Union[str, Action]] = Field(
        default=None, description="pyautogui code or a drums action (without a dialect)"
    )
    dialect: Optional[str] = Field(
        default=None,
        description="anthropic-2025-01, anthropic-2025-11, anthropic-2026-08 or openai (or the "
        "vendor's tool type: computer_20250124, computer_20251124, computer_toolset_20260801, "
        "computer): `actions` are that vendor's calls",
    )
    actions: Optional[List[Dict[str, Any]]] = Field(
        default=None,
        max_length=64,
        description="the vendor's calls, as its SDK dumps them (needs `dialect`)",
    )
    screen: Optional[ScreenSize] = Field(
        default=None,
        description="the model's screen size: coordinates are scaled from it, cursor positions "
        "and screenshots to it (default: the desktop's)",
    )
    screenshot_each: bool = Field(
        default=False, description="a screenshot after every call of `actions`, not only the last"
    )
    screenshot: bool = Field(default=False, description="also return a PNG (base64) after the step")
    screenshot_options: Optional[ScreenshotOptions] = Field(
        default=None,
        description="format/quality/size of the step's screenshot (implies screenshot=true)",
    )


class CommandOutput(ResponseModel):
    returncode: int
    stdout: str = ""
    stderr: str = ""


class TerminalOutput(ResponseModel):
    slot: str
    episode: int
    text: Optional[str] = Field(
        default=None, description="the terminal's scrollback and screen; None when unreadable"
    )
    source: Optional[str] = None
    reason: Optional[str] = None


class AccessibilityTree(ResponseModel):
    slot: str
    episode: int
    tree: Optional[str] = Field(
        default=None,
        description="the AT-SPI tree in OSWorld's XML (a desktop-frame root); None when the "
        "desktop has none",
    )
    reason: Optional[str] = None


class CallResult(ResponseModel):
    """What one call of a dialect step produced: a cursor position (in the model's space) or an
    image (its screenshot or zoom), when it has one."""

    index: int = Field(description="the call's index in `actions`")
    name: str = Field(description="the call's action name in its dialect")
    cursor: Optional[Dict[str, int]] = Field(default=None, description="{x, y}, model space")
    image_b64: Optional[str] = None
    image_content_type: Optional[str] = None
    image_width: Optional[int] = None
    image_height: Optional[int] = None

    def image_bytes(self) -> Optional[bytes]:
        import base64

        return base64.b64decode(self.image_b64) if self.image_b64 else None


class StepResult(ResponseModel):
    slot: str
    episode: int
    action_type: str
    elapsed_s: float
    actions: int = Field(description="actions taken in this episode, this one included")
    terminal: Optional[Literal["done", "fail"]] = None
    output: Optional[CommandOutput] = None
    screenshot_png_b64: Optional[str] = Field(
        default=None, description="the screenshot, base64, when it is a PNG (the default)"
    )
    screenshot_b64: Optional[str] = Field(
        default=None, description="the screenshot, base64, when a jpeg or webp was asked for"
    )
    screenshot_content_type: Optional[str] = None
    screenshot_width: Optional[int] = None
    screenshot_height: Optional[int] = None
    screenshot_cached: Optional[bool] = Field(
        default=None, description="the screen had not changed since the last grab: no encode"
    )
    results: Optional[List[CallResult]] = Field(
        default=None, description="per call of a dialect step, in order"
    )

    def screenshot_bytes(self) -> Optional[bytes]:
        """The step's screenshot, decoded from base64 (None without one)."""
        import base64

        b64 = self.screenshot_png_b64 or self.screenshot_b64
        return base64.b64decode(b64) if b64 else None


# --- slots ------------------------------------------------------------------------------------


class SlotState(str, Enum):
    creating = "creating"
    ready = "ready"
    busy = "busy"
    quarantined = "quarantined"
    failed = "failed"
    destroyed = "destroyed"


TaskRef = Union[str, Dict[str, Any]]


class SlotCreate(WireModel):
    """Create a slot from an image's template checkpoint or a saved state, optionally on a task."""

    image: Optional[str] = Field(default=None, description="image profile name or checkpoint id")
    from_state: Optional[str] = Field(default=None, description="a saved checkpoint id")
    task: Optional[TaskRef] = Field(default=None, description="task id, JSON path or inline task")
    idle_timeout_s: Optional[float] = Field(default=None, gt=0, le=30 * 86400)
    ttl_s: Optional[float] = Field(default=None, gt=0, le=30 * 86400)
    labels: Dict[str, str] = Field(default_factory=dict)


class Slot(ResponseModel):
    id: str
    state: SlotState
    checkpoint: str
    image: Optional[str] = None
    episode: int = 0
    episode_id: Optional[str] = None
    parent: Optional[str] = None
    task_id: Optional[str] = None
    task_setup: Optional[Literal["cached", "replayed"]] = Field(
        default=None,
        description="how this episode's task setup was done: restored from the task's "
        "checkpoint (cached) or its steps run (replayed); None without a task",
    )
    created_at: datetime
    last_used_at: datetime
    expires_at: Optional[datetime] = None
    idle_timeout_s: float
    ttl_s: Optional[float] = None
    quarantine_reason: Optional[str] = None
    valid: Optional[bool] = Field(default=None, description="None while gates are pending")
    profile: str = "hardened"
    labels: Dict[str, str] = Field(default_factory=dict)
    number: Optional[int] = Field(default=None, description="the slot's number (slot_range)")
    ports: Dict[int, int] = Field(
        default_factory=dict,
        description="guest port -> host port on 127.0.0.1 that reaches it (port_base + number)",
    )


class SlotList(ResponseModel):
    slots: List[Slot]


class Destroyed(ResponseModel):
    id: str
    destroyed: bool = True
    already: bool = False


# --- gates ------------------------------------------------------------------------------------


class GateStatus(str, Enum):
    passed = "pass"
    failed = "fail"
    pending = "pending"


class GateResult(ResponseModel):
    name: str
    status: GateStatus
    evidence: Dict[str, Any] = Field(default_factory=dict)
    checked_at: Optional[datetime] = None


class GateReport(ResponseModel):
    slot: str
    episode: int
    episode_id: str
    profile: str
    gates: List[GateResult]
    valid: Optional[bool] = Field(description="True when every gate passed; None while pending")
    failed: List[str] = Field(default_factory=list)


# --- checkpoints ------------------------------------------------------------------------------


class CheckpointKind(str, Enum):
    template = "template"
    saved = "saved"
    prefork = "prefork"
    task = "task"  # a task's setup, captured once and restored by later episodes of the task


class Checkpoint(ResponseModel):
    id: str
    kind: CheckpointKind
    image: Optional[str] = None
    image_sha256: Optional[str] = None
    source_slot: Optional[str] = None
    created_at: datetime
    last_used_at: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    size_mib: float = 0.0  # what its files hold on disk (a sparse file's data only)
    apparent_mib: float = 0.0  # what its files' sizes add up to (holes included)
    upper_sha256: Optional[str] = None
    task_id: Optional[str] = None
    profile: str = "hardened"


class CheckpointList(ResponseModel):
    checkpoints: List[Checkpoint]


class CheckpointAdopt(WireModel):
    """Adopt a checkpoint directory made outside this daemon (drumsd layout, see docs)."""

    path: str
    kind: Literal["template", "saved"] = "saved"
    image: Optional[str] = None


class CaptureRequest(WireModel):
    idle_timeout_s: Optional[float] = Field(default=None, gt=0, le=30 * 86400)
    ttl_s: Optional[float] = Field(default=None, gt=0, le=30 * 86400)


class ForkRequest(WireModel):
    n: int = Field(ge=1, le=64)
    prefork: Optional[str] = Field(default=None, description="a prefork checkpoint to restore from")
    idle_timeout_s: Optional[float] = Field(default=None, gt=0, le=30 * 86400)
    ttl_s: Optional[float] = Field(default=None, gt=0, le=30 * 86400)


class ForkResult(ResponseModel):
    parent: str
    children: List[Slot]
    checkpoint: str
    elapsed_s: float


# The route was /branch and these its models' names before fork became the one name (issue 31).
BranchRequest = ForkRequest
BranchResult = ForkResult


class PreforkRequest(WireModel):
    idle_timeout_s: Optional[float] = Field(default=None, gt=0, le=30 * 86400)


class QuiescentRequest(WireModel):
    window_s: Optional[float] = Field(default=None, gt=0, le=60)
    timeout_s: Optional[float] = Field(default=None, gt=0, le=600)


class QuiescentResult(ResponseModel):
    slot: str
    quiescent: bool
    waited_s: float
    # Not quiet: what moved last (e.g. "sh(412) started", "gimp(90) is a zombie (Z)").
    moving: list[str] = Field(default_factory=list)


# --- tasks and verify -------------------------------------------------------------------------


class TaskLoad(WireModel):
    task: TaskRef


class TaskInfo(ResponseModel):
    id: str
    instruction: str = ""
    source: Optional[str] = None
    domain: Optional[str] = None
    supported: bool
    reason: Optional[str] = None
    # The exploit suite's verdict ({"hackable": bool, "won": [strategy]}); None: not audited.
    audit: Optional[Dict[str, Any]] = None


class TaskList(ResponseModel):
    tasks: List[TaskInfo]


class TaskLoaded(ResponseModel):
    slot: str
    task: TaskInfo
    setup_s: float


class VerifyRequest(WireModel):
    timeout_s: Optional[float] = Field(default=None, gt=0, le=3600)


class Audit(ResponseModel):
    flags: List[str] = Field(default_factory=list)
    checker_s: Optional[float] = None
    error_class: Optional[str] = None
    second_score: Optional[float] = None
    redundant_score: Optional[float] = None
    scope: Dict[str, Any] = Field(default_factory=dict)


class VerifyResult(ResponseModel):
    slot: str
    episode: int
    task_id: Optional[str] = None
    score: Optional[float] = None
    valid: bool
    verdict: str = Field(description="valid | invalid | quarantined | pending")
    invalid_reasons: List[str] = Field(default_factory=list)
    failed_gates: List[str] = Field(default_factory=list)
    checker_error: Optional[str] = None
    audit: Audit = Field(default_factory=Audit)
    trusted: Optional[bool] = None
    last_action: Optional[str] = None
    actions: int = 0


class QuarantineRequest(WireModel):
    reason: str = Field(min_length=1, max_length=2000)


# --- health and metrics -----------------------------------------------------------------------


class AdmissionState(ResponseModel):
    enabled: bool
    admitting: bool
    reason: Optional[str] = None
    mem_available_mib: Optional[float] = None
    mem_total_mib: Optional[float] = None
    psi_memory_some_avg10: Optional[float] = None
    state_free_mib: Optional[float] = None
    slot_cost_mib: Optional[float] = Field(
        default=None, description="what one more slot costs: the live slots' real, merged charge"
    )
    group_memory_limit_mib: Optional[float] = Field(
        default=None,
        description="memory limit of all slots together: their usage plus MemAvailable less the "
        "floor, refreshed every sample (null: none set yet, or no limit)",
    )
    sampled_at: Optional[datetime] = None


class SpaceState(ResponseModel):
    path: str
    free_mib: float
    total_mib: float
    free_pct: float


class Health(ResponseModel):
    status: Literal["ok", "degraded"]
    version: str
    profile: str
    slots_by_state: Dict[str, int]
    checkpoints: List[Checkpoint]
    admission: AdmissionState
    crash_watch: Dict[str, Any] = Field(default_factory=dict)
    state_dir: Optional[SpaceState] = None
    journal_dir: Optional[SpaceState] = None
    forgotten_gib: float = 0.0
    pools: Dict[str, Any] = Field(default_factory=dict)
    ksm: Dict[str, Any] = Field(default_factory=dict)
    services: Dict[str, Any] = Field(
        default_factory=dict,
        description="background services by name: last iteration, failures, last error",
    )
    tasks: Dict[str, Any] = Field(
        default_factory=dict,
        description="the default image's apps and where OSWorld's tasks come from (or why none)",
    )
    warnings: List[str] = Field(default_factory=list)


class JsonView(ResponseModel):
    """Also reads as a mapping of its JSON: `metrics()["cost"]`, `.keys()`, `.get("latencies")`.

    Iterating stays pydantic's (field, value) pairs; use `.keys()` / `.items()` for the mapping.
    """

    def _json(self) -> Dict[str, Any]:
        return self.model_dump(mode="json")

    def __getitem__(self, key: str) -> Any:
        data = self._json()
        if key not in data:
            raise KeyError(f"{key!r}: not a field of {type(self).__name__} ({', '.join(data)})")
        return data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._json()

    def __len__(self) -> int:
        return len(self._json())

    def get(self, key: str, default: Any = None) -> Any:
        return self._json().get(key, default)

    def keys(self) -> List[str]:
        return list(self._json())

    def values(self) -> List[Any]:
        return list(self._json().values())

    def items(self) -> List[Tuple[str, Any]]:
        return list(self._json().items())


class LatencySummary(ResponseModel):
    count: int
    p50: Optional[float] = None
    p90: Optional[float] = None
    p99: Optional[float] = None
    mean: Optional[float] = None
    max: Optional[float] = None


class Metrics(JsonView):
    window_started_at: datetime
    window_s: float
    latencies: Dict[str, LatencySummary]
    episodes_by_verdict: Dict[str, int]
    failures_by_class: Dict[str, int]
    counters: Dict[str, float] = Field(default_factory=dict)
    cost: Dict[str, Optional[float]] = Field(default_factory=dict)


class SlotMetrics(JsonView):
    slot: str
    episode: int
    actions: int
    latencies: Dict[str, LatencySummary]
    memory_mib: Optional[float] = None
    cpu_s: Optional[float] = None
    pids: Optional[int] = None
