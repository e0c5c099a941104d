"""How a checker's or getter's command runs inside a slot, kept apart from the agent's files.

Issue 39 (D2): a getter command run as the desktop user, in its home, imported a `zipfile.py`
the agent had planted there (Python puts the working directory first on its path) and ran a
`.pth` from the agent's user site, and forged a reward. Here the command runs as `nobody`, whose
processes the desktop user can neither signal nor read nor write (/proc/<pid>/fd, /proc/<pid>/mem
are granted by uid); from `/` with a clean environment (no variable of the slot's session, no
PYTHON* but ours), in which Python adds neither the script's directory nor the working directory
(PYTHONSAFEPATH) nor a user site (PYTHONNOUSERSITE) to its path. HOME stays the desktop user's
so `~/file` in a task's command names the same file; the files it reads are data. The plan is
pure (`checker_argv`); slot_io runs it through nsenter.
"""

from __future__ import annotations

from collections.abc import Sequence

# `nobody`: no process of the desktop runs as it, and it owns nothing the agent can write.
CHECKER_UID = 65534
CHECKER_GID = 65534
# Each of stdout and stderr is kept up to this much; the rest is read and dropped.
OUTPUT_LIMIT = 8 << 20

CHECKER_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/user",
    "LANG": "C.UTF-8",
    "DISPLAY": ":0",
    "PYTHONSAFEPATH": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def checker_argv(command: str | Sequence[str], home: str = "/home/user") -> list[str]:
    """The argv run inside the slot for `command` (a str runs through /bin/sh -c): env(1)
    clears the environment and changes to `/` before anything of the command runs."""
    env = {**CHECKER_ENV, "HOME": home}
    inner = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    if not inner:
        raise ValueError("a checker command needs at least a program name")
    return ["/usr/bin/env", "-i", "-C", "/", *(f"{k}={v}" for k, v in env.items()), *inner]
