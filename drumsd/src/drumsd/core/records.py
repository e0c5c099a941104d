"""Slot and checkpoint records: what the journal stores, with a status enum and pure checks.

Every operation is refresh -> check -> effect -> save; the checks here say whether an operation
may start from a record's current status, and raise a typed error naming the status otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from drumsd.core.errors import DrumsdError


class SlotStatus(StrEnum):
    creating = "creating"  # record written, restore not yet answered
    ready = "ready"
    busy = "busy"  # a long operation (reset, capture) holds the slot
    quarantined = "quarantined"
    failed = "failed"  # restore failed or the process tree is gone; destroy to clean up
    destroyed = "destroyed"


LIVE_STATUSES = frozenset(
    {SlotStatus.creating, SlotStatus.ready, SlotStatus.busy, SlotStatus.quarantined}
)


class CheckpointKind(StrEnum):
    template = "template"
    saved = "saved"
    prefork = "prefork"
    task = "task"  # a task's setup done on a source checkpoint (core/task_checkpoints.py)


class Record(BaseModel):
    """Records tolerate unknown keys so an older daemon can read a newer journal."""

    model_config = ConfigDict(extra="ignore")

    id: str
    rev: int = 0  # bumped on every save; the journal keeps the highest
    created_at: float
    last_used_at: float
    idle_timeout_s: float | None = None
    ttl_s: float | None = None


class GateEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    status: str = "pending"  # pass | fail | pending
    evidence: dict[str, Any] = Field(default_factory=dict)
    checked_at: float | None = None


class SlotRecord(Record):
    status: SlotStatus = SlotStatus.creating
    checkpoint: str
    image: str | None = None
    parent: str | None = None
    profile: str = "hardened"
    labels: dict[str, str] = Field(default_factory=dict)
    episode: int = 0
    episode_id: str = ""
    episode_started_at: float | None = None
    actions: int = 0
    last_action: str | None = None
    terminal: str | None = None  # done | fail, the episode's terminal action
    task_id: str | None = None
    task: dict[str, Any] | None = None
    # Task checkpoints: the checkpoint the task's setup runs on (rec.checkpoint is the task
    # checkpoint while an episode restored one), and whether this episode's setup was
    # "cached" (restored) or "replayed" (its steps ran); None without a task.
    task_source: str | None = None
    task_setup: Literal["cached", "replayed"] | None = None
    gates: list[GateEntry] = Field(default_factory=list)
    baseline: dict[str, Any] = Field(default_factory=dict)  # facts at episode start
    quarantine_reason: str | None = None
    quarantined_gates: list[str] = Field(default_factory=list)  # failures already acted on
    failure: str | None = None
    handle: dict[str, Any] | None = None  # the runtime's SlotHandle, as JSON
    number: int | None = None  # from slot_range, kept across resets
    ports: dict[int, int] = Field(default_factory=dict)  # guest port -> host port (loopback)
    destroyed_at: float | None = None
    verdicts: list[str] = Field(default_factory=list)  # verdict of each finished episode


class CheckpointRecord(Record):
    kind: CheckpointKind
    dir: str
    lower: str = ""
    image: str | None = None
    image_sha256: str = ""
    upper_sha256: str | None = None
    source_slot: str | None = None
    source_episode: int | None = None
    source_actions: int | None = None  # the slot's action count when dumped (prefork reuse)
    task_id: str | None = None
    task: dict[str, Any] | None = None
    task_key: str | None = None  # a task checkpoint's key (core/task_checkpoints.py)
    task_source: str | None = None  # the checkpoint a task checkpoint's setup ran on
    profile: str = "hardened"
    size_mib: float = 0.0  # what its files hold (allocated blocks): a sparse file's data only
    apparent_mib: float = 0.0  # what its files say (st_size): holes included
    ready: bool = False  # false until the dump finished; unready ones are cleaned on start
    # DELETE ?when_unused=true while live slots restore from it: no new slot may start from
    # it, and it is deleted when the last of them is destroyed.
    delete_when_unused: bool = False


def _refuse(record: SlotRecord, operation: str) -> DrumsdError:
    if record.status is SlotStatus.destroyed:
        return DrumsdError(
            "env_gone",
            f"slot {record.id} was destroyed; create a new slot",
            slot=record.id,
        )
    if record.status is SlotStatus.quarantined:
        return DrumsdError(
            "quarantined",
            f"slot {record.id} is quarantined ({record.quarantine_reason}); release and reset it, "
            "or destroy it",
            slot=record.id,
            reason=record.quarantine_reason,
        )
    if record.status is SlotStatus.failed:
        return DrumsdError(
            "env_gone",
            f"slot {record.id} failed ({record.failure}); destroy it and create a new one",
            slot=record.id,
            failure=record.failure,
        )
    return DrumsdError(
        "conflict",
        f"slot {record.id} is {record.status.value}; {operation} needs a ready slot, retry shortly",
        slot=record.id,
        status=record.status.value,
    )


def check_can_step(record: SlotRecord) -> None:
    if record.status is not SlotStatus.ready:
        raise _refuse(record, "step")


def check_can_observe(record: SlotRecord) -> None:
    """Screenshots and metrics of a quarantined slot stay available for debugging."""
    if record.status not in (SlotStatus.ready, SlotStatus.quarantined):
        raise _refuse(record, "screenshot")


def check_can_reset(record: SlotRecord) -> None:
    if record.status is SlotStatus.quarantined:
        raise _refuse(record, "reset")
    if record.status is not SlotStatus.ready:
        raise _refuse(record, "reset")


def check_can_fork(record: SlotRecord) -> None:
    if record.status is not SlotStatus.ready:
        raise _refuse(record, "fork")


def check_can_capture(record: SlotRecord) -> None:
    if record.status is not SlotStatus.ready:
        raise _refuse(record, "capture")


def check_can_verify(record: SlotRecord) -> None:
    if record.status is not SlotStatus.ready:
        raise _refuse(record, "verify")


def check_can_quarantine(record: SlotRecord) -> None:
    if record.status not in (SlotStatus.ready, SlotStatus.quarantined, SlotStatus.busy):
        raise _refuse(record, "quarantine")


def check_can_release(record: SlotRecord) -> None:
    if record.status is not SlotStatus.quarantined:
        raise DrumsdError(
            "conflict",
            f"slot {record.id} is {record.status.value}, not quarantined; nothing to release",
            slot=record.id,
        )


def check_is_known(record: SlotRecord | None, slot_id: str) -> SlotRecord:
    if record is None:
        raise DrumsdError("not_found", f"no slot {slot_id!r}; list slots with GET /v1/slots")
    return record


def check_not_destroyed(record: SlotRecord) -> None:
    if record.status is SlotStatus.destroyed:
        raise _refuse(record, "this")


def is_live(record: SlotRecord) -> bool:
    return record.status in LIVE_STATUSES


@dataclass(frozen=True)
class KnownImage:
    """A desktop image on this host: its root, and the hash of the guest agent sources it was
    built with (image.json's guest_sha256; None when unknown, e.g. a configured `lower`)."""

    root: str
    guest_key: str | None = None


def adoption_problems(
    meta: Mapping[str, Any],
    known_images: Mapping[str, KnownImage],
    profile: str,
    template_guest_keys: set[str],
) -> list[str]:
    """What keeps a checkpoint dir made elsewhere (its meta.json) from being restored here,
    beyond its files: the desktop image it was dumped from must be on this host (by sha256,
    `known_images`); that image's guest agent must be the one this daemon's templates run
    (`template_guest_keys`, when known: an older agent may not speak the daemon's protocol);
    and it must have been made under this daemon's profile (hardened dumps run in a user
    namespace, trusted ones without). [] when none."""
    problems: list[str] = []
    sha = meta.get("image_sha256")
    if not isinstance(sha, str) or not sha:
        problems.append(
            "meta.json names no image_sha256 (the desktop image the dump was made from)"
        )
    elif sha not in known_images:
        problems.append(
            f"image {sha[:12]}... that the dump was made from is not on this host (known: "
            + (", ".join(k[:12] + "..." for k in sorted(known_images)) or "none")
            + "); build or copy that image first"
        )
    else:
        guest = known_images[sha].guest_key
        if guest and template_guest_keys and guest not in template_guest_keys:
            problems.append(
                f"image {sha[:12]}... carries guest agent {guest[:12]}..., this daemon's "
                "templates run "
                + ", ".join(sorted(k[:12] + "..." for k in template_guest_keys))
                + ": capture the state again from a desktop of the current image"
            )
    made_under = meta.get("profile")
    if made_under != profile:
        problems.append(
            f"meta.json says profile {made_under!r}, this daemon runs {profile!r}: adopt it on "
            f"a daemon with profile {made_under!r}, or capture the state again here"
            if made_under
            else f"meta.json names no profile; this daemon runs {profile!r} (add it if the "
            "dump was made under that profile)"
        )
    return problems
