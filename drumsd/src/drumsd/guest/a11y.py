"""The desktop's accessibility tree in OSWorld's XML, read from AT-SPI (issue 21).

Run as the desktop user, by the image's python3 (which has gi's Atspi from python3-pyatspi's
dependencies): `python3 -I /opt/drums/guest/drums_guest/a11y.py` prints the tree and exits. The
daemon runs it through the agent's exec, so a hung application costs one subprocess and its
timeout, never the agent. Stdlib and gi only: this file is imported by nothing in the guest.

The format is OSWorld's (its server's /accessibility): a `desktop-frame` root, one element per
accessible named by its role (spaces as dashes), `name`, and namespaced attributes for the states
(st:), toolkit attributes (attr:), screen position and size (cp:), value (val:) and actions
(act:), the text as the element's text. Children past MAX_WIDTH and depth past MAX_DEPTH are cut,
as OSWorld's are, so a spreadsheet's million cells stay out.

`--trusted` (the checkers' getter, issue 36): the bus and every application on it are the desktop
user's, so the user can register an application of its own (a script whose widgets carry any
role and name) or point the reader at a bus it serves. With `--trusted` the tree holds only
applications whose process runs an image binary: its executable and every file it maps
executable are root's and not writable by others (nothing the desktop user wrote), and it is no
interpreter (a script's app would pass on python3 alone). `--app NAME` (repeatable) keeps only
applications whose executable has that name (the task's apps). Every process the reader talked
to (the bus, the registry, applications it connected to directly) must pass the same test or be
an application left out (the bus itself, right after connecting, with no exception);
otherwise it exits UNTRUSTED naming it.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys
import xml.etree.ElementTree as ET
from typing import Any

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
MAX_DEPTH = 50
MAX_WIDTH = 1024
MAX_NODES = 20000  # a bound on the whole walk: one app with a huge tree cannot stall the dump
# Per AT-SPI call (ms): an application that does not answer is skipped, not waited on.
CALL_TIMEOUT_MS = 1500
STATE_PREFIX = "ATSPI_STATE_"
# What XML 1.0 cannot hold (control characters, lone surrogates, U+FFFE/U+FFFF): apps put them
# in names and text (a terminal's buffer, a document), and ElementTree writes them unescaped.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _q(prefix: str, name: str) -> str:
    return f"{{{NS[prefix]}}}{name}"


def tag_of(role_name: str) -> str:
    """An XML tag from a role name ("push button" -> "push-button"), as OSWorld writes it."""
    tag = (role_name or "").strip().replace(" ", "-") or "unknown"
    return tag if tag[0].isalpha() or tag[0] == "_" else f"_{tag}"


def state_name(value_name: str) -> str:
    """ "ATSPI_STATE_MULTI_LINE" -> "multi_line" (OSWorld strips STATE_ and lowers the rest)."""
    return value_name.removeprefix(STATE_PREFIX).lower()


def xml_safe(value: str) -> str:
    """`value` without the characters an XML document cannot contain."""
    return _NOT_XML.sub("", value)


def xml_name(key: str) -> str:
    """An attribute name from a toolkit's attribute or action name (which may hold spaces)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
    return name if name[:1].isalpha() or name[:1] == "_" else f"_{name}"


def clean_text(text: str) -> str:
    """Drop the object-replacement and replacement characters, as OSWorld does, and what XML
    cannot hold."""
    return xml_safe(text.replace("\ufffc", "").replace("\ufffd", ""))


# Executables whose program is a script of the caller's: an app they run proves nothing.
_INTERPRETER = re.compile(
    r"(python|perl|ruby|node|nodejs|gjs|gjs-console|lua|luajit|tclsh|wish|java|php|guile|"
    r"sh|bash|dash|zsh|ksh|busybox|ld-linux[\w.-]*|ld\.so|qemu-[\w-]+)[\d.]*"
)
UNTRUSTED = 5  # exit code: a process the reader talked to is not an image binary


def file_doubt(path: str) -> str | None:
    """Why `path` may be the desktop user's (None: root's file in root's directories, not
    writable by others: the image's, or placed by root)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if st.st_uid != 0 or st.st_mode & 0o022:
        return f"{path} is owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:o}"
    parent = os.path.dirname(path)
    while parent not in ("", "/"):
        try:
            st = os.stat(parent)
        except OSError as exc:
            return f"{parent}: {exc.strerror}"
        # A root-owned directory others may write to only with the sticky bit (/tmp): no one
        # but root can replace a root-owned file there.
        if st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & 0o1000):
            return f"{path}: its directory {parent} (uid {st.st_uid}, mode {st.st_mode & 0o7777:o})"
        parent = os.path.dirname(parent)
    return None


def process_doubt(pid: int, names: frozenset[str] = frozenset()) -> str | None:
    """Why process `pid` may run the desktop user's code (None: an image binary, named one of
    `names` when given)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError as exc:
        return f"pid {pid}: cannot read its executable ({exc.strerror})"
    name = os.path.basename(exe)
    if exe.endswith(" (deleted)"):
        return f"pid {pid} runs a deleted file {exe}"
    if _INTERPRETER.fullmatch(name):
        return f"pid {pid} runs the interpreter {exe}"
    if names and name not in names:
        return f"pid {pid} runs {exe}, not one of the task's apps ({', '.join(sorted(names))})"
    mapped = [exe]  # the executable, and every file mapped executable (libraries, LD_PRELOAD)
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/"):
            mapped.append(parts[5].strip())
    for path in dict.fromkeys(mapped):
        doubt = "a deleted file" if path.endswith(" (deleted)") else file_doubt(path)
        if doubt:
            return f"pid {pid} ({exe}) runs code from {path}: {doubt}"
    return None


def socket_peers() -> dict[int, int]:
    """This process's connected Unix sockets: fd -> the peer's pid (SO_PEERCRED: the kernel's
    word, not the peer's)."""
    peers: dict[int, int] = {}
    for fd_name in os.listdir("/proc/self/fd"):
        fd = int(fd_name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.family != socket.AF_UNIX:
                    continue
                pid, _uid, _gid = struct.unpack(
                    "3i",
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")),
                )
        except OSError:
            continue
        if pid > 0:
            peers[fd] = pid
    return peers


class Trust:
    """Which applications the tree is read from (`--trusted`), by process, with the reasons
    of those left out."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.by_pid: dict[tuple[int, frozenset[str]], str | None] = {}
        self.by_bus: dict[str, str | None] = {}
        self.left_out: dict[int, str] = {}

    def doubt(self, pid: int, names: frozenset[str] = frozenset()) -> str | None:
        key = (pid, names)
        if key not in self.by_pid:
            self.by_pid[key] = process_doubt(pid, names)
        return self.by_pid[key]

    def app_doubt(self, acc: Any) -> str | None:
        """Why the application `acc` belongs to is left out (None: it is read)."""
        bus = getattr(getattr(acc, "app", None), "bus_name", None)
        if bus is not None and bus in self.by_bus:
            return self.by_bus[bus]
        try:
            pid = acc.get_process_id()
        except Exception as exc:
            doubt: str | None = f"no process id ({exc})"
        else:
            doubt = self.doubt(pid, self.names)
            if doubt:
                self.left_out[pid] = doubt
        if bus is not None:
            self.by_bus[bus] = doubt
        return doubt

    def same_app(self, parent: Any, child: Any) -> bool:
        """A child served by its parent's application (no call), or by a trusted one."""
        mine = getattr(getattr(parent, "app", None), "bus_name", None)
        theirs = getattr(getattr(child, "app", None), "bus_name", None)
        return (mine is not None and mine == theirs) or self.app_doubt(child) is None

    def check_bus(self) -> str | None:
        """Right after Atspi.init(), before any call, this reader is connected to the bus alone
        (a call may make libatspi connect to applications directly): that process must be an
        image binary (a bus daemon of the desktop user's own would answer anything, the process
        ids of applications included)."""
        for fd, pid in sorted(socket_peers().items()):
            if doubt := self.doubt(pid):
                return f"the accessibility bus (fd {fd}): {doubt}"
        return None

    def check_registry(self, desktop: Any) -> str | None:
        """The registry's process, as the (checked) bus daemon gives it, is an image binary."""
        try:
            registry = desktop.get_process_id()
        except Exception as exc:
            return f"the registry gives no process id ({exc})"
        if doubt := self.doubt(registry):
            return f"the accessibility registry: {doubt}"
        return None

    def check_peers(self) -> str | None:
        """After the walk, every process this reader talked to (applications it connected to
        directly) is an image binary or an application left out."""
        for fd, pid in sorted(socket_peers().items()):
            if pid not in self.left_out and (doubt := self.doubt(pid)):
                return f"a connection of the reader (fd {fd}): {doubt}"
        return None


class Walker:
    def __init__(self, atspi: Any, trust: Trust | None = None) -> None:
        self.atspi = atspi
        self.nodes = 0
        self.trust = trust

    def node(self, acc: Any, depth: int) -> ET.Element | None:
        if self.nodes >= MAX_NODES:
            return None
        self.nodes += 1
        atspi = self.atspi
        try:
            name = acc.get_name() or ""
            role = acc.get_role_name() or ""
        except Exception:  # a dead or hung application: leave it out
            return None
        attrib: dict[str, str] = {"name": xml_safe(name)}
        try:
            states = acc.get_state_set().get_states()
        except Exception:
            states = []
        for st in states:
            key = state_name(atspi.StateType(st).value_name)
            if key:
                attrib[_q("st", key)] = "true"
        try:
            attributes = acc.get_attributes() or {}
        except Exception:
            attributes = {}
        for key, value in attributes.items():
            if key:
                attrib[_q("attr", xml_name(key))] = xml_safe(str(value))
        if attrib.get(_q("st", "visible")) == "true" and attrib.get(_q("st", "showing")) == "true":
            try:
                comp = acc.get_component_iface()
                if comp is not None:
                    box = comp.get_extents(atspi.CoordType.SCREEN)
                    attrib[_q("cp", "screencoord")] = str((box.x, box.y))
                    attrib[_q("cp", "size")] = str((box.width, box.height))
            except Exception:
                pass
        text = ""
        try:
            txt = acc.get_text_iface()
            if txt is not None:
                text = clean_text(txt.get_text(0, txt.get_character_count()) or "")
        except Exception:
            pass
        try:
            val = acc.get_value_iface()
            if val is not None:
                attrib[_q("val", "value")] = str(val.get_current_value())
        except Exception:
            pass
        try:
            act = acc.get_action_iface()
            for i in range(act.get_n_actions() if act is not None else 0):
                action = act.get_action_name(i)
                if action:
                    desc, kb = act.get_action_description(i) or "", act.get_key_binding(i) or ""
                    attrib[_q("act", xml_name(f"{action}_desc"))] = xml_safe(desc)
                    attrib[_q("act", xml_name(f"{action}_kb"))] = xml_safe(kb)
        except Exception:
            pass
        element = ET.Element(tag_of(role), attrib)
        if text:
            element.text = text
        if depth >= MAX_DEPTH:
            return element
        try:
            count = min(acc.get_child_count(), MAX_WIDTH)
        except Exception:
            count = 0
        for i in range(count):
            try:
                child = acc.get_child_at_index(i)
            except Exception:
                continue
            if child is None or (self.trust and not self.trust.same_app(acc, child)):
                continue
            if (sub := self.node(child, depth + 1)) is not None:
                element.append(sub)
        return element


def desktop_xml(atspi: Any, trust: Trust | None = None) -> str:
    """The whole desktop: every application registered on the accessibility bus (with `trust`,
    those it keeps; ValueError when a process the reader talked to is not trusted)."""
    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    if trust is not None and (doubt := trust.check_bus()):
        raise ValueError(doubt)
    atspi.set_timeout(CALL_TIMEOUT_MS, CALL_TIMEOUT_MS * 4)
    walker = Walker(atspi, trust)
    root = ET.Element("desktop-frame")
    desktop = atspi.get_desktop(0)
    if trust is not None and (doubt := trust.check_registry(desktop)):
        raise ValueError(doubt)
    for i in range(desktop.get_child_count()):
        app = desktop.get_child_at_index(i)
        if app is None or (trust is not None and trust.app_doubt(app)):
            continue
        if (element := walker.node(app, 1)) is not None:
            root.append(element)
    if trust is not None and (doubt := trust.check_peers()):
        raise ValueError(doubt)
    return ET.tostring(root, encoding="unicode")


def parse_args(argv: list[str]) -> Trust | None:
    """`--trusted [--app NAME]...` -> the Trust to read with; no argument: None (all apps)."""
    if not argv:
        return None
    if argv[0] != "--trusted" or len(argv) % 2 == 0 or set(argv[1::2]) - {"--app"}:
        raise SystemExit(f"usage: a11y.py [--trusted [--app NAME]...], not {argv}")
    return Trust(frozenset(argv[2::2]))


def main() -> int:
    trust = parse_args(sys.argv[1:])
    try:
        import gi

        gi.require_version("Atspi", "2.0")
        from gi.repository import Atspi
    except (ImportError, ValueError) as exc:
        print(f"drums-a11y: no AT-SPI bindings in this image ({exc})", file=sys.stderr)
        return 3
    if Atspi.init() not in (0, 1):  # 1: already initialised
        print("drums-a11y: cannot reach the accessibility bus", file=sys.stderr)
        return 4
    try:
        xml = desktop_xml(Atspi, trust)
    except ValueError as exc:
        print(f"drums-a11y: untrusted: {exc}", file=sys.stderr)
        return UNTRUSTED
    for pid, doubt in sorted((trust.left_out if trust else {}).items()):
        print(f"drums-a11y: left out pid {pid}: {doubt}", file=sys.stderr)
    sys.stdout.write(xml)
    return 0


if __name__ == "__main__":
    sys.exit(main())
