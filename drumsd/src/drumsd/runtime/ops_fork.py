"""capture (a saved checkpoint), prefork (a checkpoint to fork from) and fork (N children
at once)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio
from drums.models import (
    CaptureRequest,
    ForkRequest,
    PreforkRequest,
)

from drumsd.core.errors import DrumsdError
from drumsd.core.leases import (
    checkpoint_lease,
    child_lease,
    prefork_reusable,
    saved_checkpoint_lease,
)
from drumsd.core.records import (
    CheckpointKind,
    CheckpointRecord,
    SlotRecord,
    SlotStatus,
    check_can_capture,
    check_can_fork,
)
from drumsd.core.results import Forked
from drumsd.core.seams import (
    CheckpointRef,
    Quiescence,
    RuntimeError_,
    SaveParent,
    SlotHandle,
    SlotRuntime,
)
from drumsd.guest.protocol import PNG_FULL
from drumsd.linux import state_files
from drumsd.linux.sparse import Usage
from drumsd.runtime.episodes import begin_episode
from drumsd.runtime.failures import failure_text, runtime_failures
from drumsd.runtime.handles import checkpoint_ref, handle_of, new_id, slot_limits
from drumsd.runtime.ops_checkpoints import (
    check_not_deleting,
    delete_checkpoint_record,
    record_gone,
)
from drumsd.runtime.services.spares import enable_spares
from drumsd.runtime.slot_locks import run_stoppable
from drumsd.runtime.teardown import TeardownHost, discard

if TYPE_CHECKING:
    from collections.abc import Callable

    from drumsd.core.config import Config
    from drumsd.core.metrics import MetricsWindow
    from drumsd.core.records import CheckpointRecord, SlotRecord
    from drumsd.runtime.ports import PortForwards
    from drumsd.runtime.slot_table import SlotTable
    from drumsd.runtime.store import RecordStore

log = logging.getLogger("drumsd.supervisor")


class ForkHost(TeardownHost, Protocol):
    """What capture, prefork and fork use of the supervisor."""

    def check_open(self) -> None: ...
    @property
    def checkpoints(self) -> dict[str, CheckpointRecord]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def config(self) -> Config: ...
    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord: ...
    def get_slot(self, slot_id: str, *, renew: bool = True) -> SlotRecord: ...
    @property
    def metrics(self) -> MetricsWindow: ...
    def observe(self, operation: str, slot_id: str | None, seconds: float) -> None: ...
    @property
    def ports(self) -> PortForwards: ...
    def slot_cost_mib(self) -> float: ...
    @property
    def store(self) -> RecordStore: ...
    @property
    def table(self) -> SlotTable: ...


async def capture(sup: ForkHost, slot_id: str, req: CaptureRequest) -> CheckpointRecord:
    sup.check_open()
    sup.get_slot(slot_id)
    mib = sup.config.admission.capture_mib
    sup.admission_book.check_state_space("capture", mib)
    sup.admission_book.admit("capture", mib, mib)
    limit = sup.config.capture_timeout_s
    async with sup.table.locked(slot_id, check_can_capture, op="capture", deadline_s=limit) as rec:
        with capture_deadline(sup, slot_id, "capture"):
            lease = saved_checkpoint_lease(sup.config, rec, req.idle_timeout_s, req.ttl_s)
            cp = await dump(sup, rec, CheckpointKind.saved, lease.idle_timeout_s, lease.ttl_s)
            return cp


async def prefork(sup: ForkHost, slot_id: str, req: PreforkRequest) -> CheckpointRecord:
    sup.check_open()
    rec = sup.get_slot(slot_id)
    reusable = reusable_prefork(sup, rec)
    if reusable is not None:
        return reusable
    mib = sup.config.admission.capture_mib
    sup.admission_book.check_state_space("prefork", mib)
    sup.admission_book.admit("prefork", mib, mib)
    limit = sup.config.capture_timeout_s
    async with sup.table.locked(slot_id, check_can_capture, op="prefork", deadline_s=limit) as rec:
        with capture_deadline(sup, slot_id, "prefork"):
            reusable = reusable_prefork(sup, rec)
            if reusable is not None:
                return reusable
            lease = checkpoint_lease(sup.config, CheckpointKind.prefork, req.idle_timeout_s, None)
            return await dump(sup, rec, CheckpointKind.prefork, lease.idle_timeout_s, lease.ttl_s)


@contextmanager
def capture_deadline(sup: ForkHost, slot_id: str, what: str) -> Iterator[None]:
    """capture_timeout_s over a capture under its slot lock: past it the dump is abandoned (its
    worker threads stop at their next chunk, its half-written checkpoint is removed) and the
    slot is free again; the caller gets a 504 saying so."""
    limit = sup.config.capture_timeout_s
    try:
        with trio.fail_after(limit):
            yield
    except trio.TooSlowError:
        sup.metrics.failure("capture_timeout")
        raise DrumsdError(
            "timeout",
            f"{what} of slot {slot_id} did not finish within capture_timeout_s={limit:g}s and was "
            "abandoned (nothing was saved; the slot runs on and is free for other requests). "
            "If the slot holds much data, delete what it does not need and retry, or raise "
            "capture_timeout_s",
            slot=slot_id,
            timeout_s=limit,
        ) from None


def check_capture_size(sup: ForkHost, rec: SlotRecord, usage: Usage) -> None:
    """A capture copies the data of the slot's files into state_dir: refused (409) past
    admission.capture_max_mib, counting what the files hold, not their apparent size."""
    bound = sup.config.admission.capture_max_mib
    if usage.real_mib <= bound:
        return
    sup.metrics.failure("capture_too_large")
    raise DrumsdError(
        "conflict",
        f"slot {rec.id}'s files hold {usage.real_mib:,.0f} MiB of data ({usage.apparent_mib:,.0f}"
        f" MiB apparent), over admission.capture_max_mib={bound}: a capture copies that data "
        "into state_dir. Delete large files in the slot (`du -xsh ~/* /tmp/*` in the slot shows "
        "them) and capture again, or raise admission.capture_max_mib",
        slot=rec.id,
        real_mib=round(usage.real_mib, 1),
        apparent_mib=round(usage.apparent_mib, 1),
        capture_max_mib=bound,
    )


def reusable_prefork(sup: ForkHost, rec: SlotRecord) -> CheckpointRecord | None:
    now = sup.clock()
    found = [
        cp
        for cp in sup.checkpoints.values()
        if prefork_reusable(cp, rec, now, sup.config.prefork_max_age_s)
    ]
    return max(found, key=lambda c: c.created_at) if found else None


async def dump(
    sup: ForkHost,
    rec: SlotRecord,
    kind: CheckpointKind,
    idle_timeout_s: float | None,
    ttl_s: float | None,
    *,
    task_key: str | None = None,
    before_ready: Callable[[CheckpointRecord], Awaitable[None]] | None = None,
    ready: bool = True,
) -> CheckpointRecord:
    """Dump the slot into a new checkpoint of `kind`. A saved state and a task checkpoint wait
    for a quiet tree first; `before_ready` adds files to the checkpoint dir before it is usable
    (a task checkpoint's run files). With `ready` False the checkpoint is left unready (not
    restorable, dropped at a restart) for the caller to make ready (a task checkpoint, once a
    probe of it passed)."""
    handle = handle_of(rec)
    usage = await run_stoppable(
        state_files.upper_usage, handle.upper, what=f"measuring slot {rec.id}'s upper layer"
    )
    now = sup.clock()
    prefix = {"saved": "st", "prefork": "pf", "template": "tpl", "task": "tk"}[kind.value]
    cp_id = new_id(prefix)
    dest = sup.config.state_dir / "checkpoints" / cp_id
    source = sup.checkpoints.get(rec.checkpoint)
    cp = CheckpointRecord(
        id=cp_id,
        kind=kind,
        created_at=now,
        last_used_at=now,
        idle_timeout_s=idle_timeout_s,
        ttl_s=ttl_s,
        dir=str(dest),
        lower=source.lower if source else "",
        image=rec.image,
        image_sha256=source.image_sha256 if source else "",
        source_slot=rec.id,
        source_episode=rec.episode,
        source_actions=rec.actions,
        task_id=rec.task_id,
        task=rec.task,
        task_key=task_key,
        profile=rec.profile,
        size_mib=usage.real_mib,  # what the dump would copy, until it is measured
        apparent_mib=usage.apparent_mib,
    )
    try:
        check_capture_size(sup, rec, usage)
    except DrumsdError as exc:
        await record_gone(sup, cp, f"refused before dumping: {exc.message}")
        raise
    sup.table.save_checkpoint(cp, "dumping")  # before work: a crash leaves a record to clean
    await sup.store.durable()
    rec.status = SlotStatus.busy
    started = trio.current_time()
    mib = sup.config.admission.capture_mib
    try:
        with (
            sup.admission_book.reserve(kind.value, mib, state_mib=mib),
            runtime_failures(sup.metrics, what=f"dump of slot {rec.id}", slot_id=rec.id),
        ):
            try:
                if kind in SCREEN_ENCODED_KINDS and sup.config.linux.screen_grab != "full":
                    await encode_screen(sup.runtime, handle)
                ref = await quiet_capture(
                    sup,
                    rec,
                    handle,
                    cp_id,
                    dest,
                    window=quiet_window(sup.config, kind),
                    parent=save_parent(sup.config, kind, source),
                )
                if before_ready is not None:
                    await before_ready(cp)
            except BaseException as exc:
                with trio.CancelScope(shield=True):
                    rec.status = SlotStatus.ready
                    why = failure_text(exc, "cancelled (capture_timeout_s or shutdown)")
                    await delete_checkpoint_record(sup, cp, f"dump failed: {why}")
                raise
    finally:
        if rec.status is SlotStatus.busy:
            rec.status = SlotStatus.ready
    cp.upper_sha256 = ref.upper_sha256
    cp.image_sha256 = ref.image_sha256 or cp.image_sha256
    cp.lower = str(ref.lower)
    usage = await run_stoppable(state_files.dir_usage, dest, what=f"measuring {dest}")
    cp.size_mib, cp.apparent_mib = usage.real_mib, usage.apparent_mib
    cp.ready = ready
    sup.table.save_checkpoint(cp, "ready" if ready else "dumped")
    if kind is CheckpointKind.prefork:
        enable_spares(sup, cp)  # a prefork is captured to be branched: make that a thaw
    sup.observe(
        {"saved": "capture", "task": "task_checkpoint"}.get(kind.value, "prefork"),
        rec.id,
        trio.current_time() - started,
    )
    return cp


FORK_SETTLE_S = 5.0


# The captures dumped with the screen encoded first: a fork's prefork (its N children) and a task's
# checkpoint (every later episode of the task restores it, through a warm spare). Without it a
# restored desktop's first screenshot encodes the whole screen: an episode's first step took
# ~95 ms against ~15 ms for the next ones one at a time, and at 8 busy episodes on 2 vCPUs the
# first steps were most of the steps over 300 ms (README, "Density ramp").
SCREEN_ENCODED_KINDS = (CheckpointKind.prefork, CheckpointKind.task)


async def encode_screen(runtime: SlotRuntime, handle: SlotHandle) -> None:
    """The slot's screen encoded as a full-size PNG just before it is dumped (a prefork or a
    task checkpoint: SCREEN_ENCODED_KINDS). The guest keeps the encoded image with the X DAMAGE
    state it was taken at, so the dump holds both and each restore's first PNG screenshot is that
    image again, or only its changed bands re-encoded, unless it drew everywhere since: a fork of
    N pays one encode, not N (a 1080p office screen: ~75 ms of CPU each). Under
    `linux.screen_grab: full` nothing is kept, so nothing is done there. A grab that fails is
    logged and the dump goes on (its restores encode their own)."""
    try:
        await runtime.grab(handle, PNG_FULL)
    except RuntimeError_ as exc:
        log.info(
            "slot=%s screen not encoded before its dump (the dump goes on): %s",
            handle.slot_id,
            exc.message,
        )


def save_parent(
    config: Config, kind: CheckpointKind, source: CheckpointRecord | None
) -> SaveParent | None:
    """What a capture of `kind` is stored against: a saved state's or task checkpoint's, the
    checkpoint its slot was restored from (only what changed since it is stored,
    save_delta_depth deep); a prefork is dumped whole, since its fork waits on it."""
    if kind not in (CheckpointKind.saved, CheckpointKind.task) or config.save_delta_depth == 0:
        return None
    if source is None or not source.ready:
        return None
    return SaveParent(Path(source.dir), config.save_delta_depth)


def quiet_window(config: Config, kind: CheckpointKind) -> tuple[str, float] | None:
    """The quiet window a dump of `kind` waits (the setting's name, seconds), or None: a saved
    state and a task checkpoint wait quiesce.window_s, a prefork prefork_quiesce_window_s when
    set."""
    if kind in (CheckpointKind.saved, CheckpointKind.task):
        return "quiesce.window_s", config.quiesce.window_s
    if kind is CheckpointKind.prefork and config.prefork_quiesce_window_s is not None:
        return "prefork_quiesce_window_s", config.prefork_quiesce_window_s
    return None


async def quiet_capture(
    sup: ForkHost,
    rec: SlotRecord,
    handle: SlotHandle,
    cp_id: str,
    dest: Path,
    *,
    window: tuple[str, float] | None,
    parent: SaveParent | None = None,
) -> CheckpointRef:
    """Capture as documented: with a `window` (a saved state; a prefork when
    prefork_quiesce_window_s is set), wait until the tree is quiescent (no process started or
    exited and none in D or Z state for the window; CPU use does not count, since CRIU freezes
    the tree), then dump; a tree that does not go quiet within quiesce.timeout_s is refused with
    not_quiescent (409) and nothing is dumped. By default a fork's prefork dumps the running
    tree as it is (CRIU freezes it first): a fork is taken mid-episode, with apps still working,
    and does not wait a quiet window or get refused; it only waits (up to FORK_SETTLE_S) for
    zombies and D-state processes to clear.
    A dump that fails is tried again (after another quiet wait for a saved state), up to
    quiesce.max_attempts tries."""
    q = sup.config.quiesce
    deadline = trio.current_time() + q.timeout_s
    for attempt in range(1, q.max_attempts + 1):
        left = deadline - trio.current_time()
        if window is not None:
            setting, window_s = window
            waited = Quiescence(False)
            if left > 0:
                waited = await sup.runtime.quiescent(handle, window_s, left, q.poll_ms)
            if not waited.quiet:
                what = "; ".join(waited.moving) or "nothing seen (no time left to watch)"
                raise RuntimeError_(
                    "not_quiescent",
                    f"slot {rec.id} did not go quiet: processes kept starting, exiting or "
                    f"waiting on I/O for all of quiesce.timeout_s={q.timeout_s:g}s (quiet means "
                    f"none did for {setting}={window_s:g}s; try {attempt} of "
                    f"{q.max_attempts}); last seen moving: {what}. Let the app finish what it is "
                    f"doing (POST /v1/slots/{rec.id}/quiescent says when) and capture again, or "
                    "raise quiesce.timeout_s",
                    attempts=attempt,
                    moving=list(waited.moving),
                )
        elif left > 0:
            # A fork does not wait a quiet window, but a zombie or a process mid-I/O makes the
            # dump fail (CRIU: "Zombies with threads are not supported"): let those clear first,
            # briefly, and dump anyway after (a failed dump is tried again below).
            await sup.runtime.quiescent(handle, 0.0, min(left, FORK_SETTLE_S), q.poll_ms)
        try:
            return await sup.runtime.capture(handle, cp_id, dest, parent=parent)
        except RuntimeError_ as exc:
            # A kernel limit (named in detail) stops every try alike: no retry helps.
            if exc.code != "runtime_error" or "limit" in exc.detail or attempt == q.max_attempts:
                raise
            log.warning(
                "slot=%s episode=%s capture try %d of %d failed, trying again once quiet: %s",
                rec.id,
                rec.episode,
                attempt,
                q.max_attempts,
                exc.message,
            )
    raise AssertionError("unreachable: the last try returns or raises")


async def fork(sup: ForkHost, slot_id: str, req: ForkRequest) -> Forked:
    sup.check_open()
    rec = sup.get_slot(slot_id)
    started = trio.current_time()
    source = None
    if req.prefork is not None:
        source = sup.get_checkpoint(req.prefork)
        if source.kind is CheckpointKind.template or not source.ready:
            raise DrumsdError(
                "invalid_request",
                f"checkpoint {source.id} is a {source.kind.value}, not a ready prefork or "
                "saved state of this slot",
                field="prefork",
            )
        check_not_deleting(source)
    else:
        source = reusable_prefork(sup, rec)
    children_cost = sup.slot_cost_mib() * req.n
    cost = children_cost
    state_mib = 0.0
    if source is None:
        cost += sup.config.admission.capture_mib
        state_mib = sup.config.admission.capture_mib
    sup.admission_book.check_state_space("fork", state_mib)  # the children's restores too
    sup.admission_book.admit("fork", cost, state_mib)
    async with sup.table.locked(slot_id, check_can_fork) as rec:
        if source is None:
            source = reusable_prefork(sup, rec)
        if source is None:
            lease = checkpoint_lease(sup.config, CheckpointKind.prefork, None, None)
            with capture_deadline(sup, slot_id, "the prefork of a fork"):
                source = await dump(
                    sup, rec, CheckpointKind.prefork, lease.idle_timeout_s, lease.ttl_s
                )
        now = sup.clock()
        lease = child_lease(sup.config, rec, req.idle_timeout_s, req.ttl_s)
        children = []
        for _ in range(req.n):
            child = SlotRecord(
                id=new_id("s"),
                created_at=now,
                last_used_at=now,
                idle_timeout_s=lease.idle_timeout_s,
                ttl_s=lease.ttl_s,
                checkpoint=source.id,
                image=rec.image,
                parent=rec.id,
                profile=rec.profile,
                labels=dict(rec.labels),
                task_id=rec.task_id,
                task=rec.task,
            )
            children.append(child)
        try:
            for child in children:
                await sup.ports.assign(child)
        except BaseException:
            for child in children:  # numbers not yet saved are free again; listeners close
                child.status = SlotStatus.destroyed
                sup.ports.saved(child)
            raise
        for child in children:
            sup.table.save_slot(child, "created")
        source.last_used_at = now
        sup.table.save_checkpoint(source, "used")
        await sup.store.durable()  # the children's records before their restores
        with (
            sup.admission_book.reserve("fork", children_cost),
            runtime_failures(sup.metrics, what=f"fork of slot {slot_id}", slot_id=slot_id),
        ):
            try:
                handles = await sup.runtime.fork(
                    handle_of(rec),
                    checkpoint_ref(source),
                    [c.id for c in children],
                    slot_limits(sup.config),
                )
            except BaseException as exc:
                with trio.CancelScope(shield=True):
                    why = failure_text(exc, "fork was cancelled")
                    for child in children:
                        await discard(sup, child, why)
                raise
    # The children start their episodes at once: each start reads its gate evidence (a hash
    # of its whole upper), and one after another the last child's episode began seconds
    # after its desktop was restored and running.
    async with trio.open_nursery() as nursery:
        for child, handle in zip(children, handles, strict=True):
            nursery.start_soon(partial(begin_child_episode, sup), child, handle)
    elapsed = trio.current_time() - started
    sup.observe("fork", slot_id, elapsed)
    return Forked(parent=slot_id, children=children, checkpoint=source.id, elapsed_s=elapsed)


async def begin_child_episode(sup: ForkHost, child: SlotRecord, handle: SlotHandle) -> None:
    async with sup.table.lock(child.id):
        await begin_episode(sup, child, handle, "ready")
