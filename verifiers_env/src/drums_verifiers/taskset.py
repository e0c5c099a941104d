"""The `drums-verifiers` taskset: drums tasks as verifiers tasks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf

from drums_verifiers import sources
from drums_verifiers.config import TOKEN_HINT, DrumsTasksetConfig
from drums_verifiers.task import SYSTEM_PROMPTS, DrumsTask, DrumsTaskData


def daemon_tasks(config: DrumsTasksetConfig) -> list[dict[str, Any]]:
    """The daemon's task list, through the SDK's sync client (load() is synchronous)."""
    from drums_verifiers.desktop import field, sdk

    sdk()
    with config.task.daemon.resolve().connect(TOKEN_HINT) as client:
        tasks = client.tasks()
    return [
        t
        if isinstance(t, dict)
        else {
            "id": field(t, "id"),
            "instruction": field(t, "instruction", ""),
            "supported": field(t, "supported", True),
            "reason": field(t, "reason"),
        }
        for t in tasks
    ]


class TasksetLoadError(SystemExit):
    """The tasks cannot be loaded (unknown or unsupported task id, unreadable task file, no
    daemon). A SystemExit carrying one line: vf-eval and prime-rl print it and stop, the way
    verifiers' own CLI reports a config error, instead of a traceback. Catch it by name."""


class DrumsTaskset(vf.Taskset[DrumsTask, DrumsTasksetConfig]):
    def refs(self) -> Iterator[sources.TaskRef]:
        try:
            yield from self._refs()
        except Exception as exc:
            reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            where = ""
            if not isinstance(exc, ValueError) or self.config.task_ids:
                where = f" (drumsd {self.config.task.daemon.resolve(announce=False).url})"
            raise TasksetLoadError(
                f"drums-verifiers: cannot load tasks{where}: {type(exc).__name__}: {reason}"
            ) from exc

    def _refs(self) -> Iterator[sources.TaskRef]:
        cfg = self.config
        if not (cfg.task_ids or cfg.task_dir or cfg.tasks_jsonl):
            raise ValueError(
                "drums-verifiers has no tasks: set --env.taskset.task-ids (daemon task ids, or "
                "'*'), --env.taskset.task-dir (OSWorld JSON) or --env.taskset.tasks-jsonl"
            )
        # One authenticated call before any rollout, whatever the source: no token, a wrong
        # token or a daemon that does not answer stops vf-eval here (exit 1, one line) instead
        # of failing every rollout while vf-eval exits 0.
        known = daemon_tasks(cfg)
        if cfg.task_ids:
            yield from sources.from_daemon_ids(cfg.task_ids, known)
        if cfg.task_dir:
            yield from sources.read_task_dir(cfg.task_dir)
        if cfg.tasks_jsonl:
            yield from sources.read_tasks_jsonl(cfg.tasks_jsonl)

    def load(self) -> Iterator[DrumsTask]:
        cfg = self.config
        for ref in self.refs():
            data = DrumsTaskData(
                id=ref.id,
                name=ref.id,
                prompt=ref.instruction or f"Complete drums task {ref.id}.",
                system_prompt=SYSTEM_PROMPTS[cfg.task.tool_style],
                drums_task=ref.ref,
                instruction=ref.instruction,
                visual_window=cfg.visual_window,
            )
            yield DrumsTask(data, cfg.task)
