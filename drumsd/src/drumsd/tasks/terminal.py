"""The desktop's terminal text, OSWorld's `terminal` observation (its server reads a terminal
widget through the accessibility tree; drums desktops have an xterm and no AT-SPI).

desktop-init starts the xterm with a printer command that writes to PRINT_FILE
(protocol.XTERM_PRINTER_RESOURCES). Writing xterm's "print all pages" control sequence
(CSI ? 11 i, Media Copy) to the terminal's pty makes xterm itself write its scrollback and
screen there as plain text: no key press, nothing on screen changes, and no action counts in
the episode. desktop-init also merges the printer resources into the X server's resource
database, so an xterm a task starts itself prints too. The script tries the focused xterm first
(OSWorld reads the focused terminal), then the user's xterms newest first, and stops at the first
one that prints (an xterm started without the printer resources prints nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from drumsd.core.seams import SlotHandle, SlotRuntime
from drumsd.guest import protocol

PRINT_FILE = protocol.TERMINAL_PRINT_FILE
FOUND = "drums-terminal xterm "
NONE = "drums-terminal none"
SCRIPT = rf"""
out={PRINT_FILE}
win=$(xprop -root _NET_ACTIVE_WINDOW 2>/dev/null | sed -n 's/.*# \(0x[0-9a-fA-F]*\).*/\1/p')
focused=$([ -n "$win" ] && xprop -id "$win" _NET_WM_PID 2>/dev/null | sed -n 's/.* = //p')
[ -n "$focused" ] && [ "$(cat /proc/$focused/comm 2>/dev/null)" = xterm ] || focused=
for x in $focused $(pgrep -u "$(id -u)" -x xterm | sort -rn); do
  t=
  for c in $(pgrep -P "$x"); do
    t=$(readlink "/proc/$c/fd/0"); case "$t" in /dev/pts/*) break;; *) t=;; esac
  done
  [ -n "$t" ] || continue
  rm -f "$out"
  printf '\033[?11i' > "$t" 2>/dev/null || continue
  i=0
  while [ ! -e "$out" ] && [ $i -lt 25 ]; do sleep 0.02; i=$((i + 1)); done
  if [ -e "$out" ]; then echo "{FOUND}$x"; cat "$out"; rm -f "$out"; exit 0; fi
done
echo "{NONE}"
"""
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TerminalText:
    text: str | None  # None: no readable terminal (the reason says why)
    source: str | None = None
    reason: str | None = None


def parse(returncode: int, stdout: str, stderr: str) -> TerminalText:
    """The script's output: a header naming the xterm, then its text (the blank rows below the
    last line of the screen dropped)."""
    head, _, body = stdout.partition("\n")
    if returncode == 0 and head.startswith(FOUND):
        text = body.rstrip("\n") + "\n" if body.strip() else ""  # the screen's unused rows
        return TerminalText(text, source=f"xterm pid {head[len(FOUND) :].strip()}")
    if returncode == 0 and head.strip() == NONE:
        return TerminalText(None, reason="no xterm of the desktop user printed its text")
    detail = (stderr or stdout).strip()[-300:]
    return TerminalText(None, reason=f"the terminal reader failed ({returncode}): {detail}")


async def read(runtime: SlotRuntime, handle: SlotHandle) -> TerminalText:
    """The slot's terminal text: the route's answer and the vm_terminal_output getter's."""
    done = await runtime.exec_user(handle, SCRIPT, TIMEOUT_S)
    return parse(done.returncode, done.stdout, done.stderr)
