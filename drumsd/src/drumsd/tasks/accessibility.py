"""The desktop's accessibility tree, OSWorld's `accessibility_tree` observation and getter.

The guest's a11y.py walks AT-SPI and prints OSWorld's XML; it runs as the desktop user through
the agent's exec (the bus is the desktop user's session's), so this module only names the
command and reads its answer. Images whose session runs no AT-SPI bus answer with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from drumsd.guest import protocol

ARGV = ["python3", "-I", protocol.A11Y_SCRIPT]
TIMEOUT_S = 30.0
# a11y.py's exit codes for "this desktop cannot give a tree" (not a failure of the reader).
NO_BINDINGS, NO_BUS = 3, 4


@dataclass(frozen=True)
class AccessibilityTree:
    xml: str | None  # None: no tree (the reason says why)
    reason: str | None = None


def parse(returncode: int, stdout: str, stderr: str) -> AccessibilityTree:
    if returncode == 0 and stdout.startswith("<desktop-frame"):
        return AccessibilityTree(stdout)
    detail = (stderr or stdout).strip()[-300:]
    if returncode == 127 or (returncode == 2 and "No such file" in detail):
        detail = f"this image has no accessibility dump ({protocol.A11Y_SCRIPT}): {detail}"
    elif returncode in (NO_BINDINGS, NO_BUS):
        detail = f"this desktop runs no AT-SPI accessibility bus (the osworld image does): {detail}"
    return AccessibilityTree(None, reason=f"no accessibility tree ({returncode}): {detail}")
