"""LibreOffice Calc families: the agent edits a seeded xlsx in Calc and saves it (Keep format).

Oracles drive Calc with the keyboard only (sheet tabs with Ctrl+PageUp/Down, Ctrl+Home, arrows),
which needs no screen coordinates; conversions use LibreOffice's own headless converter.
"""

from __future__ import annotations

import io
import random
import re
import shlex
from dataclasses import dataclass
from typing import Any

import openpyxl
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter

from ..actions import (
    Action,
    activate_window,
    execute,
    hotkey,
    office_save,
    press,
    shell,
    soffice_convert,
    wait,
    write,
)
from ..docfiles import odt_bytes, xlsx_bytes
from ..spec import Solution, TaskSpec
from . import content
from .registry import family

DOCS = "/home/user/Documents"
DESKTOP = "/home/user/Desktop"
LOCKS = f"{DOCS}/.~lock.*#"
STEMS = ["sales_report", "figures", "inventory", "quarterly", "ledger", "tally", "stocktake"]


@dataclass(frozen=True)
class Edit:
    sheet: int
    ref: str
    typed: str  # what the agent types into the cell
    stored: Any  # what Calc stores (the formula's value for formulas)


@dataclass(frozen=True)
class Table:
    sheet: str
    other: str
    header: list[str]
    rows: list[list[Any]]

    def ref(self, col: int, row: int) -> str:
        """1-based column, 1-based data row (row 1 is the first row under the header)."""
        return f"{get_column_letter(col)}{row + 1}"


def make_table(rng: random.Random, n_rows: int | None = None, blanks: int = 0) -> Table:
    n = n_rows or rng.randint(6, 12)
    items = content.pick(rng, content.ITEMS, n)
    cols = ["Q1", "Q2", "Q3", "Q4"]
    rows: list[list[Any]] = [[it, *(rng.randint(10, 999) for _ in cols)] for it in items]
    return Table(
        rng.choice(content.SHEETS), rng.choice(content.OTHER_SHEETS), ["Item", *cols], rows
    )


def table_xlsx(t: Table) -> bytes:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = t.sheet
    ws.append(t.header)
    for r in t.rows:
        ws.append(r)
    other = wb.create_sheet(t.other)
    other.append(["Note", "Value"])
    for i, r in enumerate(t.rows[:3]):
        other.append([f"old {r[0]}", i + 1])
    return xlsx_bytes(wb)


def goto(sheet: int, ref: str, n_sheets: int) -> list[Action]:
    m = re.fullmatch(r"([A-Z]+)(\d+)", ref)
    assert m, ref
    col = openpyxl.utils.column_index_from_string(m.group(1))
    row = int(m.group(2))
    steps: list[Action] = [hotkey("ctrl", "pageup") for _ in range(n_sheets)]
    steps += [hotkey("ctrl", "pagedown") for _ in range(sheet)]
    steps.append(hotkey("ctrl", "home"))
    if col > 1:
        steps.append(press("right", col - 1))
    if row > 1:
        steps.append(press("down", row - 1))
    return steps


def calc_solution(
    name: str,
    path: str,
    n_sheets: int,
    edits: list[Edit],
    *,
    percent: tuple[int, list[str]] | None = None,
    bold: tuple[int, list[str]] | None = None,
    save: bool = True,
    why: str = "",
) -> Solution:
    fname = path.rsplit("/", 1)[1]
    acts: list[Action] = [activate_window(re.escape(fname)), wait(0.5), press("escape")]
    for e in edits:
        acts += [*goto(e.sheet, e.ref, n_sheets), write(e.typed), press("enter")]
    for fmt, keys in ((percent, ("ctrl", "shift", "5")), (bold, ("ctrl", "b"))):
        if fmt:
            sheet, refs = fmt
            acts += goto(sheet, refs[0], n_sheets)
            first, last = _col_row(refs[0]), _col_row(refs[-1])
            if last[0] > first[0]:
                acts.append(_shift_press("right", last[0] - first[0]))
            if last[1] > first[1]:
                acts.append(_shift_press("down", last[1] - first[1]))
            acts.append(hotkey(*keys))
    if save:
        acts += office_save()

    def simulate(inputs: dict[str, bytes]) -> dict[str, bytes | None]:
        if not save:
            return {}
        wb = openpyxl.load_workbook(io.BytesIO(inputs[path]))
        names = wb.sheetnames
        for e in edits:
            wb[names[e.sheet]][e.ref] = e.stored
        if percent:
            for ref in percent[1]:
                wb[names[percent[0]]][ref].number_format = "0.00%"
        if bold:
            for ref in bold[1]:
                wb[names[bold[0]]][ref].font = Font(bold=True)
        return {path: xlsx_bytes(wb)}

    return Solution(name, acts, simulate, why)


def _shift_press(key: str, n: int) -> str:
    return (
        "import pyautogui; pyautogui.keyDown('shift'); "
        f"pyautogui.press({key!r}, presses={n}, interval=0.05); pyautogui.keyUp('shift')"
    )


def _col_row(ref: str) -> tuple[int, int]:
    m = re.fullmatch(r"([A-Z]+)(\d+)", ref)
    assert m, ref
    return openpyxl.utils.column_index_from_string(m.group(1)), int(m.group(2))


def calc_spec(
    rng: random.Random,
    instruction: str,
    path: str,
    data: bytes,
    options: dict[str, Any],
    oracle: Solution,
    near: list[Solution],
) -> TaskSpec:
    """A task that edits the workbook `path` in place."""
    dest = path.rsplit("/", 1)[1]
    return _calc_spec(rng, instruction, {path: data}, path, path, dest, options, oracle, near)


def _calc_spec(
    rng: random.Random,
    instruction: str,
    files: dict[str, bytes],
    opened: str,
    output: str,
    dest: str,
    options: dict[str, Any],
    oracle: Solution,
    near: list[Solution],
    check: tuple[str, str] = ("xlsx_cells", "xlsx_cells_raw"),
) -> TaskSpec:
    """A Calc task: `files` plus the README decoy in Documents (its text drawn from `rng` here,
    last), `opened` open in Calc; judged on the one file `output` (fetched as `dest`), which, with
    the lock files, is all the task may change."""
    decoy = f"{DOCS}/README.txt"
    return TaskSpec(
        family="",
        app="libreoffice_calc",
        instruction=instruction,
        files={**files, decoy: _readme(rng)},
        launch=[
            {"type": "open", "parameters": {"path": opened}},
            {"type": "sleep", "parameters": {"seconds": 3}},
        ],
        results=[(output, dest)],
        check=check[0],
        check_alt=check[1],
        options={"file": dest, **options},
        roots=[DOCS],
        allow=[output, LOCKS],
        oracle=oracle,
        near_misses=near,
        decoy=decoy,
    )


def _readme(rng: random.Random) -> bytes:
    return ("Working files for the team.\n" + content.sentence(rng) + "\n").encode()


def _path(rng: random.Random, ext: str = "xlsx") -> str:
    return f"{DOCS}/{content.filename(rng, STEMS, ext)}"


def _nosave(oracle: Solution, why: str = "edits the cells, never saves") -> Solution:
    """The oracle's edits without the save: the file on disk must still score 0."""
    # office_save appends: ctrl+s, wait, enter, wait -> drop those four steps.
    return Solution("not_saved", oracle.actions[:-4], lambda _inputs: {}, why)


# ------------------------------------------------------------------------------------------------


@family("calc_set_value", "libreoffice_calc")
def set_value(rng: random.Random) -> TaskSpec:
    t = make_table(rng)
    path = _path(rng)
    r = rng.randint(2, len(t.rows) - 1)
    c = rng.randint(2, 5)
    value = rng.randint(1000, 9999)
    ref = t.ref(c, r)
    down, right = t.ref(c, r + 1), t.ref(c + 1 if c < 5 else c - 1, r)
    item, quarter = t.rows[r - 1][0], t.header[c - 1]
    instr = (
        f"In {path}, on sheet '{t.sheet}', set the {quarter} figure of '{item}' (cell {ref}) "
        f"to {value}. Keep the file as xlsx and save it."
    )
    guards = {down: t.rows[r][c - 1], right: t.rows[r - 1][(c if c < 5 else c - 2)]}
    opts = {"sheet": t.sheet, "cells": {ref: value, **guards}}
    oracle = calc_solution("oracle", path, 2, [Edit(0, ref, str(value), value)])
    near = [
        calc_solution(
            "off_by_one_row", path, 2, [Edit(0, down, str(value), value)], why=f"writes into {down}"
        ),
        calc_solution(
            "wrong_sheet",
            path,
            2,
            [Edit(1, ref, str(value), value)],
            why=f"writes on sheet {t.other}",
        ),
        calc_solution(
            "number_as_text",
            path,
            2,
            [Edit(0, ref, f"'{value}", str(value))],
            why="right digits stored as text",
        ),
        _nosave(oracle),
    ]
    return calc_spec(rng, instr, path, table_xlsx(t), opts, oracle, near)


def _total_task(rng: random.Random, kind: str) -> TaskSpec:
    t = make_table(rng)
    path = _path(rng)
    c = rng.randint(2, 5)
    col = get_column_letter(c)
    n = len(t.rows)
    vals = [r[c - 1] for r in t.rows]
    first, last = t.ref(c, 1), t.ref(c, n)
    target = t.ref(c, n + 1)
    if kind == "sum":
        want, fn = sum(vals), "SUM"
        wrong = [
            ("sum_without_last", sum(vals[:-1]), f"=SUM({first}:{t.ref(c, n - 1)})"),
            ("average_instead", round(sum(vals) / n, 6), f"=AVERAGE({first}:{last})"),
        ]
        what = "the total"
    elif kind == "max":
        want, fn = max(vals), "MAX"
        second = sorted(vals)[-2]
        wrong = [
            ("min_instead", min(vals), f"=MIN({first}:{last})"),
            ("second_largest", second, f"=LARGE({first}:{last};2)"),
        ]
        what = "the largest value"
    else:
        raise ValueError(kind)
    if wrong[1][1] == want or wrong[0][1] == want:
        wrong = [w for w in wrong if w[1] != want]
    instr = (
        f"In {path}, sheet '{t.sheet}': put {what} of column {col} ({t.header[c - 1]}, rows 2 to "
        f"{n + 1}) into cell {target}, right under the data. Save the file, keeping the xlsx "
        "format."
    )
    formula = f"={fn}({first}:{last})"
    opts = {"sheet": t.sheet, "cells": {target: want, last: vals[-1], t.ref(c, n + 2): None}}
    oracle = calc_solution("oracle", path, 2, [Edit(0, target, formula, want)])
    near = [
        calc_solution(name, path, 2, [Edit(0, target, typed, v)], why=name.replace("_", " "))
        for name, v, typed in wrong
    ]
    near.append(
        calc_solution(
            "one_row_too_low",
            path,
            2,
            [Edit(0, t.ref(c, n + 2), formula, want)],
            why=f"result in {t.ref(c, n + 2)}",
        )
    )
    near.append(_nosave(oracle))
    return calc_spec(rng, instr, path, table_xlsx(t), opts, oracle, near)


@family("calc_column_total", "libreoffice_calc")
def column_total(rng: random.Random) -> TaskSpec:
    return _total_task(rng, "sum")


@family("calc_column_max", "libreoffice_calc")
def column_max(rng: random.Random) -> TaskSpec:
    return _total_task(rng, "max")


@family("calc_row_average", "libreoffice_calc")
def row_average(rng: random.Random) -> TaskSpec:
    t = make_table(rng)
    path = _path(rng)
    r = rng.randint(1, len(t.rows) - 1)
    vals = t.rows[r - 1][1:]
    want = sum(vals) / 4
    ref = f"F{r + 1}"
    item = t.rows[r - 1][0]
    instr = (
        f"In {path}, sheet '{t.sheet}': in cell {ref} put the average of the four quarterly "
        f"figures of '{item}' (B{r + 1}:E{r + 1}). Save the file as xlsx."
    )
    formula = f"=AVERAGE(B{r + 1}:E{r + 1})"
    opts = {"sheet": t.sheet, "cells": {ref: want, f"F{r + 2}": None, f"F{r}": None}}
    oracle = calc_solution("oracle", path, 2, [Edit(0, ref, formula, want)])
    nxt = t.rows[r][1:]
    wrong = [
        ("sum_instead", f"=SUM(B{r + 1}:E{r + 1})", sum(vals)),
        ("next_row_average", f"=AVERAGE(B{r + 2}:E{r + 2})", sum(nxt) / 4),
        ("three_quarters", f"=AVERAGE(B{r + 1}:D{r + 1})", sum(vals[:3]) / 3),
    ]
    near = [
        calc_solution(name, path, 2, [Edit(0, ref, typed, v)], why=f"{typed} = {v}")
        for name, typed, v in wrong
        if abs(v - want) > 1e-6
    ]
    near.append(_nosave(oracle))
    return calc_spec(rng, instr, path, table_xlsx(t), opts, oracle, near)


@family("calc_count_at_least", "libreoffice_calc")
def count_at_least(rng: random.Random) -> TaskSpec:
    t = make_table(rng, n_rows=rng.randint(8, 12))
    path = _path(rng)
    c = rng.randint(2, 5)
    vals = [r[c - 1] for r in t.rows]
    threshold = rng.choice(sorted(vals)[2:-2])  # a value present in the column: >= vs > differs
    want = sum(v >= threshold for v in vals)
    n = len(t.rows)
    target = "H2"
    col = get_column_letter(c)
    instr = (
        f"In {path}, sheet '{t.sheet}': in cell {target}, put how many rows have a "
        f"{t.header[c - 1]} "
        f"value (column {col}) of at least {threshold}. Save the file as xlsx."
    )
    rng_ref = f"{col}2:{col}{n + 1}"
    opts = {"sheet": t.sheet, "cells": {target: want, "H3": None, "G2": None}}
    oracle = calc_solution(
        "oracle", path, 2, [Edit(0, target, f'=COUNTIF({rng_ref};">={threshold}")', want)]
    )
    wrong = [
        (
            "strictly_greater",
            f'=COUNTIF({rng_ref};">{threshold}")',
            sum(v > threshold for v in vals),
        ),
        (
            "at_most",
            f'=ROWS({rng_ref})-COUNTIF({rng_ref};">{threshold}")',
            sum(v <= threshold for v in vals),
        ),
    ]
    near = [
        calc_solution(name, path, 2, [Edit(0, target, typed, v)], why=f"{typed} = {v}")
        for name, typed, v in wrong
        if v != want
    ]
    near.append(
        calc_solution(
            "wrong_cell",
            path,
            2,
            [Edit(0, "H3", f'=COUNTIF({rng_ref};">={threshold}")', want)],
            why="answer in H3",
        )
    )
    near.append(_nosave(oracle))
    return calc_spec(rng, instr, path, table_xlsx(t), opts, oracle, near)


@family("calc_fix_typo", "libreoffice_calc")
def fix_typo(rng: random.Random) -> TaskSpec:
    t = make_table(rng)
    path = _path(rng)
    r = rng.randint(2, len(t.rows) - 1)
    good = t.rows[r - 1][0]
    i = rng.randint(1, len(good) - 2)
    bad = good[:i] + good[i] + good[i:]  # a doubled letter
    rows = [list(x) for x in t.rows]
    rows[r - 1][0] = bad
    t = Table(t.sheet, t.other, t.header, rows)
    ref = f"A{r + 1}"
    instr = (
        f"In {path}, sheet '{t.sheet}', the item name '{bad}' is misspelled: correct it to "
        f"'{good}'. Change nothing else and save the file as xlsx."
    )
    nb = rows[r][0]
    opts = {"sheet": t.sheet, "cells": {ref: good, f"A{r + 2}": nb, f"A{r}": rows[r - 2][0]}}
    oracle = calc_solution("oracle", path, 2, [Edit(0, ref, good, good)])
    near = [
        calc_solution(
            "lowercase",
            path,
            2,
            [Edit(0, ref, good.lower(), good.lower())],
            why="right word, wrong case",
        ),
        calc_solution(
            "fixed_next_row",
            path,
            2,
            [Edit(0, f"A{r + 2}", good, good)],
            why="overwrites the row below",
        ),
        calc_solution(
            "trailing_space",
            path,
            2,
            [Edit(0, ref, good + " ", good + " ")],
            why="adds a trailing space",
        ),
        _nosave(oracle),
    ]
    return calc_spec(rng, instr, path, table_xlsx(t), opts, oracle, near)


@family("calc_fill_blanks", "libreoffice_calc")
def fill_blanks(rng: random.Random) -> TaskSpec:
    t = make_table(rng, n_rows=rng.randint(8, 12))
    path = _path(rng)
    c = rng.randint(2, 5)
    n = len(t.rows)
    blank_rows = sorted(rng.sample(range(2, n), rng.randint(2, 3)))
    # no two blanks adjacent, so "the value above" is always an original value
    blank_rows = [b for i, b in enumerate(blank_rows) if i == 0 or b - blank_rows[i - 1] > 1]
    rows = [list(x) for x in t.rows]
    for b in blank_rows:
        rows[b - 1][c - 1] = None
    t = Table(t.sheet, t.other, t.header, rows)
    col = get_column_letter(c)
    instr = (
        f"In {path}, sheet '{t.sheet}', some cells of column {col} ({t.header[c - 1]}) are empty. "
        "Fill each empty cell of that column with the value of the cell directly above it, then "
        "save the file as xlsx."
    )
    above = {t.ref(c, b): rows[b - 2][c - 1] for b in blank_rows}
    below = {t.ref(c, b): rows[b][c - 1] for b in blank_rows}
    opts = {"sheet": t.sheet, "cells": dict(above)}

    def edits(values: dict[str, Any]) -> list[Edit]:
        return [Edit(0, ref, str(v), v) for ref, v in values.items()]

    oracle = calc_solution("oracle", path, 2, edits(above))
    first = dict(list(above.items())[:-1])
    near = [
        calc_solution("value_below", path, 2, edits(below), why="fills from the row below"),
        calc_solution("one_left_blank", path, 2, edits(first), why="misses the last blank"),
        calc_solution(
            "as_text",
            path,
            2,
            [Edit(0, r, f"'{v}", str(v)) for r, v in above.items()],
            why="values stored as text",
        ),
        _nosave(oracle),
    ]
    near = [s for s in near if not (s.name == "value_below" and below == above)]
    return calc_spec(rng, instr, path, table_xlsx(t), opts, oracle, near)


@family("calc_line_totals", "libreoffice_calc")
def line_totals(rng: random.Random) -> TaskSpec:
    n = rng.randint(4, 7)
    items = content.pick(rng, content.ITEMS, n)
    qty = [rng.randint(2, 40) for _ in range(n)]
    price = [rng.randint(3, 250) for _ in range(n)]
    wb = openpyxl.Workbook()
    ws = wb.active
    sheet = rng.choice(content.SHEETS)
    ws.title = sheet
    ws.append(["Item", "Qty", "Price", "Total"])
    for it, q, p in zip(items, qty, price, strict=False):
        ws.append([it, q, p])
    other = rng.choice(content.OTHER_SHEETS)
    wb.create_sheet(other).append(["Note"])
    path = _path(rng)
    instr = (
        f"In {path}, sheet '{sheet}': fill column D (Total) with Qty times Price for every item "
        f"(D2 to D{n + 1}). Save the file as xlsx."
    )
    want = {f"D{i + 2}": qty[i] * price[i] for i in range(n)}
    opts = {"sheet": sheet, "cells": {**want, f"D{n + 2}": None}}

    def sol(name: str, vals: dict[str, tuple[str, Any]], why: str = "") -> Solution:
        return calc_solution(
            name, path, 2, [Edit(0, r, t, v) for r, (t, v) in vals.items()], why=why
        )

    oracle = sol("oracle", {r: (f"=B{r[1:]}*C{r[1:]}", v) for r, v in want.items()})
    near = [
        sol(
            "plus_instead",
            {f"D{i + 2}": (f"=B{i + 2}+C{i + 2}", qty[i] + price[i]) for i in range(n)},
            "adds instead of multiplying",
        ),
        sol(
            "last_row_missing",
            {r: (f"=B{r[1:]}*C{r[1:]}", v) for r, v in list(want.items())[:-1]},
            "stops one row early",
        ),
        sol(
            "shifted_down",
            {f"D{i + 3}": (f"=B{i + 2}*C{i + 2}", qty[i] * price[i]) for i in range(n)},
            "every total one row too low",
        ),
    ]
    near.append(_nosave(oracle))
    return calc_spec(rng, instr, path, xlsx_bytes(wb), opts, oracle, near)


@family("calc_percent_format", "libreoffice_calc")
def percent_format(rng: random.Random) -> TaskSpec:
    n = rng.randint(4, 8)
    regions = content.pick(rng, content.REGIONS, n)
    shares = [round(rng.randint(5, 95) / 100, 2) for _ in range(n)]
    wb = openpyxl.Workbook()
    ws = wb.active
    sheet = rng.choice(content.SHEETS)
    ws.title = sheet
    ws.append(["Region", "Target", "Share"])
    for reg, s in zip(regions, shares, strict=False):
        ws.append([reg, rng.randint(100, 900), s])
    wb.create_sheet(rng.choice(content.OTHER_SHEETS)).append(["Note"])
    path = _path(rng)
    refs = [f"C{i + 2}" for i in range(n)]
    instr = (
        f"In {path}, sheet '{sheet}': format the Share column (C2:C{n + 1}) as percentages "
        "without changing the values (0.25 must show as 25%). Save the file as xlsx."
    )
    opts = {
        "sheet": sheet,
        "cells": {r: s for r, s in zip(refs, shares, strict=False)},
        "percent": refs,
    }
    oracle = calc_solution("oracle", path, 2, [], percent=(0, refs))
    near = [
        calc_solution(
            "values_times_100",
            path,
            2,
            [
                Edit(0, r, str(round(s * 100)), round(s * 100))
                for r, s in zip(refs, shares, strict=False)
            ],
            why="types 25 instead of formatting 0.25",
        ),
        calc_solution(
            "last_row_unformatted",
            path,
            2,
            [],
            percent=(0, refs[:-1]),
            why="selection one row short",
        ),
        calc_solution(
            "wrong_column",
            path,
            2,
            [],
            percent=(0, [f"B{i + 2}" for i in range(n)]),
            why="formats the Target column",
        ),
        _nosave(oracle, "formats, never saves"),
    ]
    return calc_spec(rng, instr, path, xlsx_bytes(wb), opts, oracle, near)


@family("calc_bold_header", "libreoffice_calc")
def bold_header(rng: random.Random) -> TaskSpec:
    t = make_table(rng)
    path = _path(rng)
    hdr = [f"{get_column_letter(i)}1" for i in range(1, 6)]
    instr = (
        f"In {path}, sheet '{t.sheet}': make the header row (A1:E1) bold, and nothing else. "
        "Save the file as xlsx."
    )
    opts = {"sheet": t.sheet, "bold": hdr, "not_bold": ["A2", "B2"]}
    oracle = calc_solution("oracle", path, 2, [], bold=(0, hdr))
    near = [
        calc_solution(
            "first_column",
            path,
            2,
            [],
            bold=(0, [f"A{i}" for i in range(1, len(t.rows) + 2)]),
            why="bolds column A instead",
        ),
        calc_solution("header_short", path, 2, [], bold=(0, hdr[:-1]), why="misses E1"),
        calc_solution(
            "header_and_row2",
            path,
            2,
            [],
            bold=(0, [*hdr, "A2", "B2", "C2", "D2", "E2"]),
            why="bolds row 2 as well",
        ),
        _nosave(oracle, "bolds, never saves"),
    ]
    return calc_spec(rng, instr, path, table_xlsx(t), opts, oracle, near)


# ------------------------------------------------------------------------------------------------
# Conversions: LibreOffice's headless converter in a separate profile acts for the GUI's Save As.


def csv_rows_of(t: Table) -> list[list[str]]:
    return [t.header] + [[str(v) for v in r] for r in t.rows]


def _csv_text(rows: list[list[str]], delim: str = ",") -> bytes:
    return ("\n".join(delim.join(r) for r in rows) + "\n").encode()


def _convert_actions(src: str, fmt: str, outdir: str) -> list[Action]:
    """LibreOffice's headless converter, then a second for the file to land."""
    return [soffice_convert(src, fmt, outdir), wait(1.0)]


def _convert(
    name: str, src: str, fmt: str, outdir: str, dest: str, data: bytes, why: str
) -> Solution:
    """Converts `src` to `fmt` in `outdir`, which writes `dest` (simulated as `data`)."""
    return Solution(name, _convert_actions(src, fmt, outdir), lambda _i: {dest: data}, why)


@family("calc_export_csv", "libreoffice_calc")
def export_csv(rng: random.Random) -> TaskSpec:
    t = make_table(rng)
    path = _path(rng)
    stem = path.rsplit("/", 1)[1][:-5]
    out = f"{DOCS}/{stem}.csv"
    instr = (
        f"Export the sheet '{t.sheet}' of {path} as a comma-separated CSV file named {out} "
        "(keep the header row)."
    )
    rows = csv_rows_of(t)
    other_rows = [["Note", "Value"]] + [
        [f"old {r[0]}", str(i + 1)] for i, r in enumerate(t.rows[:3])
    ]

    oracle = _convert("oracle", path, "csv", DOCS, out, _csv_text(rows), "")
    near = [
        _convert(
            "semicolons",
            path,
            "csv:Text - txt - csv (StarCalc):59,34,76,1",
            DOCS,
            out,
            _csv_text(rows, ";"),
            "semicolon separated",
        ),
        _convert(
            "wrong_sheet",
            path,
            "csv:Text - txt - csv (StarCalc):44,34,76,1,,0,false,true,false,false,false,2",
            DOCS,
            out,
            _csv_text(other_rows),
            "exports the second sheet",
        ),
        _convert(
            "wrong_folder",
            path,
            "csv",
            DESKTOP,
            f"{DESKTOP}/{stem}.csv",
            _csv_text(rows),
            "saves on the Desktop",
        ),
        # Exports, then strips the first line in a shell as an agent might. (Deleting row 1 in
        # Calc before a headless export was not a reliable route: the live validator saw its CSV
        # keep the header.) The workbook itself stays as seeded.
        Solution(
            "header_dropped",
            [*_convert_actions(path, "csv", DOCS), shell(f"sed -i 1d {shlex.quote(out)}")],
            lambda _i: {out: _csv_text(rows[1:])},
            "header row missing",
        ),
    ]
    files = {path: table_xlsx(t)}
    opts = {"rows": rows, "delimiter": ","}
    check = ("csv_rows", "csv_rows_raw")
    return _calc_spec(rng, instr, files, path, out, "out.csv", opts, oracle, near, check)


@family("calc_csv_to_xlsx", "libreoffice_calc")
def csv_to_xlsx(rng: random.Random) -> TaskSpec:
    t = make_table(rng)
    src = f"{DOCS}/{content.filename(rng, STEMS, 'csv')}"
    out = src[:-4] + ".xlsx"
    rows = csv_rows_of(t)
    data = _csv_text(rows)
    n = len(t.rows)
    instr = f"Open {src} in LibreOffice Calc and save it as an Excel 2007-365 workbook {out}."
    sheet = src.rsplit("/", 1)[1][:-4]  # Calc names the sheet after the CSV file

    def xlsx_of(rs: list[list[str]]) -> bytes:
        wb = openpyxl.Workbook()
        ws = wb.active
        ws.title = sheet
        for r in rs:
            ws.append([int(v) if v.isdigit() else v for v in r])
        return xlsx_bytes(wb)

    oracle = _convert("oracle", src, "xlsx", DOCS, out, xlsx_of(rows), "")
    near = [
        # An ODS file is a zip the xlsx checkers must refuse; simulate it with a real ODF text zip.
        _convert(
            "saved_as_ods",
            src,
            "ods",
            DOCS,
            src[:-4] + ".ods",
            odt_bytes(["not a workbook"]),
            "ODF spreadsheet, no xlsx",
        ),
        _convert(
            "wrong_folder",
            src,
            "xlsx",
            DESKTOP,
            f"{DESKTOP}/{out.rsplit('/', 1)[1]}",
            xlsx_of(rows),
            "saves on the Desktop",
        ),
        Solution(
            "csv_renamed",
            [*_convert_actions(src, "xlsx", "/tmp"), execute(["cp", src, out])],
            lambda _i: {out: data},
            "copies the CSV text under the xlsx name",
        ),
    ]
    cells = {
        "A1": "Item",
        f"A{n + 1}": t.rows[-1][0],
        f"E{n + 1}": t.rows[-1][4],
        "B2": t.rows[0][1],
    }
    opts = {"sheet": sheet, "cells": cells}
    return _calc_spec(rng, instr, {src: data}, src, out, "out.xlsx", opts, oracle, near)
