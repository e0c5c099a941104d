"""Seams to the task bridge (`drumsd.tasks`): loading tasks into slots and verifying episodes.

The supervisor owns gates and validity; the bridge owns task files, setup steps, checkers and
the reward audit. Until a bridge is wired in, the placeholders answer "no task loaded".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from drums.models import TaskInfo, VerifyResult

from drumsd.core.errors import DrumsdError
from drumsd.core.records import SlotRecord
from drumsd.core.seams import SlotHandle
from drumsd.core.task_checkpoints import SetupFingerprint


@runtime_checkable
class Verifier(Protocol):
    async def verify(self, slot_record: SlotRecord, handle: SlotHandle) -> VerifyResult:
        """Run the checker of the slot's task (record.task / record.task_id) on its current
        state. Fill score, checker_error, audit, task_id, last_action, actions; the supervisor
        then sets valid, verdict, failed_gates, invalid_reasons and trusted from the gates."""
        ...


@runtime_checkable
class TaskCatalog(Protocol):
    def list_tasks(self) -> list[TaskInfo]: ...

    def get_task(self, task_id: str) -> TaskInfo | None: ...

    async def load(
        self, slot_record: SlotRecord, handle: SlotHandle, task: str | dict[str, Any]
    ) -> tuple[TaskInfo, dict[str, Any]]:
        """Resolve a task (id, JSON path or inline) and run its setup in the slot. Returns the
        task's info and its JSON (kept in the slot record for verify). Raises DrumsdError
        (unsupported_task, not_found, invalid_request, timeout) when it cannot."""
        ...

    def forget_slot(self, slot_id: str) -> None:
        """The slot is destroyed: drop what its episodes left (task-run dirs)."""
        ...


@runtime_checkable
class TaskSetupCache(Protocol):
    """What a task catalog offers for task checkpoints (runtime/ops_task_checkpoints.py)."""

    async def setup_fingerprint(
        self, task: str | dict[str, Any], *, enabled: bool
    ) -> SetupFingerprint:
        """Everything the task's setup depends on but its source checkpoint; DrumsdError
        (not_found, invalid_request) when the task cannot be resolved."""
        ...

    async def keep_run_files(self, slot_id: str, checkpoint_dir: Path) -> None:
        """Copy what the slot's setup left on the host (its run dir) into the checkpoint dir."""
        ...

    async def load_cached(
        self,
        slot_record: SlotRecord,
        handle: SlotHandle,
        task_json: dict[str, Any],
        checkpoint_dir: Path,
    ) -> TaskInfo:
        """A new episode restored from a task checkpoint: the task's info, and the slot's run
        dir as the setup left it (from the checkpoint dir); no setup step runs."""
        ...


class NoTaskVerifier:
    async def verify(self, slot_record: SlotRecord, handle: SlotHandle) -> VerifyResult:
        return VerifyResult(
            slot=slot_record.id,
            episode=slot_record.episode,
            task_id=slot_record.task_id,
            score=None,
            valid=False,
            verdict="pending",
            checker_error="no task loaded",
            last_action=slot_record.last_action,
            actions=slot_record.actions,
        )


class NoTaskCatalog:
    def list_tasks(self) -> list[TaskInfo]:
        return []

    def forget_slot(self, slot_id: str) -> None:
        return None

    def get_task(self, task_id: str) -> TaskInfo | None:
        return None

    async def load(
        self, slot_record: SlotRecord, handle: SlotHandle, task: str | dict[str, Any]
    ) -> tuple[TaskInfo, dict[str, Any]]:
        raise DrumsdError(
            "unsupported_task",
            "this daemon has no task bridge loaded; configure tasks.dirs and install the "
            "drumsd task bridge",
        )
