"""OSWorld-format tasks: the pydantic model, loading, placeholders and the cached files.

Pure: reads task files and the local caches, never a slot. What this host can run is answered
from these records by `tasks/host_support.py`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from drumsd.linux.image_apps import AppManifest


@dataclass(frozen=True)
class MetricCatalog:
    """What the probe found: exported metric names and why some cannot run here."""

    exported: dict[str, str] = field(default_factory=dict)  # name -> metric module
    unsupported: dict[str, str] = field(default_factory=dict)  # name -> reason

    def why_unsupported(self, func: str) -> str | None:
        if func in self.unsupported:
            return f"metric {func!r} is unsupported here: {self.unsupported[func]}"
        if func not in self.exported:
            return f"metric {func!r} is not one of desktop-env's exported metric functions"
        return None


NOBODY = 65534


@dataclass(frozen=True)
class CheckerEnv:
    """Where and as whom checker processes run."""

    python: Path  # the checker venv's python
    runner: Path  # checker_runner.py inside the venv
    uid: int = NOBODY
    gid: int = NOBODY
    scratch_root: Path = Path("/tmp")
    memory_mib: int | None = None  # address space a call may add (RLIMIT_AS); None: no limit
    cpu_s: float | None = None  # CPU seconds of a call (RLIMIT_CPU); None: no limit


class TaskError(ValueError):
    """A task could not be found or read; the message says which and why."""


class Step(BaseModel):
    """One setup or postconfig step: {"type": ..., "parameters": {...}}."""

    model_config = ConfigDict(extra="allow")

    type: str
    parameters: dict[str, Any] = Field(default_factory=dict)


# ---- the shapes of setup steps' parameters, checked when a task is loaded (issue 14) ----------
# A task with a step whose parameters would only fail half-way through setup (a KeyError, a
# TypeError, a sleep of 1e9 s) is refused at create with the step and field named.

MAX_SLEEP_S = 300.0


class _Params(BaseModel):
    model_config = ConfigDict(extra="allow")


class _CommandParams(_Params):
    command: StrictStr | list[StrictStr]
    shell: bool = False
    stdout: StrictStr | None = None
    stderr: StrictStr | None = None


class _OpenParams(_Params):
    path: StrictStr


class _SleepParams(_Params):
    seconds: float = Field(ge=0, le=MAX_SLEEP_S)


class _WindowParams(_Params):
    window_name: StrictStr
    strict: bool = False
    by_class: bool = False


class _OpenTabsParams(_Params):
    urls_to_open: list[StrictStr]


class _CloseTabsParams(_Params):
    urls_to_close: list[StrictStr]


class _HistoryItem(_Params):
    url: StrictStr
    title: StrictStr = ""
    visit_time_from_now_in_seconds: float = 0


class _HistoryParams(_Params):
    history: list[_HistoryItem] = Field(default_factory=list)


class _DownloadItem(_Params):
    url: StrictStr
    path: StrictStr


class _DownloadParams(_Params):
    files: list[_DownloadItem]


class _UploadItem(_Params):
    local_path: StrictStr
    path: StrictStr


class _UploadParams(_Params):
    files: list[_UploadItem]


class _DrumsFileItem(_Params):
    src: StrictStr
    path: StrictStr
    owner_user: bool = True


class _DrumsFilesParams(_Params):
    files: list[_DrumsFileItem]


STEP_PARAMETERS: dict[str, type[_Params]] = {
    "execute": _CommandParams,
    "command": _CommandParams,
    "launch": _CommandParams,
    "open": _OpenParams,
    "sleep": _SleepParams,
    "activate_window": _WindowParams,
    "close_window": _WindowParams,
    "chrome_open_tabs": _OpenTabsParams,
    "chrome_close_tabs": _CloseTabsParams,
    "update_browse_history": _HistoryParams,
    "download": _DownloadParams,
    "upload_file": _UploadParams,
    "drums_files": _DrumsFilesParams,
}


def step_problem(step: Step) -> str | None:
    """What is wrong with this step's parameters (None: fine, or a type drums does not know,
    which support() reports)."""
    model = STEP_PARAMETERS.get(step.type)
    if model is None:
        return None
    try:
        model.model_validate(step.parameters)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "parameters"
        return f"parameter {where}: {first['msg']}"
    return None


class ScopeManifest(BaseModel):
    """Which files a solution may change: roots to watch, files setup seeded, allowed globs."""

    model_config = ConfigDict(extra="forbid")

    roots: list[str]
    seeded: dict[str, str] = Field(default_factory=dict)  # slot path -> sha256 of the seed
    allow: list[str] = Field(default_factory=list)


class Evaluator(BaseModel):
    """OSWorld's evaluator block, plus drums' `drums_verifier` fields and `redundant`."""

    model_config = ConfigDict(extra="allow")

    func: str | list[str]
    conj: str = "and"
    result: dict[str, Any] | list[dict[str, Any]] | None = None
    expected: dict[str, Any] | list[dict[str, Any] | None] | None = None
    options: dict[str, Any] | list[dict[str, Any] | None] | None = None
    postconfig: list[Step] = Field(default_factory=list)
    # drums_verifier: a checker function in an installed verifier module directory.
    module: str | None = None
    check: str | None = None
    check_alt: str | None = None
    scope: ScopeManifest | None = None
    # A second, independently written checker over the same slot (the audit compares them).
    redundant: dict[str, Any] | None = None

    @field_validator("conj")
    @classmethod
    def _known_conj(cls, value: str) -> str:
        if value not in ("and", "or"):
            raise ValueError(f"conj must be 'and' or 'or', not {value!r}")
        return value

    @property
    def funcs(self) -> list[str]:
        return self.func if isinstance(self.func, list) else [self.func]

    @property
    def is_infeasible(self) -> bool:
        return self.func == "infeasible"

    @property
    def is_drums_verifier(self) -> bool:
        return self.func == "drums_verifier"


class Task(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    instruction: str = ""
    snapshot: str | None = None
    config: list[Step] = Field(default_factory=list)
    evaluator: Evaluator
    proxy: bool = False
    related_apps: list[str] = Field(default_factory=list)
    source_path: Path | None = Field(default=None, exclude=True)

    @field_validator("id")
    @classmethod
    def _id_is_a_file_name(cls, value: str) -> str:
        # The id names the task's asset and cache directories: one plain name, never a path.
        if not is_path_component(value):
            raise ValueError(f"a task id is one file name (no '/', not '.' or '..'), not {value!r}")
        return value

    @model_validator(mode="after")
    def _steps_are_well_formed(self) -> Task:
        for name, steps in (("config", self.config), ("postconfig", self.evaluator.postconfig)):
            for index, step in enumerate(steps):
                problem = step_problem(step)
                if problem is not None:
                    raise ValueError(f"{name} step {index + 1} ({step.type}): {problem}")
        return self

    @property
    def scope(self) -> ScopeManifest | None:
        if self.evaluator.scope is not None:
            return self.evaluator.scope
        raw = (self.model_extra or {}).get("scope")
        return ScopeManifest.model_validate(raw) if raw is not None else None

    @property
    def infeasible(self) -> bool:
        return self.evaluator.is_infeasible

    @property
    def windows_hint(self) -> str | None:
        """A Windows path or program in the task's steps or getters (`C:\\...`, `ncat.exe`), or a
        Windows-only related app: OSWorld's checkout keeps Windows tasks beside the Linux ones,
        some under the same id (26660ad1, 6d72aad6)."""
        app = next((a for a in self.related_apps if a.lower() in WINDOWS_APPS), None)
        if app is not None:
            return app
        ev = self.evaluator
        found = (
            WINDOWS_HINT.search(text)
            for text in strings_in(
                [[s.parameters for s in [*self.config, *ev.postconfig]], ev.result, ev.expected]
            )
        )
        return next((m.group(0).strip("\"' ") for m in found if m), None)


# Related apps that only OSWorld's Windows tasks name (Microsoft Office's).
WINDOWS_APPS = frozenset({"excel", "word", "ppt", "powerpoint"})
# A drive path (C:\Users\...) or an .exe program: what only a Windows task names. Not `e:\n`: a
# letter, a colon and an escaped newline or tab ends a line of embedded Python (`except ... as
# e:\n`), which refused e8172110, a Linux GIMP task, as Windows.
WINDOWS_HINT = re.compile(
    r"(?:^|[\s\"'])[A-Za-z]:\\(?![ntr](?:[\s\"'\\]|$))[^\s\"']*|[\w.-]+\.exe\b", re.IGNORECASE
)


def strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings_in(item)


class TaskContext(BaseModel):
    """What the task bridge needs to know about this host and its desktops."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    task_dirs: list[Path] = Field(default_factory=list)
    cache_dir: Path = Path("/var/cache/drums/osworld-files")
    assets_dir: Path = Path("/var/lib/drums/task-assets")
    verifier_dirs: list[Path] = Field(default_factory=list)
    # What OSWorld's placeholders become. The password is not a secret of the slot: drums never
    # gives the desktop user sudo, root steps run through trusted provisioning instead.
    client_password: str = "password"
    screen_width: int = 1920
    screen_height: int = 1080
    user_home: str = "/home/user"
    # OSWorld tasks name Google Chrome; the desktops run Chromium through the images'
    # google-chrome wrapper (image_profiles.GOOGLE_CHROME_WRAPPER: no sandbox, maximized, no
    # first-run import of Debian's bookmarks, DevTools on 1337), so a task's own command runs as
    # it is written. chrome_process is the name its processes have (what pkill/killall match).
    chrome_command: list[str] = Field(
        default_factory=lambda: ["google-chrome", "--remote-debugging-port=1337"]
    )
    chrome_process: str = "chromium"
    chrome_profile_dir: str = "~/.config/chromium"
    devtools_port: int = 1337
    vlc_http_port: int = 8080  # VLC's HTTP interface (OSWorld's vlc_playing_info), in the slot
    vlc_http_password: str = "password"
    python_command: str = "python3"
    timezone: str = "UTC"
    # Features the slot exposes beyond SlotAccess's core ("terminal_output", "accessibility_tree").
    capabilities: frozenset[str] = frozenset()
    metrics: MetricCatalog | None = None  # None: the checker venv is not built yet
    # The desktop image's apps (apps.json); None: no image is known, apps are not checked.
    apps: AppManifest | None = None
    checker: CheckerEnv | None = None  # how checker processes run (None: no checker venv)
    # The exploit suite's verdicts (exploit_verdicts.py): task id -> strategies that won.
    exploit_verdicts: dict[str, list[str]] = Field(default_factory=dict)
    refuse_hackable: bool = True
    step_timeout_s: float = 60.0
    open_timeout_s: float = 60.0
    setup_timeout_s: float = 600.0
    getter_timeout_s: float = 60.0
    eval_timeout_s: float = 120.0


SUPPORTED_STEPS = frozenset(
    {
        "execute",
        "command",
        "launch",
        "open",
        "sleep",
        "activate_window",
        "close_window",
        "chrome_open_tabs",
        "chrome_close_tabs",
        "update_browse_history",
        "upload_file",
        "download",
        "drums_files",
    }
)
UNSUPPORTED_STEPS = {
    "googledrive": "googledrive task: needs a Google account and the network",
    "login": "login task: needs a live web account",
    "proxy": "proxy task: needs OSWorld's proxy pool and the network",
}

PLACEHOLDERS = (
    "{CLIENT_PASSWORD}",
    "{SCREEN_WIDTH_HALF}",
    "{SCREEN_HEIGHT_HALF}",
    "{SCREEN_WIDTH}",
    "{SCREEN_HEIGHT}",
)


def placeholder_values(ctx: TaskContext) -> dict[str, str]:
    return {
        "{CLIENT_PASSWORD}": ctx.client_password,
        "{SCREEN_WIDTH_HALF}": str(ctx.screen_width // 2),
        "{SCREEN_HEIGHT_HALF}": str(ctx.screen_height // 2),
        "{SCREEN_WIDTH}": str(ctx.screen_width),
        "{SCREEN_HEIGHT}": str(ctx.screen_height),
    }


def fill_placeholders(value: Any, ctx: TaskContext) -> Any:
    """Replace OSWorld's placeholders in a string or in each string of a list."""
    if isinstance(value, list):
        return [fill_placeholders(item, ctx) for item in value]
    if not isinstance(value, str):
        return value
    for key, replacement in placeholder_values(ctx).items():
        value = value.replace(key, replacement)
    return value


# ---- loading ---------------------------------------------------------------------------------


def parse_task(data: dict[str, Any], source: Path | None = None) -> Task:
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        where = f" in {source}" if source else ""
        raise TaskError(f"not a valid OSWorld task{where}: {exc}") from exc
    task.source_path = source
    return task


MAX_TASK_FILE_BYTES = 16 << 20


def read_task_bytes(path: Path) -> bytes:
    """A task file's bytes: a regular file of at most MAX_TASK_FILE_BYTES. O_NONBLOCK and the
    fstat check refuse a FIFO or device (a FIFO froze the daemon, /dev/zero never ends)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise TaskError(f"task file {path} is not a regular file")
        data = f.read(MAX_TASK_FILE_BYTES + 1)
    if len(data) > MAX_TASK_FILE_BYTES:
        raise TaskError(f"task file {path} is over {MAX_TASK_FILE_BYTES >> 20} MiB")
    return data


def load_task_file(path: Path) -> Task:
    try:
        data = json.loads(read_task_bytes(path))
    except OSError as exc:
        raise TaskError(f"cannot read task file {path}: {exc}") from exc
    except ValueError as exc:
        raise TaskError(f"task file {path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TaskError(f"task file {path} holds a {type(data).__name__}, not a task object")
    return parse_task(data, path)


def iter_task_files(task_dirs: list[Path]) -> Iterator[Path]:
    for directory in task_dirs:
        if directory.is_dir():
            yield from sorted(directory.rglob("*.json"))


def list_tasks(task_dirs: list[Path]) -> tuple[list[Task], dict[Path, str]]:
    """Every task under the directories, and the files that are not tasks (with why)."""
    tasks: list[Task] = []
    broken: dict[Path, str] = {}
    for path in iter_task_files(task_dirs):
        try:
            tasks.append(load_task_file(path))
        except TaskError as exc:
            broken[path] = str(exc)
    return tasks, broken


def find_task(task_id: str, task_dirs: list[Path]) -> Task:
    """The task with this id: among the files named `<id>.json`, else among every file, the
    first that is not a Windows task, else the first (the rule `first_by_id` states)."""
    named = []
    for path in iter_task_files(task_dirs):
        if path.stem == task_id:
            task = load_task_file(path)
            if task.id == task_id:
                named.append(task)
    if named:
        return min(named, key=_id_rank)
    others = []
    for path in iter_task_files(task_dirs):
        try:
            task = load_task_file(path)
        except TaskError:
            continue
        if task.id == task_id:
            others.append(task)
    if others:
        return min(others, key=_id_rank)
    dirs = ", ".join(map(str, task_dirs)) or "(no task_dirs configured)"
    raise TaskError(f"no task with id {task_id!r} under {dirs}")


def _id_rank(task: Task) -> tuple[bool, bool]:
    """Which of two files with one id a create by id runs (the lower): a file named `<id>.json`
    before one that is not, a Linux task before a Windows one (OSWorld's checkout has 26660ad1
    under Windows/ and multi_apps/), then the earlier file (min keeps the first of equals)."""
    named = task.source_path is not None and task.source_path.stem == task.id
    return (not named, task.windows_hint is not None)


def first_by_id(tasks: list[Task]) -> dict[str, Task]:
    """For each id, the task find_task returns over the same files (in list_tasks' order)."""
    first: dict[str, Task] = {}
    for task in tasks:
        best = first.get(task.id)
        if best is None or _id_rank(task) < _id_rank(best):
            first[task.id] = task
    return first


def resolve_task(ref: str | dict[str, Any] | Path, task_dirs: list[Path]) -> Task:
    """A task given inline (dict), by JSON path, or by id from the task directories."""
    if isinstance(ref, dict):
        return parse_task(ref)
    if isinstance(ref, Path) or ref.endswith(".json") or "/" in ref:
        return load_task_file(Path(ref))
    return find_task(ref, task_dirs)


# ---- cached files and assets -----------------------------------------------------------------


def url_file_name(url: str) -> str:
    return unquote(PurePosixPath(urlparse(url).path).name)


def is_path_component(name: str) -> bool:
    """One plain file name: no separator, no NUL, not `.` or `..` (issue 14: a task id of
    `../../..` must not pick the directory its files are read from)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def beneath(base: Path, *parts: str) -> Path | None:
    """`base/part/...` with every part one plain component and the real path (symlinks
    resolved) still inside base's real path; None otherwise."""
    if not all(is_path_component(p) for p in parts):
        return None
    root = base.resolve()
    candidate = root.joinpath(*parts).resolve()
    if candidate == root or root not in candidate.parents:
        return None
    return candidate


def cached_download(task: Task, url: str, dest_path: str | None, ctx: TaskContext) -> Path | None:
    """Where a download/cloud_file lives in the local cache, or None when it is not there."""
    names = [url_file_name(url)]
    if dest_path:
        names.append(PurePosixPath(dest_path).name)
    for name in names:
        candidate = beneath(ctx.cache_dir, task.id, name)
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def cache_slot_for(task: Task, url: str, ctx: TaskContext) -> str:
    """Where the cached copy of `url` belongs, for messages that say what to put there."""
    slot = beneath(ctx.cache_dir, task.id, url_file_name(url))
    return str(slot) if slot is not None else f"(none: {url!r} names no plain file name)"


def asset_path(local_path: str, ctx: TaskContext) -> Path | None:
    """A file for upload_file, only from inside the configured assets directory."""
    root = ctx.assets_dir.resolve()
    candidate = Path(local_path)
    candidate = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if candidate != root and root not in candidate.parents:
        return None
    return candidate


def task_asset(task: Task, src: str, ctx: TaskContext) -> Path | None:
    """A file of drums_files: `<assets_dir>/<task id>/<src>`, never outside that directory."""
    root = beneath(ctx.assets_dir, task.id)
    if root is None:
        return None
    candidate = (root / src).resolve()
    if root not in candidate.parents:
        return None
    return candidate
