"""Setup and postconfig steps applied to a slot through a seam (`SlotAccess`).

`apply_operations()` runs the operations `tasks/setup_plan.py` planned, each under its own deadline
and the whole under the setup deadline; `run_setup()` / `run_postconfig()` plan and apply a task's
steps and report what ran.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypedDict, runtime_checkable

import trio

from .model import (
    Task,
    TaskContext,
)
from .setup_plan import (
    ChromeTabs,
    OpenFile,
    Operation,
    PutFile,
    RunTrusted,
    RunUser,
    SetupError,
    Sleep,
    UpdateHistory,
    WindowAction,
    plan_steps,
)

log = logging.getLogger("drumsd.tasks.setup")


class WindowInfo(TypedDict, total=False):
    id: str  # an X window id as wmctrl prints it, e.g. "0x03a00007"
    title: str
    wm_class: str


@runtime_checkable
class SlotAccess(Protocol):
    """How the task bridge acts on one slot. The slot runtime implements it.

    Every method takes or has a deadline and raises `TimeoutError` past it; commands that run
    but fail are answered with their exit code, not an exception.
    """

    async def exec_user(
        self, argv_or_shell: list[str] | str, timeout_s: float
    ) -> tuple[int, str, str]:
        """Run as the desktop user inside the slot (DISPLAY, HOME set); a str runs via `sh -c`.

        Returns (exit code, stdout, stderr) decoded as UTF-8 with replacement.
        """
        ...

    async def exec_checker(
        self, argv_or_shell: list[str] | str, timeout_s: float
    ) -> tuple[int, str, str]:
        """Run a getter's command isolated from the agent's files and processes (another uid,
        `/` as working directory, Python without the working directory or a user site on its
        path): what it reads is data, never code. Answers as exec_user."""
        ...

    async def exec_trusted(self, shell: str, timeout_s: float) -> tuple[int, str, str]:
        """Run a shell command as root inside the slot through trusted provisioning."""
        ...

    async def read_file(self, path: str) -> bytes:
        """A file of the slot (absolute path, seen from inside); FileNotFoundError if absent."""
        ...

    async def write_file(self, path: str, data: bytes, owner_user: bool = True) -> None:
        """Write a file in the slot, creating parent directories; owned by the desktop user
        unless owner_user is False (then root)."""
        ...

    async def step(self, action: dict[str, Any]) -> None:
        """One GUI action dict, as the step API takes it."""
        ...

    async def windows(self) -> list[WindowInfo]:
        """The desktop's top-level windows."""
        ...

    async def screenshot(self) -> bytes:
        """PNG of the desktop."""
        ...


@dataclass
class OperationRecord:
    index: int
    kind: str
    summary: str
    ok: bool
    duration_s: float
    rc: int | None = None
    detail: str | None = None


@dataclass
class SetupReport:
    records: list[OperationRecord] = field(default_factory=list)
    seeded: dict[str, str] = field(default_factory=dict)  # slot path -> sha256 written by setup
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Every step did what it was asked (a failing command is recorded, not fatal)."""
        return all(record.ok for record in self.records)


# ---- applying operations ---------------------------------------------------------------------


def _summary(op: Operation) -> str:
    if isinstance(op, RunUser | RunTrusted):
        cmd = op.command if isinstance(op, RunUser) else op.shell
        text = cmd if isinstance(cmd, str) else shlex.join(cmd)
        return text[:200]
    if isinstance(op, PutFile):
        return f"{op.source} -> {op.dest}"
    if isinstance(op, ChromeTabs):
        return f"{op.action} {len(op.urls)} tab(s)"
    if isinstance(op, WindowAction):
        return f"{op.action} {op.name!r}"
    if isinstance(op, OpenFile):
        return op.path
    if isinstance(op, Sleep):
        return f"{op.seconds} s"
    return type(op).__name__


def _background_shell(command: list[str] | str) -> str:
    inner = command if isinstance(command, str) else shlex.join(command)
    # setsid -f: the launched program leaves the exec's session and outlives it; no pipes held.
    return f"setsid -f sh -c {shlex.quote(inner)} >/dev/null 2>&1 </dev/null"


def _until_met(until: dict[str, Any], rc: int, out: str, err: str) -> bool:
    return (
        ("returncode" in until and rc == until["returncode"])
        or ("stdout" in until and until["stdout"] in out)
        or ("stderr" in until and until["stderr"] in err)
    )


async def _run_user(op: RunUser, access: SlotAccess, run_dir: Path | None) -> tuple[int, str, str]:
    if op.background:
        return await access.exec_user(_background_shell(op.command), op.timeout_s)
    failures = 0
    with trio.fail_after(op.timeout_s * (3 if op.until else 1)):
        while True:
            rc, out, err = await access.exec_user(op.command, op.timeout_s)
            if run_dir is not None and op.stdout_name:
                (run_dir / op.stdout_name).write_text(out)
            if run_dir is not None and op.stderr_name:
                (run_dir / op.stderr_name).write_text(err)
            if not op.until or _until_met(op.until, rc, out, err):
                return rc, out, err
            failures += 1
            if failures >= 5 and rc != 0:
                return rc, out, err
            await trio.sleep(0.3)


def match_window(
    windows: list[WindowInfo], name: str, strict: bool, by_class: bool
) -> WindowInfo | None:
    """OSWorld's rule: title (or WM class) equal when strict, else a case-blind substring."""
    for window in windows:
        value = window.get("wm_class" if by_class else "title", "") or ""
        if (value == name) if strict else (name.lower() in value.lower()):
            return window
    return None


async def _window_action(op: WindowAction, access: SlotAccess, timeout_s: float) -> tuple[int, str]:
    window = match_window(await access.windows(), op.name, op.strict, op.by_class)
    if window is None:
        # OSWorld's server answers 404 and its setup goes on; so do we, with a record.
        return 1, f"no window matching {op.name!r}"
    flag = "-a" if op.action == "activate" else "-c"
    xdo = "windowactivate" if op.action == "activate" else "windowclose"
    wid = window["id"]
    rc, _out, err = await access.exec_user(
        f"wmctrl -i {flag} {shlex.quote(wid)} || xdotool {xdo} {shlex.quote(str(int(wid, 0)))}",
        timeout_s,
    )
    return rc, err.strip() or f"window {wid} {window.get('title', '')!r}"


_OFFICE_SUFFIXES = frozenset(".xlsx .xls .ods .csv .docx .doc .odt .rtf .pptx .ppt .odp".split())


async def _open_file(op: OpenFile, access: SlotAccess) -> tuple[int, str]:
    quoted = shlex.quote(op.path)
    command = f"xdg-open {quoted}"
    if PurePosixPath(op.path).suffix.lower() in _OFFICE_SUFFIXES:
        # Minimal desktop images may lack xdg-utils or its MIME defaults.
        command += f" || libreoffice {quoted}"
    rc, _out, err = await access.exec_user(_background_shell(command), 10.0)
    if rc != 0:
        raise SetupError(f"could not start xdg-open {op.path}: {err.strip()}")
    name = PurePosixPath(op.path).name
    deadline = trio.current_time() + op.timeout_s
    # Like OSWorld's server: the step is done when a window shows the file's name.
    while trio.current_time() < deadline:
        if match_window(await access.windows(), name, strict=False, by_class=False):
            return 0, f"window for {name} is up"
        await trio.sleep(0.5)
    raise SetupError(f"open {op.path}: no window showing {name!r} after {op.timeout_s:.0f} s")


_CHROME_TABS_SCRIPT = r"""
import json, sys, time, urllib.request, urllib.parse
action, port = sys.argv[1], int(sys.argv[2])
urls, wait_s = json.loads(sys.argv[3]), float(sys.argv[4])
base = "http://127.0.0.1:%d" % port
def call(path, method="GET"):
    req = urllib.request.Request(base + path, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"[", b"{") else body
deadline = time.time() + wait_s
while True:
    try:
        pages = [t for t in call("/json/list") if t.get("type") == "page"]
        break
    except Exception as e:
        if time.time() > deadline:
            sys.exit("DevTools endpoint %s not reachable: %s" % (base, e))
        time.sleep(0.5)
def norm(u):
    p = urllib.parse.urlparse(u if "://" in u else "http://" + u)
    host = p.netloc.lower().removeprefix("www.")
    return host + (p.path.rstrip("/") or "")
if action == "open":
    for url in urls:
        call("/json/new?" + urllib.parse.quote(url, safe=":/?&=%#"), method="PUT")
    if urls and pages:
        call("/json/close/" + pages[0]["id"])
else:
    for url in urls:
        for page in pages:
            if norm(page.get("url", "")) == norm(url):
                call("/json/close/" + page["id"])
                pages.remove(page)
                break
print(json.dumps([p.get("url") for p in call("/json/list") if p.get("type") == "page"]))
"""


async def _chrome_tabs(op: ChromeTabs, access: SlotAccess, ctx: TaskContext) -> tuple[int, str]:
    argv = [
        ctx.python_command,
        "-c",
        _CHROME_TABS_SCRIPT,
        op.action,
        str(ctx.devtools_port),
        json.dumps(list(op.urls)),
        str(max(op.timeout_s - 15.0, 5.0)),
    ]
    rc, out, err = await access.exec_user(argv, op.timeout_s)
    if rc != 0:
        raise SetupError(f"chrome_{op.action}_tabs failed (exit {rc}): {err.strip()[-500:]}")
    return rc, out.strip()[-500:]


def _chrome_time(seconds_ago: float) -> int:
    # Chromium counts microseconds since 1601-01-01.
    visit = datetime.now() - timedelta(seconds=seconds_ago)
    return int((visit - datetime(1601, 1, 1)).total_seconds() * 1_000_000)


def rewrite_history(db_path: Path, items: tuple[tuple[str, str, float], ...]) -> None:
    """Empty a Chromium History database and insert the given visits (what OSWorld's step does)."""
    conn = sqlite3.connect(db_path)
    try:
        conn.execute("DELETE FROM visits")
        conn.execute("DELETE FROM urls")
        for url, title, seconds_ago in items:
            stamp = _chrome_time(seconds_ago)
            cur = conn.execute(
                "INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, hidden)"
                " VALUES (?, ?, 1, 0, ?, 0)",
                (url, title, stamp),
            )
            conn.execute(
                "INSERT INTO visits (url, visit_time, from_visit, transition, segment_id,"
                " visit_duration) VALUES (?, ?, 0, 805306368, 0, 0)",
                (cur.lastrowid, stamp),
            )
        conn.commit()
    finally:
        conn.close()


async def _update_history(op: UpdateHistory, access: SlotAccess) -> tuple[int, str]:
    try:
        data = await access.read_file(op.history_path)
    except FileNotFoundError:
        if op.template is None:
            raise SetupError(
                f"update_browse_history: the slot has no {op.history_path} and no"
                " history_empty.sqlite is in the cache; start Chromium once in the image"
            ) from None
        data = op.template.read_bytes()
    with tempfile.TemporaryDirectory(prefix="drums-history-") as tmp:
        db = Path(tmp) / "History"
        db.write_bytes(data)
        await trio.to_thread.run_sync(rewrite_history, db, op.items)
        await access.write_file(op.history_path, db.read_bytes(), owner_user=True)
    return 0, f"{len(op.items)} visit(s) in {op.history_path}"


async def apply_operation(
    op: Operation,
    access: SlotAccess,
    ctx: TaskContext,
    report: SetupReport,
    run_dir: Path | None,
) -> OperationRecord:
    started = time.monotonic()
    index = len(report.records)
    rc: int | None = None
    detail: str | None = None
    ok = True
    if isinstance(op, RunUser):
        rc, out, err = await _run_user(op, access, run_dir)
        detail = (err or out).strip()[-500:] or None
        ok = rc == 0
    elif isinstance(op, RunTrusted):
        rc, out, err = await access.exec_trusted(op.shell, op.timeout_s)
        detail = (err or out).strip()[-500:] or None
        ok = rc == 0
    elif isinstance(op, Sleep):
        await trio.sleep(op.seconds)
    elif isinstance(op, OpenFile):
        rc, detail = await _open_file(op, access)
    elif isinstance(op, WindowAction):
        rc, detail = await _window_action(op, access, ctx.step_timeout_s)
    elif isinstance(op, ChromeTabs):
        rc, detail = await _chrome_tabs(op, access, ctx)
    elif isinstance(op, UpdateHistory):
        rc, detail = await _update_history(op, access)
    elif isinstance(op, PutFile):
        data = op.source.read_bytes()
        with trio.fail_after(ctx.step_timeout_s):
            await access.write_file(op.dest, data, owner_user=op.owner_user)
        report.seeded[op.dest] = hashlib.sha256(data).hexdigest()
        detail = f"{len(data)} bytes"
    record = OperationRecord(
        index=index,
        kind=type(op).__name__,
        summary=_summary(op),
        ok=ok,
        duration_s=round(time.monotonic() - started, 3),
        rc=rc,
        detail=detail,
    )
    report.records.append(record)
    return record


async def apply_operations(
    ops: list[Operation],
    access: SlotAccess,
    ctx: TaskContext,
    *,
    run_dir: Path | None = None,
    label: str = "",
) -> SetupReport:
    """Run the operations in order; a step that cannot be done (a file that does not open, a
    window that never shows) or a timeout stops with SetupError.

    OSWorld goes on past a command that exits non-zero, its own or a sudo one (it only logs it),
    so do we: the exit code is in the report and in the log (a task's `su - charles` for a user
    the image does not have is the task's premise, not a broken desktop). A step past its
    deadline, or the whole list past `ctx.setup_timeout_s`, is an error."""
    report = SetupReport()
    started = time.monotonic()
    lead = f"{label}: " if label else ""  # "slot=... task=...: step 2 ..."
    try:
        with trio.fail_after(ctx.setup_timeout_s):
            for op in ops:
                try:
                    record = await apply_operation(op, access, ctx, report, run_dir)
                except (TimeoutError, trio.TooSlowError) as exc:
                    raise SetupError(
                        f"{lead}step {len(report.records) + 1} timed out: {_summary(op)}", report
                    ) from exc
                except SetupError as exc:
                    exc.report = report
                    raise
                log.log(
                    logging.INFO if record.ok else logging.WARNING,
                    "task step %s %s rc=%s %.3fs %s%s",
                    record.index + 1,
                    record.kind,
                    record.rc,
                    record.duration_s,
                    label,
                    "" if record.ok else f": {record.summary}: {record.detail} (going on)",
                )
    except (TimeoutError, trio.TooSlowError) as exc:
        raise SetupError(
            f"{lead}setup took longer than {ctx.setup_timeout_s:.0f} s", report
        ) from exc
    finally:
        report.duration_s = round(time.monotonic() - started, 3)
    return report


async def run_setup(
    task: Task,
    access: SlotAccess,
    ctx: TaskContext,
    *,
    run_dir: Path | None = None,
    label: str = "",
) -> SetupReport:
    """Run a task's `config` steps on a slot, before its episode starts."""
    ops = plan_steps(task.config, task, ctx)
    return await apply_operations(ops, access, ctx, run_dir=run_dir, label=label)


async def run_postconfig(
    task: Task,
    access: SlotAccess,
    ctx: TaskContext,
    *,
    run_dir: Path | None = None,
    label: str = "",
) -> SetupReport:
    """Run the evaluator's `postconfig` steps (verify runs them before the getters)."""
    ops = plan_steps(task.evaluator.postconfig, task, ctx)
    return await apply_operations(ops, access, ctx, run_dir=run_dir, label=label)
