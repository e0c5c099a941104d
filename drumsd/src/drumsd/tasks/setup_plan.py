"""The plan of a task's setup and postconfig steps: small operation records, planned purely.

`plan_steps()` turns a task's OSWorld steps into `Operation` records (printable, testable without
a slot); `tasks/setup.py` applies them. Steps that OSWorld runs with `sudo -S` become `RunTrusted`:
the sudo and password plumbing is stripped and the command goes through drumsd's trusted
provisioning, so the desktop user never gets root or a password.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .model import (
    Step,
    Task,
    TaskContext,
    asset_path,
    cache_slot_for,
    cached_download,
    fill_placeholders,
    task_asset,
)

if TYPE_CHECKING:
    from .setup import SetupReport


class SetupError(RuntimeError):
    """A setup or postconfig step failed; `.report` holds what ran before it."""

    def __init__(self, message: str, report: SetupReport | None = None) -> None:
        super().__init__(message)
        self.report = report


# ---- operations (the plan) -------------------------------------------------------------------


@dataclass(frozen=True)
class RunUser:
    command: list[str] | str
    timeout_s: float
    background: bool = False
    until: dict[str, Any] | None = None
    stdout_name: str | None = None  # OSWorld's execute(stdout=...): saved in the run dir
    stderr_name: str | None = None


@dataclass(frozen=True)
class RunTrusted:
    shell: str
    timeout_s: float


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class OpenFile:
    path: str
    timeout_s: float


@dataclass(frozen=True)
class WindowAction:
    action: str  # "activate" or "close"
    name: str
    strict: bool = False
    by_class: bool = False


@dataclass(frozen=True)
class ChromeTabs:
    action: str  # "open" or "close"
    urls: tuple[str, ...]
    timeout_s: float


@dataclass(frozen=True)
class UpdateHistory:
    items: tuple[tuple[str, str, float], ...]  # (url, title, seconds ago)
    history_path: str
    template: Path | None


@dataclass(frozen=True)
class PutFile:
    source: Path  # on the host: the download cache, the assets dir or a task's assets
    dest: str
    owner_user: bool = True


Operation = (
    RunUser | RunTrusted | Sleep | OpenFile | WindowAction | ChromeTabs | UpdateHistory | PutFile
)


# ---- planning (pure) -------------------------------------------------------------------------

_SUDO_PIPE = re.compile(r"echo\s+(?:'[^']*'|\"[^\"]*\"|\S+)\s*\|\s*sudo\s+(?:-\S+\s+)*")
_SUDO_WORD = re.compile(r"(^|[;&|(]\s*)sudo\s+(?:-\S+\s+)*")
_BROWSERS = ("google-chrome", "google-chrome-stable", "chrome")


def _expand_home(shell: str, ctx: TaskContext) -> str:
    # Root's shell would expand ~ to /root; OSWorld's commands mean the desktop user's home.
    return re.sub(r"(?<![\w/])~(?=/|\s|$)", ctx.user_home, shell)


def strip_sudo(command: list[str] | str, ctx: TaskContext) -> str | None:
    """The root part of a command that uses sudo, as a shell string; None when it needs no root."""
    if isinstance(command, list):
        if not command or command[0] != "sudo":
            return None
        rest = list(command[1:])
        while rest and rest[0].startswith("-"):
            rest.pop(0)
        return _expand_home(shlex.join(rest), ctx)
    if not re.search(r"(^|[;&|(\s])sudo\s", command):
        return None
    stripped = _SUDO_PIPE.sub("", command)
    stripped = _SUDO_WORD.sub(r"\1", stripped).strip()
    return _expand_home(stripped, ctx)


def _browser_argv(argv: list[str], ctx: TaskContext) -> list[str]:
    if argv and argv[0] in _BROWSERS:
        flags = {arg.split("=", 1)[0] for arg in ctx.chrome_command[1:]}
        extra = [arg for arg in argv[1:] if arg.split("=", 1)[0] not in flags]
        return [*ctx.chrome_command, *extra]
    if argv and argv[0] in ("pkill", "killall") and argv[-1] in _BROWSERS:
        return [*argv[:-1], ctx.chrome_process]
    if argv and argv[0] == "python":
        return [ctx.python_command, *argv[1:]]
    return argv


# Words after which the next word is again a command's name (shell operators and openers).
_COMMAND_OPENERS = frozenset({";", "&&", "||", "|", "|&", "&", "(", "{", "\n", "$(", "`", "!",
                              "then", "else", "elif", "do", "while", "until", "if"})  # fmt: skip
# Prefix commands whose next non-option word is the command run.
_PREFIX_COMMANDS = frozenset({"sudo", "nohup", "exec", "setsid", "env", "time", "nice", "command"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*=")
_CHROME_PROFILE = re.compile(r"(?<=/)\.config/google-chrome(?=/|$|[\s'\"])")


def shell_words(shell: str) -> list[tuple[int, int, str]]:
    """The words and operators of a shell string as (start, end, text) spans, quotes kept in the
    text. Enough of the shell's grammar to find which words are commands' names; not a parser."""
    spans: list[tuple[int, int, str]] = []
    i, n, start = 0, len(shell), -1

    def close(end: int) -> None:
        nonlocal start
        if start >= 0:
            spans.append((start, end, shell[start:end]))
            start = -1

    while i < n:
        c = shell[i]
        if c in " \t":
            close(i)
            i += 1
        elif c == "#" and start < 0:
            while i < n and shell[i] != "\n":
                i += 1
        elif c == "\\":
            start = i if start < 0 else start
            i += 2
        elif c in "'\"":
            start = i if start < 0 else start
            j = i + 1
            while j < n and shell[j] != c:
                j += 2 if c == '"' and shell[j] == "\\" else 1
            i = j + 1
        elif shell.startswith("$(", i):
            close(i)
            spans.append((i, i + 2, "$("))
            i += 2
        elif c in ";&|()`\n<>":
            close(i)
            op = next(
                (o for o in ("&&", "||", "|&", ";;", ">>", "<<", "&>") if shell.startswith(o, i)), c
            )
            spans.append((i, i + len(op), op))
            i += len(op)
        else:
            start = i if start < 0 else start
            i += 1
    close(n)
    return spans


def command_words(shell: str) -> list[tuple[int, int, str]]:
    """The spans of `shell_words` that name the command run (argv[0]), past `VAR=value`
    assignments and prefixes such as sudo or nohup (with their options); a redirection's target
    is not one."""
    found: list[tuple[int, int, str]] = []
    expecting, after_prefix, after_redirect = True, False, False
    for span in shell_words(shell):
        word = span[2]
        if word in ("<", ">", ">>", "<<", "&>"):
            after_redirect = True
            continue
        if after_redirect:
            after_redirect = False
            continue
        if word in _COMMAND_OPENERS:
            expecting, after_prefix = True, False
            continue
        if not expecting:
            continue
        if _ASSIGNMENT.match(word) or (after_prefix and word.startswith("-")):
            continue
        if word in _PREFIX_COMMANDS:
            after_prefix = True
            continue
        found.append(span)
        expecting, after_prefix = False, False
    return found


def _browser_shell(shell: str, ctx: TaskContext) -> str:
    """Only the browser's command words become the slot's Chromium (and the browser named to
    pkill/killall its binary name); paths and values naming google-chrome stay as they are
    (ec4e3f68's 'google-chrome.desktop' favourite, 93eabf48's mkdir), except Google Chrome's
    profile directory, which is Chromium's here (~/.config/google-chrome -> chrome_profile_dir)."""
    spans = shell_words(shell)
    edits: list[tuple[int, int, str]] = []
    for start, end, word in command_words(shell):
        if word in _BROWSERS:
            edits.append((start, end, shlex.join(ctx.chrome_command)))
        elif word in ("pkill", "killall"):
            following = [s for s in spans if s[0] > start]
            for arg_start, arg_end, arg in following:
                if arg in _COMMAND_OPENERS:
                    break
                if arg in _BROWSERS:
                    edits.append((arg_start, arg_end, ctx.chrome_process))
    for start, end, text in sorted(edits, reverse=True):
        shell = shell[:start] + text + shell[end:]
    profile = PurePosixPath(_profile_dir(ctx))
    if not profile.is_relative_to(ctx.user_home):
        return shell
    return _CHROME_PROFILE.sub(str(profile.relative_to(ctx.user_home)), shell)


def translate_command(command: list[str] | str, shell: bool, ctx: TaskContext) -> list[str] | str:
    """Placeholders filled; Chrome run as the slot's Chromium; `python` as its python3."""
    command = fill_placeholders(command, ctx)
    if isinstance(command, str) and not shell:
        command = command.split()
    if isinstance(command, list):
        return _browser_argv(list(command), ctx)
    return _browser_shell(command, ctx)


def _plan_one(step: Step, task: Task, ctx: TaskContext) -> list[Operation]:
    p = step.parameters
    t = ctx.step_timeout_s
    kind = step.type
    if kind in ("execute", "command"):
        shell = bool(p.get("shell", False))
        command = translate_command(p["command"], shell, ctx)
        root_part = strip_sudo(command, ctx)
        if root_part is not None:
            return [RunTrusted(shell=root_part, timeout_s=t)]
        return [
            RunUser(
                command=command,
                timeout_s=t,
                until=p.get("until") or None,
                stdout_name=p.get("stdout") or None,
                stderr_name=p.get("stderr") or None,
            )
        ]
    if kind == "launch":
        shell = bool(p.get("shell", False))
        command = translate_command(p["command"], shell, ctx)
        root_part = strip_sudo(command, ctx)
        if root_part is not None:
            return [RunTrusted(shell=f"({root_part}) >/dev/null 2>&1 &", timeout_s=t)]
        return [RunUser(command=command, timeout_s=t, background=True)]
    if kind == "open":
        return [OpenFile(path=fill_placeholders(p["path"], ctx), timeout_s=ctx.open_timeout_s)]
    if kind == "sleep":
        return [Sleep(seconds=float(p["seconds"]))]
    if kind in ("activate_window", "close_window"):
        return [
            WindowAction(
                action="activate" if kind == "activate_window" else "close",
                name=p["window_name"],
                strict=bool(p.get("strict", False)),
                by_class=bool(p.get("by_class", False)),
            )
        ]
    if kind == "chrome_open_tabs":
        return [ChromeTabs("open", tuple(p["urls_to_open"]), timeout_s=max(t, 90.0))]
    if kind == "chrome_close_tabs":
        return [ChromeTabs("close", tuple(p["urls_to_close"]), timeout_s=max(t, 90.0))]
    if kind == "update_browse_history":
        items = tuple(
            (h["url"], h.get("title", ""), float(h.get("visit_time_from_now_in_seconds", 0)))
            for h in p.get("history", [])
        )
        template = next(
            (
                path
                for path in (
                    ctx.cache_dir / task.id / "history_empty.sqlite",
                    ctx.cache_dir / "history_empty.sqlite",
                )
                if path.is_file()
            ),
            None,
        )
        history = f"{_profile_dir(ctx)}/Default/History"
        return [UpdateHistory(items=items, history_path=history, template=template)]
    if kind == "download":
        ops: list[Operation] = []
        for item in p.get("files", []):
            source = cached_download(task, item["url"], item.get("path"), ctx)
            if source is None:
                raise SetupError(
                    f"download not in the cache: {cache_slot_for(task, item['url'], ctx)}; put the"
                    " file there (drums never downloads at setup time)"
                )
            ops.append(PutFile(source=source, dest=_home_path(item["path"], ctx)))
        return ops
    if kind == "upload_file":
        ops = []
        for item in p.get("files", []):
            source = asset_path(item["local_path"], ctx)
            if source is None:
                raise SetupError(
                    f"upload_file {item['local_path']!r} is outside the assets dir {ctx.assets_dir}"
                )
            ops.append(PutFile(source=source, dest=_home_path(item["path"], ctx)))
        return ops
    if kind == "drums_files":
        ops = []
        for item in p.get("files", []):
            source = task_asset(task, item["src"], ctx)
            if source is None:
                raise SetupError(
                    f"task asset {item['src']!r} is outside {ctx.assets_dir / task.id}"
                )
            ops.append(
                PutFile(
                    source=source,
                    dest=_home_path(item["path"], ctx),
                    owner_user=bool(item.get("owner_user", True)),
                )
            )
        return ops
    raise SetupError(f"setup step type {kind!r} is not supported by drums (task {task.id})")


def _home_path(path: str, ctx: TaskContext) -> str:
    return ctx.user_home + path[1:] if path.startswith("~") else path


def _profile_dir(ctx: TaskContext) -> str:
    return _home_path(ctx.chrome_profile_dir, ctx)


def plan_steps(steps: list[Step], task: Task, ctx: TaskContext) -> list[Operation]:
    """The concrete operations for a list of steps. Raises SetupError naming an unusable step."""
    ops: list[Operation] = []
    for index, step in enumerate(steps):
        try:
            ops.extend(_plan_one(step, task, ctx))
        except KeyError as exc:
            raise SetupError(f"step {index + 1} ({step.type}) lacks the parameter {exc}") from exc
    return ops
