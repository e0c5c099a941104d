"""What the runtime is handed for a record: a slot's running tree as the journal stores it
(SlotHandle <-> JSON), a checkpoint's CheckpointRef, the slot limits; and record ids."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.core.records import CheckpointRecord, SlotRecord
from drumsd.core.seams import CheckpointRef, SlotHandle, SlotLimits


def handle_to_json(handle: SlotHandle) -> dict[str, Any]:
    data = dataclasses.asdict(handle)
    data["root"] = str(handle.root)
    data["upper"] = str(handle.upper)
    data["cgroups"] = dict(handle.cgroups)
    data["namespaces"] = dict(handle.namespaces)
    data["extra"] = json.loads(json.dumps(dict(handle.extra), default=str))
    return data


def handle_from_json(data: Mapping[str, Any]) -> SlotHandle:
    fields = {f.name for f in dataclasses.fields(SlotHandle)}
    values = {k: v for k, v in data.items() if k in fields}
    values["root"] = Path(values["root"])
    values["upper"] = Path(values["upper"])
    return SlotHandle(**values)


def handle_of(rec: SlotRecord) -> SlotHandle:
    """The running tree of a slot, or a conflict while it has none yet."""
    if rec.handle is None:
        raise DrumsdError(
            "conflict", f"slot {rec.id} has no running tree yet; retry shortly", slot=rec.id
        )
    return handle_from_json(rec.handle)


def checkpoint_ref(cp: CheckpointRecord) -> CheckpointRef:
    return CheckpointRef(
        id=cp.id,
        dir=Path(cp.dir),
        lower=Path(cp.lower),
        image_sha256=cp.image_sha256,
        upper_sha256=cp.upper_sha256,
        profile=cp.profile,
    )


def slot_limits(config: Config) -> SlotLimits:
    return SlotLimits(
        vcpus=config.vcpus,
        memory_mib=config.memory_mib,
        swap_mib=config.swap_mib,
        pids_max=config.pids_max,
        tmpfs_mib=config.tmpfs_mib,
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"
