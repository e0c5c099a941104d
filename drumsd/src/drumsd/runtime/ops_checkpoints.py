"""Checkpoints: which one a create restores, adopting one from disk, deleting one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio
from drums.models import (
    CheckpointAdopt,
    SlotCreate,
)

from drumsd.core.errors import DrumsdError
from drumsd.core.leases import (
    checkpoint_lease,
)
from drumsd.core.records import (
    CheckpointKind,
    CheckpointRecord,
    KnownImage,
    SlotStatus,
    adoption_problems,
    is_live,
)
from drumsd.core.retention import checkpoint_gone, checkpoint_summary
from drumsd.linux import state_files
from drumsd.runtime.forgotten import write_checkpoint_record
from drumsd.runtime.handles import new_id
from drumsd.runtime.services.spares import SparesHost, forget_spares

if TYPE_CHECKING:
    from collections.abc import Callable

    from drumsd.core.config import Config
    from drumsd.core.records import CheckpointRecord, SlotRecord
    from drumsd.runtime.slot_table import SlotTable
    from drumsd.runtime.store import RecordStore

log = logging.getLogger("drumsd.supervisor")


class CheckpointsHost(SparesHost, Protocol):
    """What the checkpoint operations use of the supervisor."""

    @property
    def checkpoints(self) -> dict[str, CheckpointRecord]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def config(self) -> Config: ...
    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord: ...
    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    @property
    def store(self) -> RecordStore: ...
    @property
    def table(self) -> SlotTable: ...
    @property
    def template_status(self) -> dict[str, str]: ...


def resolve_source(sup: CheckpointsHost, req: SlotCreate) -> CheckpointRecord:
    if req.image and req.from_state:
        raise DrumsdError(
            "invalid_request", "give either image or from_state, not both", field="image"
        )
    cp: CheckpointRecord | None
    if req.from_state:
        cp = sup.get_checkpoint(req.from_state)
        check_not_deleting(cp)
    else:
        name = req.image or sup.config.default_image
        cp = sup.checkpoints.get(name) or template_for(sup, name)
        if cp is None:
            status = sup.template_status.get(name)
            if status == "building":
                raise DrumsdError(
                    "runtime_error",
                    f"the template checkpoint of image {name!r} is being built; retry soon",
                    retry_after_s=10.0,
                )
            raise DrumsdError(
                "not_found",
                f"no template checkpoint for image {name!r}"
                + (f" ({status})" if status else "")
                + f"; build it with `drumsd image build --profile {name}` and restart, "
                "or name a saved state with from_state",
                image=name,
            )
    if not cp.ready:
        raise DrumsdError("conflict", f"checkpoint {cp.id} is still being written; retry shortly")
    return cp


def template_for(sup: CheckpointsHost, image: str) -> CheckpointRecord | None:
    found = [
        cp
        for cp in sup.checkpoints.values()
        if cp.kind is CheckpointKind.template and cp.image == image and cp.ready
    ]
    return max(found, key=lambda c: c.created_at) if found else None


def referenced_checkpoints(sup: CheckpointsHost) -> set[str]:
    """What live (or failed) slots restore from, and the sources their task setups run on."""
    held = [s for s in sup.slots.values() if is_live(s) or s.status is SlotStatus.failed]
    return {s.checkpoint for s in held} | {s.task_source for s in held if s.task_source}


async def adopt_checkpoint(sup: CheckpointsHost, req: CheckpointAdopt) -> CheckpointRecord:
    path = Path(req.path)
    if not path.is_absolute():
        raise DrumsdError("invalid_request", f"path {req.path!r} must be absolute", field="path")
    is_dir = await trio.to_thread.run_sync(path.is_dir)
    if not is_dir:
        raise DrumsdError(
            "invalid_request",
            f"{req.path} is not a directory; give a checkpoint dir with images/, upper/ and "
            "meta.json",
            field="path",
        )
    meta: dict[str, Any] = {}
    try:
        meta = await trio.to_thread.run_sync(state_files.read_checkpoint_meta, path)
    except (OSError, ValueError) as exc:
        raise DrumsdError(
            "invalid_request", f"{path}/meta.json is missing or not JSON ({exc})", field="path"
        ) from None
    if not isinstance(meta, dict):
        raise DrumsdError("invalid_request", f"{path}/meta.json must be an object")
    images, served = await known_images(sup)
    problems = adoption_problems(meta, images, sup.config.profile, served)
    problems += await sup.runtime.checkpoint_problems(path, meta)
    if problems:
        raise DrumsdError(
            "invalid_request",
            f"refused to adopt {path}: " + "; ".join(problems) + ". Nothing was registered; "
            "fix the dir (or make it again with a capture) and retry",
            field="path",
            problems=problems,
        )
    kind = CheckpointKind(req.kind)
    now = sup.clock()
    lease = checkpoint_lease(sup.config, kind, None, None)
    cp = CheckpointRecord(
        id=new_id("tpl" if kind is CheckpointKind.template else "st"),
        kind=kind,
        created_at=now,
        last_used_at=now,
        idle_timeout_s=lease.idle_timeout_s,
        ttl_s=lease.ttl_s,
        dir=str(path),
        # the image's root on this host, wherever it was on the host that made the dump
        lower=images[meta["image_sha256"]].root,
        image=req.image or meta.get("image"),
        image_sha256=meta["image_sha256"],
        upper_sha256=meta.get("upper_sha256"),
        profile=sup.config.profile,
        ready=True,
    )
    sup.table.save_checkpoint(cp, "adopted")
    return cp


async def known_images(sup: CheckpointsHost) -> tuple[dict[str, KnownImage], set[str]]:
    """The desktop images on this host a checkpoint may have been made from (the builder's,
    the configured `lower`, those of the template checkpoints built here), and the guest keys of
    the images this daemon's templates were built from."""
    found = await trio.to_thread.run_sync(state_files.known_images, sup.config.images_dir)
    if sup.config.lower is not None and sup.config.image_sha256:
        found.setdefault(sup.config.image_sha256, KnownImage(str(sup.config.lower)))
    served: set[str] = set()
    for cp in sup.checkpoints.values():
        if cp.kind is CheckpointKind.template and cp.ready and cp.image_sha256 and cp.lower:
            image = found.setdefault(cp.image_sha256, KnownImage(cp.lower))
            if image.guest_key:
                served.add(image.guest_key)
    return found, served


def check_not_deleting(cp: CheckpointRecord) -> None:
    if cp.delete_when_unused:
        raise DrumsdError(
            "conflict",
            f"checkpoint {cp.id} is being deleted (once the slots restored from it are "
            "destroyed); start from another state",
        )


async def delete_unused_checkpoints(sup: CheckpointsHost) -> list[str]:
    """Delete what no live slot restores from any more: checkpoints marked delete_when_unused
    and preforks whose source slot is gone."""
    referenced = referenced_checkpoints(sup)
    done = []
    for cp in list(sup.checkpoints.values()):
        if cp.id in referenced or cp.kind is CheckpointKind.template:
            continue
        source = sup.slots.get(cp.source_slot or "")
        source_gone = source is None or source.status is SlotStatus.destroyed
        if cp.delete_when_unused or (cp.kind is CheckpointKind.prefork and source_gone):
            why = "deleted when unused" if cp.delete_when_unused else "source slot destroyed"
            await delete_checkpoint_record(sup, cp, f"{why}, its last slot gone")
            done.append(cp.id)
    return done


async def delete_checkpoint(
    sup: CheckpointsHost, checkpoint_id: str, when_unused: bool = False
) -> CheckpointRecord:
    cp = sup.get_checkpoint(checkpoint_id)
    if cp.kind is CheckpointKind.template:
        raise DrumsdError(
            "conflict",
            f"{cp.id} is the template checkpoint of image {cp.image}; it is rebuilt from the "
            "image and cannot be deleted by API",
        )
    users = sorted(s.id for s in sup.slots.values() if is_live(s) and s.checkpoint == cp.id)
    if users and when_unused:
        cp.delete_when_unused = True
        sup.table.save_checkpoint(cp, f"delete when unused (live slots {', '.join(users)})")
        log.info("checkpoint=%s deleted once slots %s are destroyed", cp.id, ", ".join(users))
        return cp
    if users:
        raise DrumsdError(
            "conflict",
            f"checkpoint {cp.id} is restored by live slots {', '.join(users)}; destroy them "
            "first, or DELETE with ?when_unused=true to delete it when the last one goes",
            slots=users,
        )
    await delete_checkpoint_record(sup, cp, "api")
    return cp


async def delete_checkpoint_record(sup: CheckpointsHost, cp: CheckpointRecord, reason: str) -> None:
    # Its record in forgotten_dir first: once the API answers 404 for it, the record is there.
    await record_gone(sup, cp, reason)
    sup.checkpoints.pop(cp.id, None)
    await forget_spares(sup, cp.id)
    sup.store.delete("checkpoint", cp.id, f"deleted ({reason})", sup.clock())
    owned = sup.config.state_dir / "checkpoints"
    if Path(cp.dir).parent == owned:  # never remove a directory we only adopted
        await sup.store.durable()  # the record goes before its files
        await trio.to_thread.run_sync(state_files.remove_tree, Path(cp.dir))
    log.info("checkpoint=%s deleted: %s", cp.id, reason)


async def record_gone(sup: CheckpointsHost, cp: CheckpointRecord, reason: str) -> None:
    """Leave the deleted state's or rejected dump's record in forgotten_dir (the reaper caps
    them with the summaries); a record that cannot be written is logged, never an error."""
    gone = checkpoint_gone(cp)
    if gone is None:
        return
    summary = checkpoint_summary(cp, gone, reason, sup.clock())
    try:
        await trio.to_thread.run_sync(
            write_checkpoint_record, sup.config.forgotten_dir, gone, summary
        )
    except OSError as exc:
        log.error("checkpoint=%s could not write its record to forgotten_dir: %s", cp.id, exc)
