"""What this host supports: whether a task can run here and, when not, the reason.

`support()` answers before any slot is touched (a missing cached file, a googledrive/login task,
a proxy task whose setup or checker reaches a web site, a metric whose library is missing, a
getter drums does not have, an app the image lacks); `task_support_table()` is the same answer
for every task, for the API and `drumsd tasks coverage`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .apps import missing_app_reason, network_setup_command, systemd_command
from .model import (
    SUPPORTED_STEPS,
    UNSUPPORTED_STEPS,
    Evaluator,
    Step,
    Task,
    TaskContext,
    asset_path,
    cache_slot_for,
    cached_download,
    first_by_id,
    list_tasks,
    strings_in,
    task_asset,
)
from .solvable import unsolvable_reason

# Getter types drums implements (evaluate.py); the ones needing a slot feature name it.
SUPPORTED_GETTERS = frozenset(
    {
        "vm_file",
        "vm_command_line",
        "vm_command_error",
        "list_directory",
        "rule",
        "rule_relativeTime",
        "cache_file",
        "cloud_file",
        "content_from_vm_file",
        "gimp_config_file",
        "vscode_config",
        "time_diff_range",
        # Chrome profile getters, reading Chromium's profile
        "profile_name",
        "enable_do_not_track",
        "default_search_engine",
        "chrome_language",
        "chrome_font_size",
        "enabled_experiments",
        "new_startup_page",
        "data_delete_automacally",
        "enable_enhanced_safety_browsing",
        "enable_safe_browsing",
        "bookmarks",
        "history",
        "cookie_data",
        "find_unpacked_extension_path",
        "find_installed_extension_name",
        "open_tabs_info",
        # getters_chrome.py (Chromium's DevTools) and getters_desktop.py
        *("active_url_from_accessTree", "active_tab_info", "active_tab_html_parse"),
        *("url_path_parse", "chrome_appearance_mode_ui", "vm_screen_size", "vm_wallpaper"),
        *("default_video_player", "vlc_config", "vlc_playing_info", "audio_in_slide"),
        *("background_image_in_slide", "active_tab_url_parse", "vm_window_size", "url_dashPart"),
    }
)
# The features drums' slots have (RuntimeSlotAccess implements each).
SLOT_FEATURES = frozenset({"terminal_output"})
GETTERS_NEEDING = {
    "vm_terminal_output": "terminal_output",
    "accessibility_tree": "accessibility_tree",
}


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _getter_reason(getter: dict[str, Any] | None, task: Task, ctx: TaskContext) -> str | None:
    if not getter:
        return None
    kind = getter.get("type")
    if kind in GETTERS_NEEDING:
        feature = GETTERS_NEEDING[kind]
        if feature not in ctx.capabilities:
            return f"getter {kind!r} needs the slot feature {feature!r}, which this desktop lacks"
        return None
    if kind == "googledrive_file":
        return UNSUPPORTED_STEPS["googledrive"]
    if kind not in SUPPORTED_GETTERS:
        return f"getter {kind!r} is not implemented by drums"
    if kind == "cloud_file":
        urls = _as_list(getter.get("path"))
        dests = _as_list(getter.get("dest"))
        for i, url in enumerate(urls):
            dest = dests[i] if i < len(dests) else None
            if cached_download(task, url, dest, ctx) is None:
                return f"expected file not in the cache: {cache_slot_for(task, url, ctx)}"
    return None


def _step_reason(step: Step, task: Task, ctx: TaskContext) -> str | None:
    if step.type in UNSUPPORTED_STEPS:
        return UNSUPPORTED_STEPS[step.type]
    if step.type not in SUPPORTED_STEPS:
        return f"setup step type {step.type!r} is not implemented by drums"
    params = step.parameters
    if step.type == "download":
        for item in params.get("files", []):
            if cached_download(task, item["url"], item.get("path"), ctx) is None:
                return f"download not in the cache: {cache_slot_for(task, item['url'], ctx)}"
    elif step.type == "upload_file":
        for item in params.get("files", []):
            path = asset_path(item["local_path"], ctx)
            if path is None:
                return (
                    f"upload_file {item['local_path']!r} is outside the assets dir {ctx.assets_dir}"
                )
            if not path.is_file():
                return f"upload_file source missing: {path}"
    elif step.type == "drums_files":
        for item in params.get("files", []):
            path = task_asset(task, item["src"], ctx)
            if path is None or not path.is_file():
                return f"task asset missing: {ctx.assets_dir / task.id / item['src']}"
    return None


def sum_of_sleeps(task: Task) -> float:
    """Seconds of `sleep` steps in config or postconfig, whichever sleeps longer (each list runs
    under its own setup_timeout_s)."""
    return max(
        sum(float(s.parameters.get("seconds", 0)) for s in steps if s.type == "sleep")
        for steps in (task.config, task.evaluator.postconfig)
    )


def support(task: Task, ctx: TaskContext) -> tuple[bool, str | None]:
    """Whether this host can run and score the task, and if not, the first reason why."""
    reason = _support_reason(task, ctx)
    return reason is None, reason


# Getters whose value is a web page as loaded (its text, title or parsed HTML): live sites.
WEB_PAGE_GETTERS = frozenset(
    {"page_info", "info_from_website", "active_tab_html_parse", "active_tab_info", "open_tabs_info"}
)
_WEB_URL = re.compile(r"https?://(?!(?:localhost|127\.0\.0\.1|0\.0\.0\.0)[:/])[^\s'\"]+")


def web_need(task: Task) -> str | None:
    """What in a task's setup or checker reaches a live web site: a URL its steps open or its
    getters compare with, or a getter reading a loaded page. Browsing history written by
    update_browse_history is data, not a visit, and does not count."""
    ev = task.evaluator
    getters = [*_as_list(ev.result), *_as_list(ev.expected)]
    for getter in getters:
        if isinstance(getter, dict) and getter.get("type") in WEB_PAGE_GETTERS:
            return f"its checker reads a loaded web page (getter {getter['type']!r})"
    steps = [s for s in [*task.config, *ev.postconfig] if s.type != "update_browse_history"]
    for where, value in (("setup", [s.parameters for s in steps]), ("checker", getters)):
        for text in strings_in(value):
            url = _WEB_URL.search(text)
            if url:
                return f"its {where} names the web site {url.group(0)}"
    return None


def _support_reason(task: Task, ctx: TaskContext) -> str | None:
    if task.proxy:
        # OSWorld runs a proxy task without its proxy when enable_proxy is off; the flag says
        # the task's sites want one. Offline here unless its setup or checker needs a site.
        web = web_need(task)
        if web:
            return f"proxy task: {web}, and slots have no network (OSWorld uses its proxy pool)"
    windows = task.windows_hint
    if windows:
        return f"a Windows task (it names {windows!r}); slots run Linux"
    if ctx.apps is not None:
        reason = missing_app_reason(task, ctx.apps)
        if reason:
            return reason
    for step in [*task.config, *task.evaluator.postconfig]:
        reason = _step_reason(step, task, ctx)
        if reason:
            return reason
    fetch = network_setup_command(task)
    if fetch:
        return f"its setup fetches packages (`{fetch}`), which needs the network (slots have none)"
    systemd = systemd_command(task)
    if systemd:
        return f"it runs `{systemd}`, which needs systemd's services (slots run no systemd)"
    slept = sum_of_sleeps(task)
    if slept > ctx.setup_timeout_s:
        # Each sleep is within MAX_SLEEP_S, but setup as a whole would time out at a 504 after
        # setup_timeout_s with the slot held: refuse it before it starts (issue 14, finding 9).
        return (
            f"its sleep steps add up to {slept:g} s, more than setup_timeout_s "
            f"({ctx.setup_timeout_s:g} s)"
        )
    ev = task.evaluator
    if ev.is_infeasible:
        return None
    getters = [*_as_list(ev.result), *_as_list(ev.expected)]
    if ev.redundant:
        getters += [*_as_list(ev.redundant.get("result")), *_as_list(ev.redundant.get("expected"))]
    for getter in getters:
        reason = _getter_reason(getter, task, ctx)
        if reason:
            return reason
    unsolvable = unsolvable_reason(task, ctx.apps)
    if unsolvable:
        return unsolvable
    if ev.is_drums_verifier:
        if not ev.module or not ev.check:
            return "drums_verifier evaluator needs 'module' and 'check'"
        if find_verifier_module(ev.module, ctx) is None:
            dirs = ", ".join(map(str, ctx.verifier_dirs)) or "(no verifier_dirs configured)"
            return f"verifier module {ev.module!r} not found under {dirs}"
        return None
    funcs = list(ev.funcs)
    if ev.redundant:
        funcs += _as_list(ev.redundant.get("func"))
    for func in funcs:
        if ctx.metrics is None:
            return "the checker venv is not built yet (drumsd builds it at start)"
        reason = ctx.metrics.why_unsupported(func)
        if reason:
            return reason
    return _shape_reason(ev)


def _shape_reason(ev: Evaluator) -> str | None:
    """A func list needs result (and expected/options, when given) lists of the same length."""
    if ev.is_drums_verifier:
        return None  # one check over every result file: check({dest: path}, options)
    if not isinstance(ev.func, list):
        if isinstance(ev.result, list):
            return "evaluator has one func but a list of results"
        return None
    n = len(ev.func)
    for name in ("result", "expected", "options"):
        value = getattr(ev, name)
        if value is not None and value != [] and value != {}:
            if not isinstance(value, list) or len(value) != n:
                return f"evaluator lists {n} funcs but {name} is not a list of {n}"
    return None


def find_verifier_module(module: str, ctx: TaskContext) -> Path | None:
    """The directory holding a drums verifier module (`<dir>/<module>.py` or a package)."""
    top = module.split(".")[0]
    for directory in ctx.verifier_dirs:
        if (directory / f"{top}.py").is_file() or (directory / top / "__init__.py").is_file():
            return directory
    return None


def task_domain(task: Task, task_dirs: Sequence[Path]) -> str | None:
    """OSWorld files a task as <examples>/<domain>/<id>.json: the directory holding the file when
    it lies below a task directory (not in it), else the task's snapshot (an inline task, or a
    file directly in a task directory)."""
    if task.source_path is not None:
        path = task.source_path.resolve()
        for root in task_dirs:
            try:
                rel = path.relative_to(root.resolve())
            except ValueError:
                continue
            if len(rel.parts) > 1:
                return rel.parts[-2]
    return task.snapshot


def task_source(task: Task) -> str | None:
    """The task file's `source` (where OSWorld took the task from), when it is a string."""
    source = (task.model_extra or {}).get("source")
    return source if isinstance(source, str) else None


class TaskSupport(BaseModel):
    """One row of `GET /v1/tasks`."""

    id: str
    path: str | None = None
    instruction: str = ""
    source: str | None = None  # the task file's `source` (where OSWorld took the task from)
    domain: str | None = None  # task_domain
    supported: bool
    reason: str | None = None


def task_support_table(ctx: TaskContext) -> list[TaskSupport]:
    """Every task under the configured directories with whether it runs here (and why not).
    A file whose id another file wins (first_by_id: the one a create by id runs) is listed
    unsupported, naming that file, so the table does not promise a task create would not run."""
    tasks, broken = list_tasks(ctx.task_dirs)
    rows = []
    first = first_by_id(tasks)
    for task in tasks:
        earlier = first[task.id]
        if earlier is not task:
            ok, reason = (
                False,
                f"its id is taken by {earlier.source_path}, which a create by id runs",
            )
        else:
            ok, reason = support(task, ctx)
        rows.append(
            TaskSupport(
                id=task.id,
                path=str(task.source_path) if task.source_path else None,
                instruction=task.instruction,
                source=task_source(task),
                domain=task_domain(task, ctx.task_dirs),
                supported=ok,
                reason=reason,
            )
        )
    for path, why in broken.items():
        rows.append(TaskSupport(id=path.stem, path=str(path), supported=False, reason=why))
    return rows
