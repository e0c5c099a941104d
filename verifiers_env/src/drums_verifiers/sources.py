"""Where tasks come from: daemon task ids, a directory of OSWorld JSON, a factory's tasks.jsonl.

Pure readers that return plain task references; the taskset turns them into verifiers tasks.
A reference is what `AsyncClient.create(task=...)` accepts: a daemon task id or an inline dict.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TaskRef:
    ref: str | dict[str, Any]
    id: str
    instruction: str


def from_osworld(task: dict[str, Any], where: str) -> TaskRef:
    if not isinstance(task, dict) or not task.get("id"):
        raise ValueError(f"{where}: not an OSWorld task (a JSON object with an 'id')")
    return TaskRef(ref=task, id=str(task["id"]), instruction=str(task.get("instruction", "")))


def read_task_dir(directory: Path) -> Iterator[TaskRef]:
    if not directory.is_dir():
        raise FileNotFoundError(f"task_dir {directory} is not a directory of task JSON files")
    for path in sorted(directory.rglob("*.json")):
        yield from_osworld(json.loads(path.read_text()), str(path))


def read_tasks_jsonl(path: Path) -> Iterator[TaskRef]:
    """A task factory's tasks.jsonl: each line a task, or a record holding one under 'task'."""
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            task = record.get("task", record) if isinstance(record, dict) else record
            yield from_osworld(task, f"{path}:{number}")


def from_daemon_ids(ids: list[str], known: list[dict[str, Any]]) -> Iterator[TaskRef]:
    """`known` is the daemon's task list; '*' takes every supported task, in its order."""
    by_id = {str(t.get("id")): t for t in known}
    wanted = [str(t.get("id")) for t in known if t.get("supported", True)] if ids == ["*"] else ids
    for task_id in wanted:
        info = by_id.get(task_id)
        if info is None:
            raise KeyError(
                f"the daemon does not know task {task_id!r}; list them with GET /v1/tasks"
            )
        if not info.get("supported", True):
            raise ValueError(f"task {task_id} is not supported on this host: {info.get('reason')}")
        yield TaskRef(ref=task_id, id=task_id, instruction=str(info.get("instruction", "")))
