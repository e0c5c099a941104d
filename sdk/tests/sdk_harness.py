"""What the SDK tests share: the token and URL of the served app, and the `Daemon` handle.

Imported by module name (not `from conftest import`), so it cannot be confused with another
package's conftest when every test of the repository runs in one pytest session.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from fake_app import FaultInjector
from sdk_asgi_bridge import ServedApp

import drums

TOKEN = "test-token-0123456789abcdef0123456789abcdef"
URL = "http://drumsd.test"
# Retries without real waiting, so the tests of backoff stay fast.
FAST_RETRY = drums.RetryPolicy(max_retries=3, base_s=0.0, max_s=0.01)
BACKENDS = ["asyncio", "trio"]


class Daemon:
    """The served app, its fault injector, and client factories pointed at it."""

    def __init__(self, served: ServedApp, faults: FaultInjector, app: Any) -> None:
        self.served = served
        self.faults = faults
        self.app = app

    def client(self, **kwargs: Any) -> drums.Client:
        kwargs.setdefault("token", TOKEN)
        kwargs.setdefault("retry", FAST_RETRY)
        return drums.connect(URL, transport=self.served.sync_transport(), **kwargs)

    def aclient(self, **kwargs: Any) -> drums.AsyncClient:
        kwargs.setdefault("token", TOKEN)
        kwargs.setdefault("retry", FAST_RETRY)
        return drums.aconnect(URL, transport=self.served.async_transport(), **kwargs)

    def leftovers(self) -> tuple[list[str], list[str]]:
        """Live envs and non-template states on the daemon, asked through the API itself."""
        with self.client() as c:
            envs = [s.id for s in c.list_envs()]
            states = [
                s.id for s in c.list_states() if s.kind != drums.models.CheckpointKind.template
            ]
        return envs, states


@asynccontextmanager
async def open_drumsd_app(tmp_path: Path, token: str) -> AsyncIterator[Any]:
    """drumsd's real app over a supervisor with the in-memory runtime (no root, no desktops)."""
    from drumsd.api.app import create_app
    from drumsd.core.config import Config
    from drumsd.runtime.memory_runtime import MemoryRuntime
    from drumsd.runtime.supervisor import open_supervisor
    from harness import HOST_NAMESPACES, memory_config, roomy, wait_for

    config = Config.model_validate(memory_config(tmp_path, lease={"reap_interval_s": 3600}))
    runtime = MemoryRuntime(config.state_dir)
    tasks = StubTaskBridge()
    async with open_supervisor(
        config, runtime, sampler=roomy, host_namespaces=HOST_NAMESPACES, tasks=tasks, verifier=tasks
    ) as supervisor:
        # the template checkpoint is built in the background
        await wait_for(lambda: supervisor.template_status.get("base") != "building", 10)
        yield create_app(supervisor, config, token)


class StubTaskBridge:
    """drumsd's TaskCatalog and Verifier seams with the fake app's tasks and scoring (score 1.0
    once the episode took an action), so the real API and supervisor run under every SDK test
    without OSWorld checkers. Only the task bridge is stubbed, as the in-memory runtime stubs
    the desktops."""

    def __init__(self) -> None:
        from fake_app import DEFAULT_TASKS

        self.tasks = {t.id: t for t in DEFAULT_TASKS}

    def forget_slot(self, slot_id: str) -> None:
        return None

    def list_tasks(self) -> list[Any]:
        return list(self.tasks.values())

    def get_task(self, task_id: str) -> Any:
        return self.tasks.get(task_id)

    async def load(self, slot_record: Any, handle: Any, task: Any) -> tuple[Any, dict[str, Any]]:
        from drumsd.core.errors import DrumsdError

        if isinstance(task, dict):
            info = drums.models.TaskInfo(
                id=str(task.get("id") or "inline"),
                instruction=str(task.get("instruction") or ""),
                supported=True,
            )
            self.tasks[info.id] = info
            return info, dict(task)
        info = self.tasks.get(task)
        if info is None:
            raise DrumsdError("not_found", f"no task {task}")
        if not info.supported:
            raise DrumsdError("unsupported_task", f"task {task} is unsupported: {info.reason}")
        return info, {"id": info.id, "instruction": info.instruction}

    async def verify(self, slot_record: Any, handle: Any) -> Any:
        score = None if slot_record.task_id is None else (1.0 if slot_record.actions else 0.0)
        return drums.models.VerifyResult(
            slot=slot_record.id,
            episode=slot_record.episode,
            task_id=slot_record.task_id,
            score=score,
            valid=False,
            verdict="pending",
            checker_error=None if score is not None else "no task loaded",
            last_action=slot_record.last_action,
            actions=slot_record.actions,
        )
