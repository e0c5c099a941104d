"""The seam between the control plane and the Linux runtime: Protocols and the types they pass.

The control plane (API, records, leases, admission, gates) talks to desktops only through
`SlotRuntime`, and to the optional warm-spare pool and KSM through `SpareControl` and `KsmControl`
(a runtime implements them or not; the supervisor checks with `isinstance`, never `hasattr`). The
Linux implementation lives in `drumsd.runtime.linux`; an in-memory one serves the unit tests
of the control plane only. Pure: no trio, no os.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from drumsd.guest.protocol import ShotSpec


@dataclass(frozen=True)
class SlotLimits:
    """Resource limits of one slot, from the config."""

    vcpus: float = 1.0
    memory_mib: int = 2048
    swap_mib: int = 0
    pids_max: int = 1024
    tmpfs_mib: int = 1024


@dataclass(frozen=True)
class SaveParent:
    """The checkpoint a capture is stored against: only the pages and files that differ from
    it are stored (issue 35; `drumsd.core.save_delta`). A chain `max_depth` deltas deep is
    stored full again (0: every capture full)."""

    dir: Path
    max_depth: int


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint on disk: `dir/images` (CRIU images), `dir/upper` (the upper-layer snapshot
    taken while the tree was frozen), `dir/meta.json`."""

    id: str
    dir: Path
    lower: Path
    image_sha256: str
    upper_sha256: str | None = None
    profile: str = "hardened"


@dataclass(frozen=True)
class SlotHandle:
    """What the runtime knows about one running slot; persisted in the slot's record."""

    slot_id: str
    init_pid: int
    init_starttime: int  # /proc/<pid>/stat field 22: identity across pid reuse
    root: Path  # the overlay root, host side
    upper: Path  # the upper layer dir, host side
    checkpoint_id: str
    cgroups: Mapping[str, str] = field(default_factory=dict)  # controller -> cgroup dir
    namespaces: Mapping[str, int] = field(default_factory=dict)  # ns name -> inode
    restore_s: float = 0.0
    attempts: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Screenshot:
    """An encoded screenshot as the guest made it (passed on to clients unchanged). `cached`:
    the screen had not changed since the last grab, so the guest returned its earlier encoding."""

    data: bytes
    content_type: str = "image/png"
    width: int = 0
    height: int = 0
    cached: bool = False
    grab_s: float = 0.0  # in the guest: reading the screen (and its checksum)
    encode_s: float = 0.0  # in the guest: scaling and encoding (0 when cached)


@dataclass(frozen=True)
class StepOutcome:
    action_type: str
    elapsed_s: float
    output: CommandResult | None = None
    screenshot: Screenshot | None = None  # taken right after the action, when one was asked for
    cursor: tuple[int, int] | None = None  # cursor_position: where the pointer is (screen px)


@dataclass(frozen=True)
class SlotFacts:
    """Evidence for the gates, read from the OS (cgroup files, /proc, mountinfo)."""

    alive: bool
    init_identity_ok: bool
    limits_in_force: Mapping[str, Any]
    mounts: Sequence[str]
    net_links: Sequence[str]
    namespaces: Mapping[str, int]
    oom_kills: int
    pids: Sequence[int]
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CrashFacts:
    """What the crash watch saw of one slot since its episode began, for the no_app_crash gate:
    its crash-signal exits ({pid, tgid, tid, name, comm, signal, signal_name, core_dumped, time})
    and whether it watches process events at all."""

    crash_exits: Sequence[Mapping[str, Any]] = ()
    watched: bool = False

    def as_extra(self) -> dict[str, Any]:
        """The `SlotFacts.extra` keys the gate reads (crash_exits, crash_watch)."""
        return {"crash_exits": [dict(c) for c in self.crash_exits], "crash_watch": self.watched}


class CrashWatchControl(Protocol):
    """The crash watch as the supervisor uses it (`drumsd.runtime.crash_watch.CrashWatch`)."""

    available: bool
    error: str | None

    async def track(self, slot_id: str, cgroup_dirs: Mapping[str, str]) -> None: ...

    def untrack(self, slot_id: str) -> None: ...

    def facts(self, slot_id: str, since: float | None = None) -> CrashFacts: ...

    def health(self) -> Mapping[str, Any]:
        """Its figures for /v1/health's crash_watch object (available, error, counts)."""
        ...


@dataclass(frozen=True)
class Quiescence:
    """The answer of a quiet wait: quiet or not, and what kept moving in the last change seen
    (e.g. "sh(412) started", "true(415) exited", "gimp(90) is a zombie (Z)")."""

    quiet: bool
    moving: tuple[str, ...] = ()


class RuntimeError_(Exception):
    """A runtime failure with a stable code (restore_failed, not_quiescent, action_failed,
    invalid_request, timeout, runtime_error) and a message that says what to do next."""

    def __init__(self, code: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


class GuestStream(Protocol):
    """A byte stream to a server in a slot (what trio.SocketStream offers)."""

    async def send_all(self, data: bytes) -> None: ...

    async def receive_some(self, max_bytes: int | None = None) -> bytes: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class SlotRuntime(Protocol):
    """Every operation on desktops. All methods are trio-async and cancel-safe: a cancelled
    restore leaves nothing behind (its cleanup runs shielded)."""

    async def restore(
        self,
        slot_id: str,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        *,
        warm_upper: bool = True,
    ) -> SlotHandle:
        """Create: fresh upper from the checkpoint's snapshot, overlay, cgroups, CRIU restore,
        wait until the guest agent answers. Retried up to max_attempts before any task ran.
        `warm_upper=False`: prepare no upper ahead for the slot's next reset even when the
        runtime does (an instance destroyed right after, such as a task checkpoint's probe)."""
        ...

    async def reset(
        self, handle: SlotHandle, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> SlotHandle:
        """Kill the tree, fresh upper, restore the checkpoint again (a new episode)."""
        ...

    async def destroy(self, slot_id: str) -> None:
        """Idempotent: no process, mount, cgroup, tmpfs or temp file of the slot remains."""
        ...

    async def step(
        self, handle: SlotHandle, action: Mapping[str, Any], shot: ShotSpec | None = None
    ) -> StepOutcome:
        """Run one action; with `shot`, the screenshot after it comes in the same round trip."""
        ...

    async def screenshot(self, handle: SlotHandle) -> bytes:
        """A PNG of the whole screen."""
        ...

    async def grab(self, handle: SlotHandle, spec: ShotSpec) -> Screenshot:
        """A screenshot encoded (and scaled) as `spec` asks, once, in the guest."""
        ...

    async def capture(
        self,
        handle: SlotHandle,
        checkpoint_id: str,
        dest: Path,
        *,
        parent: SaveParent | None = None,
    ) -> CheckpointRef:
        """Dump the running tree (left running) and snapshot the upper layer while frozen;
        with a `parent`, store only the pages and files that differ from it."""
        ...

    async def fork(
        self,
        handle: SlotHandle,
        source: CheckpointRef,
        child_ids: Sequence[str],
        limits: SlotLimits,
    ) -> list[SlotHandle]:
        """Restore len(child_ids) children of `source` (a prefork/capture of `handle`) at once."""
        ...

    async def quiescent(
        self, handle: SlotHandle, window_s: float, timeout_s: float, poll_ms: int
    ) -> Quiescence:
        """Wait until no process of the slot starts or exits and none is in D or Z state for
        `window_s` (CPU use does not count: the dump freezes the tree), or `timeout_s`."""
        ...

    async def exec_user(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        """Run a command inside the slot as the desktop user."""
        ...

    async def exec_checker(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        """Run a checker's or getter's command inside the slot isolated from the agent's files
        and processes: a uid other than the desktop user's (its processes cannot touch it),
        `/` as working directory, a clean environment where Python adds neither the working
        directory nor a user site to its path. What it reads is data, never code."""
        ...

    async def exec_trusted(
        self, handle: SlotHandle, command: str, timeout_s: float
    ) -> CommandResult:
        """Trusted provisioning: run a root-needing task step inside the slot's namespaces,
        never by handing the desktop user root."""
        ...

    async def connect_guest(self, handle: SlotHandle, port: int) -> GuestStream:
        """A TCP connection to `port` on the slot's own loopback (its network namespace), for
        the host port forwarded to it. OSError when nothing listens there."""
        ...

    async def read_file(self, handle: SlotHandle, path: str, max_bytes: int) -> bytes: ...

    async def write_file(
        self, handle: SlotHandle, path: str, data: bytes, *, user: bool = True
    ) -> None: ...

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        """Gate evidence for this slot, read from the OS."""
        ...

    async def wait_exit(self, handle: SlotHandle) -> str:
        """Return when the slot's init has exited (pidfd): how it ended, in words (its signal
        or exit code, the end of its log), for the quarantine reason."""
        ...

    async def make_template(
        self, image_root: Path, image_sha256: str, checkpoint_id: str, dest: Path
    ) -> CheckpointRef:
        """Cold-boot the image in a slot, wait until drawn and quiescent, dump it."""
        ...

    async def checkpoint_problems(self, path: Path, meta: dict[str, Any]) -> list[str]:
        """What keeps the checkpoint dir at `path` (made elsewhere; `meta` is its meta.json)
        from being restored by this runtime, e.g. images missing or unreadable; [] when none.
        Asked before the dir is adopted."""
        ...

    async def adopt(self, handle: SlotHandle) -> bool:
        """After a daemon restart: True if the slot is alive and is the same process tree
        (supervision resumed), False if it is gone (the caller then destroys it)."""
        ...

    async def sweep(self, live_slot_ids: Sequence[str]) -> list[str]:
        """Remove mounts, cgroups and state dirs of slots not in `live_slot_ids`; return what
        was cleaned."""
        ...


@runtime_checkable
class SpareControl(Protocol):
    """A runtime that keeps frozen restores ("warm spares") of checkpoints ready, so a create,
    reset or fork child from a pooled checkpoint is a thaw instead of a restore."""

    refill_allowed: Callable[[], bool]  # set by the supervisor: admission's word on new desktops

    def enable_spares(self, checkpoint: CheckpointRef, limits: SlotLimits) -> None: ...

    def set_spare_target(self, checkpoint_id: str, n: int) -> None: ...

    async def drop_spares(self, checkpoint_id: str) -> None: ...

    async def forget_checkpoint(self, checkpoint_id: str) -> None:
        """A checkpoint deleted or replaced: its spares and cached image copies go."""
        ...

    def spare_counts(self) -> dict[str, int]: ...


@runtime_checkable
class KsmControl(Protocol):
    """A runtime that merges identical pages of idle desktops (Linux KSM)."""

    def ksm_stats(self) -> dict[str, int | bool]:
        """Whether KSM is on and what it saves right now (for /v1/health and metrics)."""
        ...


@runtime_checkable
class GroupMemoryControl(Protocol):
    """A runtime that limits the memory of all its slots together (one parent cgroup)."""

    async def hold_memory_floor(self, mem_available_mib: float, floor_mib: float) -> int | None:
        """Set the slots' group limit so MemAvailable stays at or above `floor_mib`
        (`core.admission.floor_group_limit_mib`); return the limit in force (MiB, None: none)."""
        ...
