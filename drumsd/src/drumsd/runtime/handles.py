"""A slot's running tree as the journal stores it (SlotHandle <-> JSON), and record ids."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drumsd.core.seams import SlotHandle


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


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"
