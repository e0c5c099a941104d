"""Reconcile after a (re)start, and the template checkpoints built from the desktop images."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from drumsd.core import gates as G
from drumsd.core.records import (
    CheckpointKind,
    CheckpointRecord,
    SlotStatus,
    is_live,
)
from drumsd.core.seams import (
    RuntimeError_,
)
from drumsd.linux import state_files
from drumsd.runtime.episodes import finish_episode, judge_alive_after, track, watch_exit
from drumsd.runtime.failures import bounded_cleanup
from drumsd.runtime.handles import handle_from_json
from drumsd.runtime.ops_checkpoints import delete_checkpoint_record
from drumsd.runtime.services.spares import enable_spares
from drumsd.runtime.store import snapshot_of
from drumsd.runtime.teardown import TeardownHost, archive

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from drumsd.core.config import Config
    from drumsd.core.metrics import MetricsWindow
    from drumsd.core.records import CheckpointRecord, SlotRecord
    from drumsd.runtime.slot_table import SlotTable
    from drumsd.runtime.store import RecordStore

log = logging.getLogger("drumsd.supervisor")

# A template build that fails (a cold boot timing out on a loaded host, mostly) is tried again
# after TEMPLATE_RETRY_S x the attempt number, up to TEMPLATE_ATTEMPTS in all.
TEMPLATE_ATTEMPTS = 3
TEMPLATE_RETRY_S = 5.0


class TemplatesHost(TeardownHost, Protocol):
    """What reconcile and the template builds use of the supervisor."""

    @property
    def checkpoints(self) -> dict[str, CheckpointRecord]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def config(self) -> Config: ...
    def gate_statuses(self, rec: SlotRecord) -> dict[str, str]: ...
    @property
    def metrics(self) -> MetricsWindow: ...

    reconciled: dict[str, list[str]]

    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None: ...
    @property
    def store(self) -> RecordStore: ...
    @property
    def table(self) -> SlotTable: ...
    @property
    def template_status(self) -> dict[str, str]: ...


async def reconcile(sup: TemplatesHost) -> dict[str, list[str]]:
    """After a (re)start: adopt live slots, mark dead ones down and clean them, drop unfinished
    checkpoints, sweep what no record owns, compact the journal."""
    state = await sup.store.load()
    sup.table.load(state.slots, state.checkpoints)
    report: dict[str, list[str]] = {"adopted": [], "down": [], "swept": [], "dropped": []}
    for cp in list(sup.checkpoints.values()):
        exists = await trio.to_thread.run_sync(Path(cp.dir).exists)
        if not cp.ready or not exists:
            await delete_checkpoint_record(sup, cp, "unfinished or missing after restart")
            report["dropped"].append(cp.id)
    for rec in list(sup.slots.values()):
        if rec.status is SlotStatus.destroyed:
            continue
        if rec.status is SlotStatus.failed:
            # Already down: make sure nothing of it remains (destroy is idempotent).
            await bounded_cleanup(
                sup.nursery,
                "cleanup",
                rec.id,
                sup.config.cleanup_timeout_s,
                sup.runtime.destroy,
                rec.id,
            )
            continue
        alive = False
        if rec.handle is not None:
            try:
                alive = await sup.runtime.adopt(handle_from_json(rec.handle))
            except RuntimeError_ as exc:
                log.warning("slot=%s adopt failed: %s", rec.id, exc.message)
        if alive:
            if rec.status in (SlotStatus.busy, SlotStatus.creating):
                rec.status = SlotStatus.ready
            sup.table.save_slot(rec, "adopted")
            report["adopted"].append(rec.id)
            handle = handle_from_json(rec.handle or {})
            await track(sup, rec.id, handle)
            sup.spawn(watch_exit, sup, rec.id, rec.episode_id, handle)
            if sup.gate_statuses(rec).get("alive_after_resume") == G.PENDING:
                sup.spawn(judge_alive_after, sup, rec.id, rec.episode_id)
            continue
        await bounded_cleanup(
            sup.nursery,
            "cleanup",
            rec.id,
            sup.config.cleanup_timeout_s,
            sup.runtime.destroy,
            rec.id,
        )
        was = rec.status.value
        rec.failure = rec.failure or f"down after daemon restart (was {was})"
        if rec.status is SlotStatus.creating:
            rec.status = SlotStatus.destroyed
            rec.destroyed_at = sup.clock()
            sup.table.save_slot(rec, "rejected (daemon stopped during create)")
            await archive(sup, rec)
        else:
            finish_episode(sup, rec)
            rec.status = SlotStatus.failed
            sup.table.save_slot(rec, "down")
        report["down"].append(rec.id)
    live = [r.id for r in sup.slots.values() if is_live(r)]
    try:
        report["swept"] = list(await sup.runtime.sweep(live))
    except RuntimeError_ as exc:
        log.error("sweep failed: %s", exc.message)
    # A capture (a save, a prefork, a task checkpoint) killed with the daemon before its record
    # was written leaves a directory no record names: nothing would ever delete it.
    owned = {Path(cp.dir) for cp in sup.checkpoints.values()}
    orphans = await trio.to_thread.run_sync(
        state_files.sweep_unowned_dirs, sup.config.state_dir / "checkpoints", owned, ("bench-",)
    )
    if orphans:
        log.warning("reconcile: removed checkpoint dirs no record names: %s", ", ".join(orphans))
    report["swept"] += orphans
    await sup.store.compact(partial(snapshot_of, sup))
    sup.reconciled = report
    log.info("reconciled: %s", {k: len(v) for k, v in report.items()})
    return report


async def start_template_builds(sup: TemplatesHost) -> None:
    image = await default_image(sup)
    if image is None:
        name = sup.config.default_image
        sup.template_status[name] = (
            f"no image: set lower and image_sha256, or build one with `drumsd image build "
            f"--profile {name}` into {sup.config.images_dir}"
        )
        return
    name, root, sha = image
    if sup.config.image_sha256 and sha != sup.config.image_sha256:
        sup.template_status[name] = (
            f"refused: image {root} has sha256 {sha}, config image_sha256 is "
            f"{sup.config.image_sha256}; rebuild the image or update the config"
        )
        log.error("image=%s %s", name, sup.template_status[name])
        return
    # A template booted with the /proc view holds its binds and the sysinfo() library (-pvs: the
    # view's templates from before the library are not reused): one without is another template.
    cp_id = f"tpl-{name}-{sha[:12]}" + ("-pvs" if sup.config.procview_dir else "")
    existing = sup.checkpoints.get(cp_id)
    if existing is not None and existing.ready:
        sup.template_status[name] = "ready"
        enable_spares(sup, existing)
        return
    sup.template_status[name] = "building"
    sup.spawn(build_template, sup, name, root, sha, cp_id)


async def default_image(sup: TemplatesHost) -> tuple[str, Path, str] | None:
    name = sup.config.default_image
    if sup.config.lower is not None:
        return name, sup.config.lower, sup.config.image_sha256 or ""
    found = await trio.to_thread.run_sync(state_files.find_image, sup.config.images_dir, name)
    if found is None:
        return None
    root, sha = found
    return name, root, sha


async def build_template(sup: TemplatesHost, name: str, root: Path, sha: str, cp_id: str) -> None:
    dest = sup.config.state_dir / "templates" / cp_id
    now = sup.clock()
    ref = None
    for attempt in range(1, TEMPLATE_ATTEMPTS + 1):
        log.info(
            "image=%s building template checkpoint %s from %s (attempt %d of %d)",
            name,
            cp_id,
            root,
            attempt,
            TEMPLATE_ATTEMPTS,
        )
        try:
            ref = await sup.runtime.make_template(root, sha, cp_id, dest)
            break
        except RuntimeError_ as exc:
            sup.metrics.failure("template")
            log.error(
                "image=%s template build attempt %d of %d failed: %s: %s",
                name,
                attempt,
                TEMPLATE_ATTEMPTS,
                exc.code,
                exc.message,
            )
            if attempt == TEMPLATE_ATTEMPTS:
                sup.template_status[name] = (
                    f"error: {exc.code}: {exc.message} (after {attempt} attempts; see the "
                    "daemon log, fix the image or the host and restart drumsd)"
                )
                return
            sup.template_status[name] = (
                f"building (attempt {attempt + 1} of {TEMPLATE_ATTEMPTS}; the last failed: "
                f"{exc.code}: {exc.message})"
            )
            # A cold boot that timed out on a loaded host often passes once the load passes.
            await trio.sleep(TEMPLATE_RETRY_S * attempt)
    assert ref is not None
    cp = CheckpointRecord(
        id=cp_id,
        kind=CheckpointKind.template,
        created_at=now,
        last_used_at=now,
        dir=str(ref.dir),
        lower=str(ref.lower),
        image=name,
        image_sha256=ref.image_sha256 or sha,
        upper_sha256=ref.upper_sha256,
        profile=ref.profile,
        ready=True,
    )
    sup.table.save_checkpoint(cp, "template_ready")
    sup.template_status[name] = "ready"
    enable_spares(sup, cp)
