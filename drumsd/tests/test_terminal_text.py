"""The terminal reader's script and how its output is read (the text itself is proven live in
tests/live/test_osworld_desktopenv_live.py)."""

from __future__ import annotations

from drumsd.guest import protocol
from drumsd.tasks import terminal


def test_the_script_asks_xterm_to_print_to_the_file_its_printer_writes() -> None:
    assert "printf '\\033[?11i'" in terminal.SCRIPT  # CSI ? 11 i: print all pages
    assert f"out={protocol.TERMINAL_PRINT_FILE}\n" in terminal.SCRIPT
    printer = next(r for r in protocol.XTERM_PRINTER_RESOURCES if "printerCommand" in r)
    assert printer.endswith(
        f"mv -f {protocol.TERMINAL_PRINT_FILE}.part {protocol.TERMINAL_PRINT_FILE}"
    )
    assert "XTerm*printAttributes: 0" in protocol.XTERM_PRINTER_RESOURCES


def test_parse_reads_the_xterm_its_text_or_why_not() -> None:
    got = terminal.parse(0, f"{terminal.FOUND}42\n$ echo hi\nhi\n$ \n\n\n\n", "")
    assert got == terminal.TerminalText("$ echo hi\nhi\n$ \n", source="xterm pid 42")
    assert terminal.parse(0, f"{terminal.FOUND}7\n\n\n", "").text == ""  # a blank screen
    none = terminal.parse(0, terminal.NONE + "\n", "")
    assert none.text is None and none.reason == "no xterm of the desktop user printed its text"
    broken = terminal.parse(127, "", "pgrep: command not found")
    assert broken.text is None and broken.reason is not None
    assert broken.reason.endswith("(127): pgrep: command not found")
    assert terminal.parse(0, "", "").text is None  # a runtime without a shell (memory)
