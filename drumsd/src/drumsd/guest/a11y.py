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
"""

from __future__ import annotations

import re
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


class Walker:
    def __init__(self, atspi: Any) -> None:
        self.atspi = atspi
        self.nodes = 0

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
            if child is not None and (sub := self.node(child, depth + 1)) is not None:
                element.append(sub)
        return element


def desktop_xml(atspi: Any) -> str:
    """The whole desktop: every application registered on the accessibility bus."""
    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    atspi.set_timeout(CALL_TIMEOUT_MS, CALL_TIMEOUT_MS * 4)
    walker = Walker(atspi)
    root = ET.Element("desktop-frame")
    desktop = atspi.get_desktop(0)
    for i in range(desktop.get_child_count()):
        app = desktop.get_child_at_index(i)
        if app is not None and (element := walker.node(app, 1)) is not None:
            root.append(element)
    return ET.tostring(root, encoding="unicode")


def main() -> int:
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
    sys.stdout.write(desktop_xml(Atspi))
    return 0


if __name__ == "__main__":
    sys.exit(main())
