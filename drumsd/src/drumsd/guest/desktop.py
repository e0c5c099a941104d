"""What the agent reads from the desktop in its own process: files, processes, windows, and
the credentials a child runs with.
"""

from __future__ import annotations

import errno
import os
import pwd
from typing import Any

from . import protocol


def read_file(request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    path = request.get("path")
    if not isinstance(path, str) or not path:
        raise protocol.ProtocolError("invalid_action", "read_file: path must be a string")
    limit = request.get("max_bytes", protocol.DEFAULT_READ_MAX_BYTES)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise protocol.ProtocolError("invalid_action", "read_file: max_bytes must be an int >= 0")
    try:
        # O_NONBLOCK: a FIFO must not wedge the single-threaded agent.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        # A missing file is an answer checkers rely on (it scores 0), not an agent failure.
        code = "not_found" if exc.errno == errno.ENOENT else "failed"
        raise protocol.ProtocolError(
            code, f"read_file: cannot open {path}: {exc.strerror} (errno {exc.errno})"
        ) from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        import stat

        if not stat.S_ISREG(st.st_mode):
            raise protocol.ProtocolError("failed", f"read_file: {path} is not a regular file")
        data = f.read(limit + 1)
    truncated = len(data) > limit
    return {"ok": True, "path": path, "file_size": st.st_size, "truncated": truncated}, data[:limit]


def list_processes() -> list[dict[str, Any]]:
    procs = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                raw = f.read().decode(errors="replace")
        except OSError:
            continue  # exited while we looked
        # comm may contain spaces and parentheses: split around the last ')'.
        open_paren, close_paren = raw.find("("), raw.rfind(")")
        rest = raw[close_paren + 2 :].split()
        procs.append(
            {
                "pid": int(entry.name),
                "comm": raw[open_paren + 1 : close_paren],
                "state": rest[0],
                "ppid": int(rest[1]),
            }
        )
    procs.sort(key=lambda p: p["pid"])
    return procs


def list_windows(display: str) -> list[dict[str, Any]]:
    """Top-level client windows as the window manager lists them (_NET_CLIENT_LIST)."""
    from Xlib import X
    from Xlib import display as xdisplay

    d = xdisplay.Display(display)
    try:
        root = d.screen().root
        net_client_list = d.intern_atom("_NET_CLIENT_LIST")
        net_wm_name = d.intern_atom("_NET_WM_NAME")
        utf8 = d.intern_atom("UTF8_STRING")
        active_atom = d.intern_atom("_NET_ACTIVE_WINDOW")
        prop = root.get_full_property(net_client_list, X.AnyPropertyType)
        active = root.get_full_property(active_atom, X.AnyPropertyType)
        active_id = active.value[0] if active and len(active.value) else None
        windows = []
        for wid in prop.value if prop else []:
            w = d.create_resource_object("window", wid)
            try:
                name_prop = w.get_full_property(net_wm_name, utf8)
                # python-xlib hands UTF8_STRING values back as str or bytes by version.
                name = name_prop.value if name_prop else (w.get_wm_name() or "")
                if isinstance(name, bytes):
                    name = name.decode(errors="replace")
                wm_class = w.get_wm_class() or ("", "")
                geom = w.get_geometry()
                pos = root.translate_coords(w, 0, 0)
            except Exception:
                continue
            windows.append(
                {
                    "id": wid,
                    "name": name,
                    "instance": wm_class[0],
                    "class": wm_class[1],
                    "x": pos.x,
                    "y": pos.y,
                    "width": geom.width,
                    "height": geom.height,
                    "active": wid == active_id,
                }
            )
        return windows
    finally:
        d.close()


def desktop_creds() -> dict[str, Any]:
    """Popen arguments that run a child as the desktop user when the agent is the slot's root.

    The agent itself is not the desktop user (see init.py); what it runs for a step or a
    command is, as before."""
    if os.getuid() != 0:
        return {}
    pw = pwd.getpwnam(os.environ.get("USER", "user"))
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
