"""The environment of a command the daemon runs inside a slot (a task's trusted setup steps, file
writes): built from an allowlist, never inherited from the daemon.

The daemon's own environment holds its secrets and the host's layout (DRUMS_TOKEN,
DRUMS_TOKEN_FILE, a trainer's credentials, host paths); a task's `sudo` step that wrote `env` to
a file in the slot handed them to the agent (issue 39, D9). What a step gets is what `sudo` on
the image would give it, plus the slot's display.
"""

from __future__ import annotations

ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's secure_path
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"  # the desktop session's


def slot_command_env(
    *,
    user: str = "root",
    home: str = "/root",
    display: str = ":0",
    xauthority: str | None = None,
) -> dict[str, str]:
    """The whole environment of a command run in a slot as `user` (root: a trusted step)."""
    env = {
        "PATH": ROOT_PATH if user == "root" else USER_PATH,
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        "DISPLAY": display,
    }
    if xauthority is not None:
        env["XAUTHORITY"] = xauthority
    return env
