"""A getter command's view of the desktop user's GNOME settings (issue 32).

gsettings and dconf read the user's settings database (~/.config/dconf/user) from the file when
no session bus answers them, as for a getter's command, which runs as `nobody` (issue 39, D2).
nobody cannot enter ~/.config/dconf (0700), so every such getter read the schemas' defaults:
a4d98375 (lock the screen; on by default) scored 1 untouched, and a correct f9be0997 (banners
off) 0. Here root copies the database into a fresh directory that nobody owns, the command runs
with its `config/` as XDG config dir (and `run/`, `cache/` as runtime and cache dir: apart, since
dconf writes its change flag into `$XDG_RUNTIME_DIR/dconf/user`, which with one dir for both was
the copy itself, and a database with that byte written reads as empty), and the directory goes
after. The agent can neither swap the copy (a root-made 0700 directory in sticky /tmp) nor read
it.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from drumsd.linux.checker_exec import CHECKER_GID, CHECKER_UID

if TYPE_CHECKING:
    from .setup import SlotAccess

DCONF_DB = "~/.config/dconf/user"
PREFIX = "/tmp/drums-settings-"
_SETTINGS_READER = re.compile(r"\b(?:gsettings|dconf)\b")


class SettingsCopyError(RuntimeError):
    """The copy could not be made (the message says why)."""


def reads_settings(command: str | list[str]) -> bool:
    """Whether a command runs gsettings or dconf."""
    text = command if isinstance(command, str) else " ".join(map(str, command))
    return _SETTINGS_READER.search(text) is not None


@contextlib.asynccontextmanager
async def settings_copy(
    access: SlotAccess, read_db: Callable[[], Awaitable[bytes | None]] | None, timeout_s: float
) -> AsyncIterator[str | None]:
    """The directory holding a copy of the settings database `read_db` reads (None when there
    is nothing to read: `read_db` None)."""
    if read_db is None:
        yield None
        return
    data = await read_db()
    rc, out, err = await access.exec_trusted(f"umask 077 && mktemp -d {PREFIX}XXXXXXXX", timeout_s)
    where = out.strip()
    if rc != 0 or not where.startswith(PREFIX):
        raise SettingsCopyError(
            f"cannot make a directory for the settings' copy: {err.strip()[-300:]}"
        )
    try:
        if data is not None:  # no database yet: every key at its default, as for the user
            await access.write_file(f"{where}/config/dconf/user", data, owner_user=False)
        await access.exec_trusted(
            f"mkdir {shlex.quote(where)}/run {shlex.quote(where)}/cache", timeout_s
        )
        owner = f"{CHECKER_UID}:{CHECKER_GID}"
        await access.exec_trusted(f"chown -R {owner} {shlex.quote(where)}", timeout_s)
        yield where
    finally:
        await access.exec_trusted(f"rm -rf {shlex.quote(where)}", timeout_s)


def with_settings(command: str | list[str], where: str | None) -> str | list[str]:
    """The command with the settings' copy as its XDG directories."""
    if where is None:
        return command
    dirs = [
        f"XDG_CONFIG_HOME={where}/config",
        f"XDG_RUNTIME_DIR={where}/run",
        f"XDG_CACHE_HOME={where}/cache",
    ]
    if isinstance(command, str):
        return f"export {' '.join(dirs)}; {command}"
    return ["/usr/bin/env", *dirs, *command]
