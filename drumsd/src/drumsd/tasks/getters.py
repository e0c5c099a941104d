"""drums' own implementations of OSWorld's getters, reading the slot through SlotAccess.

A getter turns one `result`/`expected` config into the value a metric takes: plain JSON, or a
`FileArg` (bytes that the checker sees as a path in its scratch directory). The answers follow
OSWorld's getters (same defaults, same shapes), with Google Chrome's profile read from Chromium's.
"""

from __future__ import annotations

import copy
import json
import shlex
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import trio

from .model import Task, TaskContext, cache_slot_for, cached_download
from .settings_copy import DCONF_DB, SettingsCopyError, reads_settings, settings_copy, with_settings
from .setup import SlotAccess


class GetterError(RuntimeError):
    """A getter could not read the slot (the message says what and where)."""


class GetterUnsupported(GetterError):
    """The getter needs something this slot or host does not have."""


class ResultMissing(GetterError):
    """The result file does not exist: OSWorld scores that 0."""


@dataclass(frozen=True)
class FileArg:
    name: str  # relative path inside the checker's scratch directory
    data: bytes | None  # None: no such file (OSWorld's getters pass None then)


@dataclass(frozen=True)
class XlsxLastRow:
    """OSWorld's content_from_vm_file(xlsx, last_row): computed inside the checker venv."""

    file: FileArg


@dataclass
class GetterEnv:
    access: SlotAccess
    ctx: TaskContext
    task: Task
    prefix: str  # scratch sub-directory for this getter's files, e.g. "result0"
    run_dir: Path | None  # the episode's cache dir (execute stdout=..., cache_file)
    role: str  # "result" or "expected"

    def file_name(self, dest: str) -> str:
        return f"{self.prefix}/{PurePosixPath(dest).name or 'file'}"

    def home(self, path: str) -> str:
        return self.ctx.user_home + path[1:] if path.startswith("~") else path

    @property
    def timeout_s(self) -> float:
        return self.ctx.getter_timeout_s


Getter = Callable[[dict[str, Any], GetterEnv], Awaitable[Any]]
GETTERS: dict[str, Getter] = {}


def getter(*names: str) -> Callable[[Getter], Getter]:
    def register(fn: Getter) -> Getter:
        for name in names:
            GETTERS[name] = fn
        return fn

    return register


async def _read(env: GetterEnv, path: str) -> bytes | None:
    try:
        with trio.fail_after(env.timeout_s):
            return await env.access.read_file(env.home(path))
    except FileNotFoundError:
        return None
    except trio.TooSlowError as exc:
        raise GetterError(f"reading {path} from the slot took over {env.timeout_s} s") from exc


async def run_python(env: GetterEnv, script: str, args: list[str]) -> tuple[int, str, str]:
    """A stdlib Python script of drums run in the slot as the desktop user (the image's python3),
    for what only the desktop's session answers (its X clients, apps' local servers). `-I`: no
    working directory, user site or PYTHON* variable on its path, so nothing the agent wrote
    is imported (issue 39, D2)."""
    argv = [env.ctx.python_command, "-I", "-c", script, *args]
    return await env.access.exec_user(argv, env.timeout_s)


def _listify(config: dict[str, Any], key: str) -> list[Any]:
    value = config[key]
    return value if isinstance(value, list) else [value]


def _pick(items: list[Any], config: dict[str, Any]) -> Any:
    gives = set(config.get("gives", [0]))
    chosen = [item for i, item in enumerate(items) if i in gives]
    return chosen[0] if len(chosen) == 1 else chosen


@getter("vm_file")
async def vm_file(config: dict[str, Any], env: GetterEnv) -> Any:
    paths = _listify(config, "path") if config.get("multi") else [config["path"]]
    dests = _listify(config, "dest") if config.get("multi") else [config["dest"]]
    if config.get("time_suffix") and not config.get("multi"):
        stem, dot, ext = dests[0].rpartition(".")
        stamp = datetime.now().strftime(config.get("time_format", "%Y%m%d_%H%M%S"))
        dests = [f"{stem}_{stamp}.{ext}" if dot else f"{dests[0]}_{stamp}"]
    files = [
        FileArg(env.file_name(d), await _read(env, p)) for p, d in zip(paths, dests, strict=False)
    ]
    if not config.get("multi") and files[0].data is None and env.role == "result":
        raise ResultMissing(f"result file {paths[0]} does not exist in the slot")
    return _pick(files, config)


@getter("cloud_file")
async def cloud_file(config: dict[str, Any], env: GetterEnv) -> Any:
    urls = _listify(config, "path") if config.get("multi") else [config["path"]]
    dests = _listify(config, "dest") if config.get("multi") else [config["dest"]]
    files = []
    for url, dest in zip(urls, dests, strict=False):
        cached = cached_download(env.task, url, dest, env.ctx)
        if cached is None:
            where = cache_slot_for(env.task, url, env.ctx)
            raise GetterUnsupported(f"expected file not in the cache: {where}")
        files.append(FileArg(env.file_name(dest), cached.read_bytes()))
    return _pick(files, config)


@getter("cache_file")
async def cache_file(config: dict[str, Any], env: GetterEnv) -> Any:
    if env.run_dir is None:
        raise GetterError("cache_file needs the episode's run dir, which verify was not given")
    path = env.run_dir / config["path"]
    if not path.is_file():
        if env.role == "result":
            raise ResultMissing(f"cache file {path} was not written by setup")
        return FileArg(env.file_name(config["path"]), None)
    return FileArg(env.file_name(config["path"]), path.read_bytes())


@getter("content_from_vm_file")
async def content_from_vm_file(config: dict[str, Any], env: GetterEnv) -> Any:
    if config.get("file_type") != "xlsx" or config.get("file_content") != "last_row":
        raise GetterUnsupported(
            f"content_from_vm_file supports xlsx/last_row only, not {config.get('file_type')}/"
            f"{config.get('file_content')} (as OSWorld)"
        )
    data = await _read(env, config["path"])
    if data is None:
        raise ResultMissing(f"file {config['path']} does not exist in the slot")
    return XlsxLastRow(FileArg(env.file_name(config["path"]), data))


async def _command(config: dict[str, Any], env: GetterEnv) -> tuple[int, str, str]:
    command = config["command"]
    if isinstance(command, list) and config.get("shell"):
        command = " ".join(command)
    try:
        with trio.fail_after(env.timeout_s + 5):
            # The task's own command reads what the agent made: isolated from it (issue 39, D2).
            db = (lambda: _read(env, DCONF_DB)) if reads_settings(command) else None
            async with settings_copy(env.access, db, env.timeout_s) as where:
                return await env.access.exec_checker(with_settings(command, where), env.timeout_s)
    except (TimeoutError, trio.TooSlowError) as exc:
        raise GetterError(f"getter command took over {env.timeout_s} s: {command}") from exc
    except SettingsCopyError as exc:
        raise GetterError(str(exc)) from exc


@getter("vm_command_line")
async def vm_command_line(config: dict[str, Any], env: GetterEnv) -> str:
    return (await _command(config, env))[1]


@getter("vm_command_error")
async def vm_command_error(config: dict[str, Any], env: GetterEnv) -> str:
    return (await _command(config, env))[2]


@getter("vm_terminal_output")
async def vm_terminal_output(config: dict[str, Any], env: GetterEnv) -> Any:
    reader = getattr(env.access, "terminal_output", None)
    if "terminal_output" not in env.ctx.capabilities or reader is None:
        raise GetterUnsupported("vm_terminal_output needs the slot feature 'terminal_output'")
    text = await reader()
    return text.rstrip() if isinstance(text, str) else None  # OSWorld strips the widget's text


@getter("accessibility_tree")
async def accessibility_tree(config: dict[str, Any], env: GetterEnv) -> Any:
    reader = getattr(env.access, "accessibility_tree", None)
    if "accessibility_tree" not in env.ctx.capabilities or reader is None:
        raise GetterUnsupported("accessibility_tree needs the slot feature 'accessibility_tree'")
    # Only the image's binaries among the task's apps: the desktop user can put any app on
    # the bus (issue 36).
    return await reader(env.task.related_apps)


_LIST_DIR_SCRIPT = r"""
import json, os, sys
def tree(path):
    node = {"name": os.path.basename(path), "type": "directory", "children": []}
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            node["children"].append(tree(entry.path))
        else:
            node["children"].append({"name": entry.name, "type": "file"})
    return node
print(json.dumps(tree(os.path.expanduser(sys.argv[1]))))
"""


@getter("list_directory")
async def list_directory(config: dict[str, Any], env: GetterEnv) -> Any:
    argv = [env.ctx.python_command, "-I", "-c", _LIST_DIR_SCRIPT, env.home(config["path"])]
    rc, out, err = await env.access.exec_checker(argv, env.timeout_s)
    if rc != 0:
        if env.role == "result":
            raise ResultMissing(f"cannot list {config['path']}: {err.strip()[-300:]}")
        return None
    return json.loads(out)


@getter("rule")
async def rule(config: dict[str, Any], env: GetterEnv) -> Any:
    return copy.deepcopy(config["rules"])


@getter("time_diff_range")
async def time_diff_range(config: dict[str, Any], env: GetterEnv) -> Any:
    return config.get("diff_range_in_minutes")


# ---- rule_relativeTime -----------------------------------------------------------------------

_DOW = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]  # fmt: skip


def format_day(template: str, day: datetime) -> str:
    """OSWorld's time-format tokens: {DoW} {Month} {DayD} {Year} {Month0D} {month} {MonthFull}
    {Day0D} {MonthD}, each replaced once, in that order."""
    replacements = [
        ("{DoW}", _DOW[day.weekday()]),
        ("{Month}", _MONTHS[day.month - 1][:3]),
        ("{DayD}", str(day.day)),
        ("{Year}", str(day.year)),
        ("{Month0D}", f"{day.month:02d}"),
        ("{month}", _MONTHS[day.month - 1].lower()),
        ("{MonthFull}", _MONTHS[day.month - 1]),
        ("{Day0D}", f"{day.day:02d}"),
        ("{MonthD}", str(day.month)),
    ]
    for token, value in replacements:
        template = template.replace(token, value, 1)
    return template


def _nth_next_month(now: datetime, day: int) -> datetime:
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return now.replace(year=year, month=month, day=day, hour=0, minute=0, second=0, microsecond=0)


def _first_monday_months_later(now: datetime, months: int) -> datetime:
    month0 = now.month - 1 + months
    year, month = now.year + month0 // 12, month0 % 12 + 1
    first = now.replace(year=year, month=month, day=1, hour=0, minute=0, second=0, microsecond=0)
    return first + timedelta(days=(7 - first.weekday()) % 7)


def relative_day(phrase: str, now: datetime, start: tuple[str, datetime] | None = None) -> datetime:
    """The day a phrase of OSWorld's relative-time rules means (`start`: the range's from)."""
    wd = now.weekday()
    after = lambda days: now + timedelta(days=days)  # noqa: E731
    if phrase == "tomorrow":
        return after(1)
    if phrase in ("5th next month", "10th next month", "11th next month"):
        return _nth_next_month(now, int(phrase.split("th", 1)[0]))
    if phrase == "this month":
        return now
    if phrase == "this Saturday":
        return after(5 - wd)
    if phrase == "this Sunday":
        return after(6 - wd)
    if phrase in ("next Monday", "next Monday split"):
        return after(7 - wd)
    if phrase == "first monday four months later":
        return _first_monday_months_later(now, 4)
    if phrase == "first monday eight months later":
        return _first_monday_months_later(now, 8)
    if phrase in ("next Friday", "next Friday split"):
        if start is not None and start[0] in ("next Monday", "next Monday split"):
            return start[1] + timedelta(days=4)
        if start is None:
            return after(4 - wd if wd < 4 else (7 if wd == 4 else 11 - wd))
        return after(4 - wd if wd < 4 else 11 - wd)
    if phrase == "next Saturday":
        return after(5 - wd if wd < 5 else (7 if wd == 5 else 6))
    if phrase == "next Sunday":
        if start is not None and start[0] in ("next Friday", "next Saturday"):
            return start[1] + timedelta(days=6 - start[1].weekday())
        return after(6 - wd if wd < 6 else 7)
    if phrase == "next week Friday":
        return after(11 - wd)
    if phrase == "next week Saturday":
        return after(12 - wd)
    if phrase == "next week Sunday":
        if start is not None and start[0] in ("next week Friday", "next week Saturday"):
            return start[1] + timedelta(days=6 - start[1].weekday())
        return after(13 - wd)
    raise GetterUnsupported(f"rule_relativeTime does not know the phrase {phrase!r}")


def resolve_relative_rules(rules: dict[str, Any], now: datetime) -> dict[str, Any]:
    """OSWorld's get_rule_relativeTime: fill the expected times from the relative phrases."""
    rules = copy.deepcopy(rules)
    relative = rules["relativeTime"]
    expected = rules["expected"]
    start_phrase = relative["from"]
    start = relative_day(start_phrase, now)
    if "to" not in relative:
        expected["time"] = format_day(expected["time"], start)
        return rules
    if start_phrase == "next Monday split":
        for key in ("puDay", "puMonth", "puYear"):
            expected[key] = format_day(expected[key], start)
    else:
        expected["from"] = format_day(expected["from"], start)
    end_phrase = relative["to"]
    end = relative_day(end_phrase, now, (start_phrase, start))
    if end_phrase == "next Friday split":
        for key in ("doDay", "doMonth", "doYear"):
            expected[key] = format_day(expected[key], end)
    else:
        expected["to"] = format_day(expected["to"], end)
    return rules


@getter("rule_relativeTime")
async def rule_relative_time(config: dict[str, Any], env: GetterEnv) -> Any:
    rules = config["rules"]
    zone_name = rules.get("timezone") or env.ctx.timezone
    try:
        zone = ZoneInfo(zone_name)
    except ZoneInfoNotFoundError:
        zone = ZoneInfo("UTC")
    return resolve_relative_rules(rules, datetime.now(zone))


# ---- applications ----------------------------------------------------------------------------


@getter("gimp_config_file")
async def gimp_config_file(config: dict[str, Any], env: GetterEnv) -> Any:
    path = f"{env.ctx.user_home}/.config/GIMP/2.10/{config['file_name']}"
    data = await _read(env, path)
    if data is None and env.role == "result":
        raise ResultMissing(f"GIMP config file {path} does not exist in the slot")
    return FileArg(env.file_name(config["dest"]), data)


@getter("vscode_config")
async def vscode_config(config: dict[str, Any], env: GetterEnv) -> Any:
    # OSWorld replays ctrl+shift+p, the extension command and enter, then reads the file.
    code = (
        "import pyautogui, time; pyautogui.hotkey('ctrl', 'shift', 'p'); time.sleep(0.5); "
        f"pyautogui.typewrite({config['vscode_extension_command']!r}); pyautogui.press('enter')"
    )
    await env.access.exec_user([env.ctx.python_command, "-I", "-c", code], env.timeout_s)
    await trio.sleep(1.0)
    return await vm_file({"path": config["path"], "dest": config["dest"]}, env)


# ---- Chrome profile getters, read from Chromium's profile ------------------------------------


def _profile(env: GetterEnv, *parts: str) -> str:
    return "/".join([env.home(env.ctx.chrome_profile_dir), *parts])


async def _profile_json(env: GetterEnv, *parts: str) -> Any:
    data = await _read(env, _profile(env, *parts))
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _prefs_getter(
    name: str, extract: Callable[[dict[str, Any]], Any], default: Any, local_state: bool = False
) -> None:
    async def read(config: dict[str, Any], env: GetterEnv) -> Any:
        parts = ("Local State",) if local_state else ("Default", "Preferences")
        data = await _profile_json(env, *parts)
        if not isinstance(data, dict):
            return copy.deepcopy(default)
        try:
            return extract(data)
        except (KeyError, TypeError, AttributeError):
            return copy.deepcopy(default)

    read.__name__ = f"get_{name}"
    GETTERS[name] = read


def _truth(value: Any) -> str:
    return "true" if value else "false"


_FONT_DEFAULT = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}

_prefs_getter("profile_name", lambda d: d.get("profile", {}).get("name"), None)
_prefs_getter("enable_do_not_track", lambda d: _truth(d.get("enable_do_not_track", {})), "false")
_prefs_getter(
    "default_search_engine",
    lambda d: (
        d.get("default_search_provider_data", {})
        .get("template_url_data", {})
        .get("short_name", "Google")
    ),
    "Google",
)
_prefs_getter(
    "chrome_language", lambda d: d.get("intl", {}).get("app_locale", "en-US"), "en-US", True
)
_prefs_getter(
    "chrome_font_size",
    lambda d: d.get("webkit", {}).get("webprefs", dict(_FONT_DEFAULT)),
    {"default_fixed_font_size": 13, "default_font_size": 16},
)
_prefs_getter(
    "enabled_experiments",
    lambda d: d.get("browser", {}).get("enabled_labs_experiments", []),
    [],
    True,
)
_prefs_getter(
    "new_startup_page",
    lambda d: (
        "true"
        if "session" not in d
        else _truth(d.get("session", {}).get("restore_on_startup", {}) == 5)
    ),
    "Google",
)
_prefs_getter(
    "data_delete_automacally",
    lambda d: _truth(d["profile"].get("default_content_setting_values") is not None),
    "Google",
)
_prefs_getter(
    "enable_enhanced_safety_browsing",
    lambda d: _truth(d.get("safebrowsing", {}).get("enhanced", {})),
    "Google",
)
_prefs_getter(
    "enable_safe_browsing",
    lambda d: _truth(
        d.get("safebrowsing", {}).get("enhanced", False)
        or d.get("safebrowsing", {}).get("enabled", False)
    ),
    "false",
)
_prefs_getter(
    "find_unpacked_extension_path",
    lambda d: [ext["path"] for ext in d.get("extensions", {}).get("settings", {}).values()],
    "Google",
)
_prefs_getter(
    "find_installed_extension_name",
    lambda d: [
        ext["manifest"]["name"] for ext in d.get("extensions", {}).get("settings", {}).values()
    ],
    "Google",
)


@getter("bookmarks")
async def bookmarks(config: dict[str, Any], env: GetterEnv) -> Any:
    data = await _profile_json(env, "Default", "Bookmarks")
    return data.get("roots", {}) if isinstance(data, dict) else []


def _query_sqlite(data: bytes, query: str) -> list[list[Any]]:
    with tempfile.TemporaryDirectory(prefix="drums-getter-") as tmp:
        db = Path(tmp) / "db.sqlite"
        db.write_bytes(data)
        conn = sqlite3.connect(db)
        try:
            return [list(row) for row in conn.execute(query).fetchall()]
        finally:
            conn.close()


async def _sqlite_getter(env: GetterEnv, parts: tuple[str, ...], query: str) -> Any:
    data = await _read(env, _profile(env, *parts))
    if data is None:
        return None
    try:
        return await trio.to_thread.run_sync(_query_sqlite, data, query)
    except sqlite3.Error:
        return None


@getter("history")
async def history(config: dict[str, Any], env: GetterEnv) -> Any:
    return await _sqlite_getter(
        env, ("Default", "History"), "SELECT url, title, last_visit_time FROM urls"
    )


@getter("cookie_data")
async def cookie_data(config: dict[str, Any], env: GetterEnv) -> Any:
    return await _sqlite_getter(env, ("Default", "Cookies"), "SELECT * FROM cookies")


_OPEN_TABS_SCRIPT = r"""
import json, sys, urllib.request
with urllib.request.urlopen("http://127.0.0.1:%s/json/list" % sys.argv[1], timeout=10) as r:
    pages = [t for t in json.load(r) if t.get("type") == "page"]
print(json.dumps([{"title": p.get("title", ""), "url": p.get("url", "")} for p in pages]))
"""


@getter("open_tabs_info")
async def open_tabs_info(config: dict[str, Any], env: GetterEnv) -> Any:
    argv = [env.ctx.python_command, "-I", "-c", _OPEN_TABS_SCRIPT, str(env.ctx.devtools_port)]
    rc, out, err = await env.access.exec_user(argv, env.timeout_s)
    if rc != 0:
        raise GetterError(f"open_tabs_info: DevTools not reachable in the slot: {err[-300:]}")
    return json.loads(out)


async def get_value(config: dict[str, Any] | None, env: GetterEnv) -> Any:
    """Run the getter a result/expected config names."""
    if config is None:
        return None
    kind = config.get("type")
    fn = GETTERS.get(str(kind))
    if fn is None:
        raise GetterUnsupported(f"getter {kind!r} is not implemented by drums")
    try:
        return await fn(config, env)
    except KeyError as exc:
        raise GetterError(f"getter {kind!r} lacks the config key {exc}") from exc


def command_text(command: list[str] | str) -> str:
    return command if isinstance(command, str) else shlex.join(command)


# The getters in their own modules register themselves on import.
from . import getters_chrome, getters_desktop  # noqa: E402, F401
