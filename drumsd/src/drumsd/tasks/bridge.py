"""The task bridge as the supervisor sees it: its TaskCatalog and Verifier seams.

`TaskBridge` turns the runtime's per-handle operations into a `SlotAccess`, loads tasks into slots
(resolve, support check, setup) and verifies episodes (evaluate + audit), answering with the wire
models. The supervisor then sets validity, verdict and gates from its own records.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from drums.models import Audit as WireAudit
from drums.models import TaskInfo, VerifyResult

from drumsd.core.config import TasksConfig
from drumsd.core.errors import DrumsdError
from drumsd.core.records import SlotRecord
from drumsd.core.seams import RuntimeError_, SlotHandle, SlotRuntime
from drumsd.core.task_checkpoints import SetupFingerprint
from drumsd.linux import host_sampler
from drumsd.linux.image_apps import AppManifest, features, manifest_for_root

from . import accessibility, terminal
from .audit import EpisodeFacts, full_disk_reason, verify
from .checker import CheckerSlots
from .checker_pool import CheckerPool
from .checker_venv import CheckerVenv, context_for_checker
from .evaluate import default_runner
from .exploit_verdicts import read_verdicts, refusal, task_audit
from .host_support import (
    SLOT_FEATURES,
    support,
    task_domain,
    task_source,
    task_support_table,
)
from .model import (
    Task,
    TaskContext,
    TaskError,
    is_path_component,
    iter_task_files,
    load_task_file,
    resolve_task,
)
from .setup import SetupError, WindowInfo, run_setup
from .setup_cache import FileHashes, restore_run_files, save_run_files, setup_fingerprint

log = logging.getLogger("drumsd.tasks.bridge")

MAX_READ_BYTES = 256 * 2**20
_WMCTRL_LINE = re.compile(r"^(0x[0-9a-fA-F]+)\s+-?\d+\s+(\S+)\s+\S+\s?(.*)$")


def context_from_config(
    cfg: TasksConfig, venv: CheckerVenv | None, **overrides: Any
) -> TaskContext:
    """The task context for the daemon's `tasks` config block (the config model owns defaults)."""
    # What every slot gives, plus what the image's apps give (AT-SPI: the accessibility tree).
    overrides.setdefault("capabilities", SLOT_FEATURES | features(overrides.get("apps")))
    if "exploit_verdicts" not in overrides:  # ValueError saying what is wrong with the file
        overrides["exploit_verdicts"] = read_verdicts(cfg.exploits_report)
    ctx = TaskContext(
        task_dirs=list(cfg.dirs),
        cache_dir=cfg.cache_dir,
        assets_dir=cfg.assets_dir or Path("/nonexistent/drums-task-assets"),
        verifier_dirs=list(cfg.verifier_dirs),
        client_password=cfg.client_password,
        screen_width=cfg.screen_width,
        screen_height=cfg.screen_height,
        setup_timeout_s=cfg.setup_timeout_s,
        eval_timeout_s=cfg.eval_timeout_s,
        refuse_hackable=cfg.refuse_hackable,
        **overrides,
    )
    if venv is None:
        return ctx
    return context_for_checker(
        ctx,
        venv,
        uid=cfg.checker_uid,
        gid=cfg.checker_gid,
        memory_mib=cfg.checker_memory_mib,
        cpu_s=cfg.checker_cpu_s,
    )


def agent_window(window: dict[str, Any]) -> WindowInfo:
    """A window as the guest agent lists it, in the shape `wmctrl -lx` gives (hex id,
    instance.Class), which the setup steps match on."""
    return {
        "id": f"0x{int(window['id']):08x}",
        "title": str(window.get("name", "")),
        "wm_class": f"{window.get('instance', '')}.{window.get('class', '')}",
    }


def parse_wmctrl(listing: str) -> list[WindowInfo]:
    """`wmctrl -lx` lines: id, desktop, WM_CLASS, host, title."""
    windows: list[WindowInfo] = []
    for line in listing.splitlines():
        match = _WMCTRL_LINE.match(line)
        if match:
            wid, wm_class, title = match.groups()
            windows.append({"id": wid, "wm_class": wm_class, "title": title})
    return windows


class RuntimeSlotAccess:
    """SlotAccess over the slot runtime's per-handle operations."""

    def __init__(self, runtime: SlotRuntime, handle: SlotHandle) -> None:
        self.runtime = runtime
        self.handle = handle
        self.slot_id = handle.slot_id

    async def exec_user(
        self, argv_or_shell: list[str] | str, timeout_s: float
    ) -> tuple[int, str, str]:
        done = await self.runtime.exec_user(self.handle, argv_or_shell, timeout_s)
        return done.returncode, done.stdout, done.stderr

    async def exec_checker(
        self, argv_or_shell: list[str] | str, timeout_s: float
    ) -> tuple[int, str, str]:
        done = await self.runtime.exec_checker(self.handle, argv_or_shell, timeout_s)
        return done.returncode, done.stdout, done.stderr

    async def exec_trusted(self, shell: str, timeout_s: float) -> tuple[int, str, str]:
        done = await self.runtime.exec_trusted(self.handle, shell, timeout_s)
        return done.returncode, done.stdout, done.stderr

    async def read_file(self, path: str) -> bytes:
        try:
            return await self.runtime.read_file(self.handle, path, MAX_READ_BYTES)
        except RuntimeError_ as exc:
            if exc.code in ("not_found", "file_not_found", "enoent"):
                raise FileNotFoundError(path) from exc
            raise

    async def write_file(self, path: str, data: bytes, owner_user: bool = True) -> None:
        await self.runtime.write_file(self.handle, path, data, user=owner_user)

    async def step(self, action: dict[str, Any]) -> None:
        await self.runtime.step(self.handle, action)

    async def windows(self) -> list[WindowInfo]:
        from_agent = getattr(self.runtime, "windows", None)
        if from_agent is not None:  # the guest asks the X server itself: no wmctrl in the image
            return [agent_window(w) for w in await from_agent(self.handle)]
        done = await self.runtime.exec_user(self.handle, ["wmctrl", "-lx"], 10.0)
        return parse_wmctrl(done.stdout) if done.returncode == 0 else []

    async def screenshot(self) -> bytes:
        return await self.runtime.screenshot(self.handle)

    @contextlib.asynccontextmanager
    async def frozen(self) -> AsyncIterator[bool | None]:
        """The slot's processes stopped (its cgroup frozen) for the block: True; the freeze
        failed (logged, the block runs anyway): False; a runtime without a freezer: None."""
        freeze = getattr(self.runtime, "freeze", None)
        thaw = getattr(self.runtime, "thaw", None)
        if freeze is None or thaw is None:
            yield None
            return
        try:
            await freeze(self.handle)
        except RuntimeError_ as exc:
            log.warning("slot %s: verify reads unfrozen: %s", self.slot_id, exc)
            yield False
            return
        try:
            yield True
        finally:
            # Never leave a desktop frozen: the thaw runs even when verify is cancelled.
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await thaw(self.handle)

    async def terminal_output(self) -> str | None:
        """The slot feature "terminal_output" (vm_terminal_output): None if no xterm prints."""
        return (await terminal.read(self.runtime, self.handle)).text

    async def accessibility_tree(self, related_apps: list[str]) -> str:
        """OSWorld's accessibility_tree getter: the XML of the image's binaries among the task's
        apps (a11y.py --trusted), or an error the getter reports."""
        argv = accessibility.getter_argv(related_apps)
        done = await self.runtime.exec_user(self.handle, argv, accessibility.TIMEOUT_S)
        got = accessibility.parse(done.returncode, done.stdout, done.stderr)
        if got.xml is None:
            raise RuntimeError(got.reason)
        for line in done.stderr.splitlines():
            if line.startswith("drums-a11y: left out"):  # the agent's own apps, for the log
                log.info("slot %s: accessibility getter %s", self.slot_id, line[12:])
        return got.xml


def is_task_id(ref: str | dict[str, Any]) -> bool:
    """A reference that names a task by id (not inline, not a JSON path)."""
    return isinstance(ref, str) and not ref.endswith(".json") and "/" not in ref


def lookup_task(ref: str | dict[str, Any], task_dirs: list[Path]) -> Task:
    """`resolve_task`, and a task id may also be a unique prefix of one (`e0df059f`), as OSWorld
    users write ids. Unknown: `not_found`; a prefix of several: `invalid_request` (422) with
    the matches."""
    try:
        return resolve_task(ref, task_dirs)
    except TaskError as exc:
        if not (is_task_id(ref) and "no task with id" in str(exc)):
            raise DrumsdError("invalid_request", str(exc)) from exc
        assert isinstance(ref, str)
        matches = prefix_matches(ref, task_dirs)
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise DrumsdError("not_found", f"{exc}; list tasks with GET /v1/tasks") from exc
        ids = sorted(t.id for t in matches)
        raise DrumsdError(
            "invalid_request",
            f"task id prefix {ref!r} matches {len(ids)} tasks: {', '.join(ids)}; "
            "give more of the id",
            matches=ids,
        ) from exc


def prefix_matches(prefix: str, task_dirs: list[Path]) -> list[Task]:
    """Tasks whose id starts with the prefix (each id once: the first file that has it)."""
    found: dict[str, Task] = {}
    for path in iter_task_files(task_dirs):
        try:
            task = load_task_file(path)
        except TaskError:
            continue
        if task.id.startswith(prefix) and task.id not in found:
            found[task.id] = task
    return list(found.values())


def task_info(task: Task, ctx: TaskContext) -> TaskInfo:
    ok, reason = support(task, ctx)
    return TaskInfo(
        id=task.id,
        instruction=task.instruction,
        source=task_source(task),
        domain=task_domain(task, ctx.task_dirs),
        supported=ok,
        reason=reason,
        audit=task_audit(ctx.exploit_verdicts, task.id),
    )


class TaskBridge:
    """The supervisor's TaskCatalog and Verifier, backed by drumsd.tasks."""

    def __init__(
        self,
        ctx: TaskContext,
        runtime: SlotRuntime,
        run_root: Path | None = None,
        checkers: CheckerPool | None = None,
        checker_slots: CheckerSlots | None = None,
    ) -> None:
        self.ctx = ctx
        self.runtime = runtime
        self._run_root = run_root
        self.checkers = checkers  # resident checker worker; None: a fresh process per call
        self.checker_slots = checker_slots  # the bound on calls at once; None: unbounded
        self._manifests: dict[str, AppManifest] = {}  # image root -> its apps
        # What /v1/health reports under `tasks` (the image's apps, where OSWorld's tasks are).
        self.status: dict[str, Any] = {}
        self.file_hashes = FileHashes()  # the setup files of task checkpoint keys

    def checker_health(self) -> dict[str, Any]:
        """How checker calls run, for /v1/health's pools.checkers."""
        if self.checkers is None:
            out = {"enabled": False, "venv_built": self.ctx.checker is not None}
        else:
            out = self.checkers.health()
        if self.checker_slots is not None:
            out["concurrency"] = self.checker_slots.health()
        return out

    def checker_reserved_mib(self) -> float:
        """Memory admission counts for the checker calls running now."""
        return self.checker_slots.reserved_mib() if self.checker_slots is not None else 0.0

    def context_for(self, handle: SlotHandle) -> TaskContext:
        """The task context with the apps of the image this slot runs (its overlay's lower
        layer), which may not be the default image `GET /v1/tasks` answers for."""
        lower = handle.extra.get("lower") if handle.extra else None
        if not lower:
            return self.ctx
        root = str(lower[0])
        if root not in self._manifests:
            self._manifests[root] = manifest_for_root(Path(root))
        manifest = self._manifests[root]
        caps = self.ctx.capabilities | features(manifest)
        return self.ctx.model_copy(update={"apps": manifest, "capabilities": caps})

    @property
    def run_root(self) -> Path:
        """Where episodes' task-run dirs live: private to this daemon (issue 14, finding 10: a
        predictable root-made name in world-writable /tmp, shared by every daemon, was the
        default), made 0700 under an unpredictable name on first use."""
        if self._run_root is None:
            self._run_root = Path(tempfile.mkdtemp(prefix="drumsd-task-runs-"))
        return self._run_root

    def _run_dir(self, slot_id: str, fresh: bool = False) -> Path:
        """The slot's run dir; `fresh` (a task loads: a new episode) empties the last episode's."""
        path = self.run_root / slot_id
        if fresh:
            shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def forget_slot(self, slot_id: str) -> None:
        """A destroyed slot's run dir goes with it (issue 14, finding 10: one dir per episode
        stayed forever). Its record, events and gates are in forgotten_dir already."""
        if self._run_root is not None and is_path_component(slot_id):
            shutil.rmtree(self._run_root / slot_id, ignore_errors=True)

    def list_tasks(self) -> list[TaskInfo]:
        return [
            TaskInfo(
                id=row.id,
                instruction=row.instruction,
                source=row.source,
                domain=row.domain,
                supported=row.supported,
                reason=row.reason,
                audit=task_audit(self.ctx.exploit_verdicts, row.id),
            )
            for row in task_support_table(self.ctx)
        ]

    def get_task(self, task_id: str) -> TaskInfo | None:
        """None when unknown; an ambiguous prefix raises (a 4xx listing the matches)."""
        try:
            return task_info(lookup_task(task_id, self.ctx.task_dirs), self.ctx)
        except DrumsdError as exc:
            if exc.code == "not_found":
                return None
            raise

    async def load(
        self, slot_record: SlotRecord, handle: SlotHandle, task: str | dict[str, Any]
    ) -> tuple[TaskInfo, dict[str, Any]]:
        # Off the event loop: a task named by path is a file read (issue 14, finding 6).
        resolved = await trio.to_thread.run_sync(lookup_task, task, self.ctx.task_dirs)
        ctx = await trio.to_thread.run_sync(self.context_for, handle)
        info = task_info(resolved, ctx)
        if not info.supported:
            raise DrumsdError(
                "unsupported_task", f"task {resolved.id} cannot run here: {info.reason}"
            )
        self._refuse_hackable(resolved.id)
        label = f"slot={slot_record.id} episode={slot_record.episode} task={resolved.id}"
        access = RuntimeSlotAccess(self.runtime, handle)
        try:
            await run_setup(
                resolved,
                access,
                ctx,
                run_dir=self._run_dir(slot_record.id, fresh=True),
                label=label,
            )
        except SetupError as exc:
            timed_out = "timed out" in str(exc) or "longer than" in str(exc)
            code = "timeout" if timed_out else "setup_failed"
            raise DrumsdError(code, f"setup of task {resolved.id} failed: {exc}") from exc
        return info, resolved.model_dump(mode="json", exclude_none=True)

    # ---- task checkpoints (the TaskSetupCache seam; the work is in setup_cache.py) ----------

    async def setup_fingerprint(
        self, task: str | dict[str, Any], *, enabled: bool
    ) -> SetupFingerprint:
        resolved = await trio.to_thread.run_sync(lookup_task, task, self.ctx.task_dirs)

        def read() -> SetupFingerprint:
            return setup_fingerprint(resolved, self.ctx, self.file_hashes, enabled=enabled)

        try:
            return await trio.to_thread.run_sync(read)
        except TaskError as exc:
            raise DrumsdError("invalid_request", str(exc)) from exc

    async def keep_run_files(self, slot_id: str, checkpoint_dir: Path) -> None:
        run_dir = self._run_dir(slot_id)
        await trio.to_thread.run_sync(save_run_files, run_dir, checkpoint_dir)

    async def load_cached(
        self,
        slot_record: SlotRecord,
        handle: SlotHandle,
        task_json: dict[str, Any],
        checkpoint_dir: Path,
    ) -> TaskInfo:
        resolved = resolve_task(task_json, [])
        self._refuse_hackable(resolved.id)

        def prepare() -> None:
            restore_run_files(checkpoint_dir, self._run_dir(slot_record.id, fresh=True))

        await trio.to_thread.run_sync(prepare)
        return task_info(resolved, self.ctx)

    def _refuse_hackable(self, task_id: str) -> None:
        why = refusal(self.ctx.exploit_verdicts, task_id) if self.ctx.refuse_hackable else None
        if why is not None:
            raise DrumsdError("unsupported_task", why)

    async def verify(self, slot_record: SlotRecord, handle: SlotHandle) -> VerifyResult:
        if slot_record.task is None:
            return _no_task(slot_record)
        task = resolve_task(slot_record.task, [])
        last = slot_record.terminal.upper() if slot_record.terminal else slot_record.last_action
        episode = EpisodeFacts(
            valid=None,  # the supervisor judges validity from its gates
            last_action=last,
            upper_dir=handle.upper,
            lower_dir=None,
            run_dir=self._run_dir(slot_record.id),
            label=f"slot={slot_record.id} episode={slot_record.episode} task={task.id}",
        )
        access = RuntimeSlotAccess(self.runtime, handle)
        run = (
            self.checkers.runner(self.ctx.eval_timeout_s)
            if self.checkers
            else default_runner(self.ctx)
        )
        if self.checker_slots is not None:
            run = self.checker_slots.bounded(run)
        result = await verify(task, access, self.ctx, episode, run)
        if handle.upper is not None:
            space = await trio.to_thread.run_sync(host_sampler.read_space, handle.upper)
            full = full_disk_reason(*space)
            if full is not None:
                result.invalid_reasons.append(full)
        if self.ctx.exploit_verdicts.get(task.id) and result.score:
            # A reward from a task the exploit suite could take without doing it.
            result.audit.flags.append("hackable_task")
        return VerifyResult(
            slot=slot_record.id,
            episode=slot_record.episode,
            task_id=task.id,
            score=result.score,
            valid=False,
            verdict="pending",
            checker_error=result.checker_error,
            audit=WireAudit(
                flags=result.audit.flags,
                checker_s=result.audit.checker_s,
                error_class=result.audit.error_class,
                second_score=result.audit.second_score,
                redundant_score=result.audit.redundant_score,
                scope=result.audit.scope.model_dump(mode="json"),
            ),
            trusted=None,
            invalid_reasons=result.invalid_reasons,
            last_action=slot_record.last_action,
            actions=slot_record.actions,
        )


def _no_task(slot_record: SlotRecord) -> VerifyResult:
    return VerifyResult(
        slot=slot_record.id,
        episode=slot_record.episode,
        task_id=None,
        score=None,
        valid=False,
        verdict="pending",
        checker_error="no task loaded: POST /v1/slots/{id}/task first",
        last_action=slot_record.last_action,
        actions=slot_record.actions,
    )


__all__ = [
    "RuntimeSlotAccess",
    "TaskBridge",
    "context_from_config",
    "lookup_task",
    "parse_wmctrl",
]
