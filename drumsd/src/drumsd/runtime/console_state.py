"""What the console shows that the records do not hold: each slot's last screenshot and last
verify, each slot's recent steps (the episode timeline) and the host's samples over time. Memory
only: a restart starts them empty."""

from __future__ import annotations

from typing import Any

from drums.models import StepRequest, VerifyResult

from drumsd.core import step_log
from drumsd.core.host_history import HostHistory
from drumsd.core.records import SlotRecord


class ConsoleState:
    def __init__(self) -> None:
        self.last_screenshot: dict[str, bytes] = {}  # slot -> PNG (also archived with the slot)
        self.last_verify: dict[str, VerifyResult] = {}
        self.step_log = step_log.StepLog()
        self.history = HostHistory()

    def log_step(
        self, rec: SlotRecord, req: StepRequest, started: float, elapsed: float, **how: Any
    ) -> None:
        """One step in the slot's episode timeline (see core/step_log.py)."""
        if req.action is None:  # a dialect step: its calls' names
            calls = [c.get("name") or c.get("action") or c.get("type") for c in req.actions or []]
            action: str | dict[str, Any] = {"type": str(req.dialect), "keys": calls}
        else:
            action = req.action if isinstance(req.action, str) else req.action.model_dump()
        kind, detail = step_log.describe(action)
        self.step_log.add(
            rec.id,
            step_log.Step(
                episode=rec.episode,
                episode_id=rec.episode_id,
                index=rec.actions,
                action=kind,
                detail=detail,
                started_at=started,
                elapsed_s=round(elapsed, 4),
                **how,
            ),
        )

    def forget(self, slot_id: str) -> None:
        """A destroyed slot (its record and archive keep what matters)."""
        self.last_screenshot.pop(slot_id, None)
        self.step_log.forget(slot_id)
