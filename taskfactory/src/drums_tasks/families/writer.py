"""LibreOffice Writer families: edit a seeded docx/odt in Writer and save it, or convert it.

Paragraphs are generated short enough to fit on one line, so the keyboard oracle can select a
paragraph with Home, Shift+End after moving there with Ctrl+Down (next paragraph).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import docx

from ..actions import (
    Action,
    activate_window,
    execute,
    hotkey,
    office_save,
    press,
    soffice_convert,
    wait,
    write,
)
from ..docfiles import docx_bytes, odt_bytes
from ..spec import Solution, TaskSpec
from . import content
from .registry import family

DOCS = "/home/user/Documents"
DESKTOP = "/home/user/Desktop"
LOCKS = f"{DOCS}/.~lock.*#"
STEMS = ["report", "minutes", "memo", "briefing", "summary", "proposal", "notes_final"]


@dataclass(frozen=True)
class Para:
    text: str
    style: str = "Normal"
    bold: bool = False
    italic: bool = False


def docx_of(paras: list[Para], table: list[list[str]] | None = None) -> bytes:
    d = docx.Document()
    if table is not None:
        t = d.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, v in enumerate(row):
                t.cell(r, c).text = v
    for p in paras:
        para = d.add_paragraph(style=p.style)
        run = para.add_run(p.text)
        if p.bold:
            run.bold = True
        if p.italic:
            run.italic = True
    return docx_bytes(d)


def make_paras(rng: random.Random, lo: int = 4, hi: int = 7) -> list[Para]:
    return [Para(s) for s in content.sentences(rng, rng.randint(lo, hi))]


def goto_para(k: int) -> list[Action]:
    steps: list[Action] = [hotkey("ctrl", "home")]
    steps += [hotkey("ctrl", "down") for _ in range(k)]
    return steps


def select_line() -> list[Action]:
    return [press("home"), hotkey("shift", "end")]


def writer_solution(
    name: str,
    path: str,
    gui: list[Action],
    result: Callable[[], bytes] | None,
    save: bool = True,
    why: str = "",
    odf: bool = False,
) -> Solution:
    """GUI steps then Ctrl+S; `result` builds the saved bytes (lazily: only tests need them)."""
    fname = path.rsplit("/", 1)[1]
    acts: list[Action] = [activate_window(re.escape(fname)), wait(0.5), *gui]
    if save:
        acts += office_save(keep_format_dialog=not odf)

    def simulate(_inputs: dict[str, bytes]) -> dict[str, bytes | None]:
        return {path: result()} if (save and result is not None) else {}

    return Solution(name, acts, simulate, why)


def office_spec(
    rng: random.Random,
    *,
    app: str,
    readme: str,
    instruction: str,
    files: dict[str, bytes],
    opened: str,
    seconds: int,
    output: str,
    dest: str,
    check: str,
    check_alt: str,
    options: dict,
    oracle: Solution,
    near: list[Solution],
) -> TaskSpec:
    """A LibreOffice task (Writer, Impress or Calc): `files` plus a README decoy in Documents that
    starts with the line `readme` (its second line is drawn from `rng` here, last), `opened` open
    in `app`; judged on the one file `output` (fetched as `dest`), which, with the lock files, is
    all the task may change."""
    decoy = f"{DOCS}/README.txt"
    return TaskSpec(
        family="",
        app=app,
        instruction=instruction,
        files={**files, decoy: f"{readme}\n{content.sentence(rng)}\n".encode()},
        launch=[
            {"type": "open", "parameters": {"path": opened}},
            {"type": "sleep", "parameters": {"seconds": seconds}},
        ],
        results=[(output, dest)],
        check=check,
        check_alt=check_alt,
        options=options,
        roots=[DOCS],
        allow=[output, LOCKS],
        oracle=oracle,
        near_misses=near,
        decoy=decoy,
    )


def writer_spec(
    rng: random.Random,
    instruction: str,
    path: str,
    data: bytes,
    options: dict,
    oracle: Solution,
    near: list[Solution],
    check: str = "docx_text",
    check_alt: str = "docx_text_raw",
) -> TaskSpec:
    """A task that edits the document `path` in place."""
    dest = path.rsplit("/", 1)[1]
    return office_spec(
        rng,
        app="libreoffice_writer",
        readme="Team documents.",
        instruction=instruction,
        files={path: data},
        opened=path,
        seconds=3,
        output=path,
        dest=dest,
        check=check,
        check_alt=check_alt,
        options={"file": dest, **options},
        oracle=oracle,
        near=near,
    )


def _path(rng: random.Random, ext: str = "docx") -> str:
    return f"{DOCS}/{content.filename(rng, STEMS, ext)}"


def _texts(paras: list[Para]) -> list[str]:
    return [p.text for p in paras]


def _unsaved(name_gui: list[Action], path: str, odf: bool = False) -> Solution:
    return writer_solution(
        "not_saved",
        path,
        name_gui,
        None,
        save=False,
        why="edits the document, never saves",
        odf=odf,
    )


# ------------------------------------------------------------------------------------------------


@family("writer_replace_paragraph", "libreoffice_writer")
def replace_paragraph(rng: random.Random) -> TaskSpec:
    paras = make_paras(rng)
    k = rng.randint(1, len(paras) - 2)
    new = content.sentence(rng)
    while new in _texts(paras):
        new = content.sentence(rng)
    path = _path(rng)
    instr = (
        f'In {path}, replace the paragraph that reads "{paras[k].text}" with exactly '
        f'"{new}" and save the document in Word format.'
    )

    def with_(i: int) -> list[Para]:
        out = list(paras)
        out[i] = Para(new)
        return out

    want = with_(k)
    gui = [*goto_para(k), *select_line(), write(new)]
    oracle = writer_solution("oracle", path, gui, lambda: docx_of(want))
    near = [
        writer_solution(
            "next_paragraph",
            path,
            [*goto_para(k + 1), *select_line(), write(new)],
            lambda: docx_of(with_(k + 1)),
            why="replaces the paragraph after it",
        ),
        writer_solution(
            "inserted_not_replaced",
            path,
            [*goto_para(k), press("home"), write(new), press("enter")],
            lambda: docx_of([*paras[:k], Para(new), *paras[k:]]),
            why="adds the new text above, keeps the old",
        ),
        writer_solution(
            "no_final_period",
            path,
            [*goto_para(k), *select_line(), write(new[:-1])],
            lambda: docx_of([*paras[:k], Para(new[:-1]), *paras[k + 1 :]]),
            why="drops the final period",
        ),
        _unsaved(gui, path),
    ]
    return writer_spec(rng, instr, path, docx_of(paras), {"paragraphs": _texts(want)}, oracle, near)


@family("writer_append_paragraph", "libreoffice_writer")
def append_paragraph(rng: random.Random) -> TaskSpec:
    paras = make_paras(rng)
    new = content.sentence(rng)
    while new in _texts(paras):
        new = content.sentence(rng)
    path = _path(rng)
    instr = f'Add a new last paragraph "{new}" at the end of {path} and save it in Word format.'
    want = [*paras, Para(new)]
    short = new[:-1].rsplit(" ", 1)[0] + "."
    gui = [hotkey("ctrl", "end"), press("enter"), write(new)]
    oracle = writer_solution("oracle", path, gui, lambda: docx_of(want))
    near = [
        writer_solution(
            "added_at_top",
            path,
            [hotkey("ctrl", "home"), write(new), press("enter")],
            lambda: docx_of([Para(new), *paras]),
            why="new paragraph at the top",
        ),
        writer_solution(
            "joined_to_last",
            path,
            [hotkey("ctrl", "end"), write(" " + new)],
            lambda: docx_of([*paras[:-1], Para(paras[-1].text + " " + new)]),
            why="appended to the last paragraph, no new paragraph",
        ),
        # (Not "typed in lower case": Writer's autocorrect capitalizes the sentence back.)
        writer_solution(
            "last_word_missing",
            path,
            [hotkey("ctrl", "end"), press("enter"), write(short)],
            lambda: docx_of([*paras, Para(short)]),
            why="sentence typed without its last word",
        ),
        _unsaved(gui, path),
    ]
    return writer_spec(rng, instr, path, docx_of(paras), {"paragraphs": _texts(want)}, oracle, near)


def _delete_gui(k: int, n: int) -> list[Action]:
    last = k == n - 1
    return [
        *goto_para(k),
        *select_line(),
        press("delete"),
        press("backspace" if last else "delete"),
    ]


@family("writer_delete_paragraph", "libreoffice_writer")
def delete_paragraph(rng: random.Random) -> TaskSpec:
    paras = make_paras(rng, 5, 7)
    n = len(paras)
    k = rng.randint(1, n - 2)
    path = _path(rng)
    instr = (
        f'Delete the paragraph "{paras[k].text}" from {path} (leave no empty line behind) and '
        "save the document in Word format."
    )
    want = paras[:k] + paras[k + 1 :]
    oracle = writer_solution("oracle", path, _delete_gui(k, n), lambda: docx_of(want))
    near = [
        writer_solution(
            "deleted_next",
            path,
            _delete_gui(k + 1, n),
            lambda: docx_of(paras[: k + 1] + paras[k + 2 :]),
            why="deletes its neighbour",
        ),
        writer_solution(
            "deleted_two",
            path,
            _delete_gui(k, n) + _delete_gui(k, n - 1),
            lambda: docx_of(paras[:k] + paras[k + 2 :]),
            why="also deletes the next one",
        ),
        _unsaved(_delete_gui(k, n), path),
    ]
    # (Clearing the text but keeping an empty paragraph is not a near miss here: the checkers
    # compare non-empty paragraphs, as LibreOffice may add empty ones of its own.)
    return writer_spec(rng, instr, path, docx_of(paras), {"paragraphs": _texts(want)}, oracle, near)


@family("writer_bold_paragraph", "libreoffice_writer")
def bold_paragraph(rng: random.Random) -> TaskSpec:
    paras = make_paras(rng)
    n = len(paras)
    k = rng.randint(0, n - 2)
    path = _path(rng)
    instr = f'In {path}, make the paragraph "{paras[k].text}" bold (only that one) and save it.'

    def styled(idx: list[int], **kw: bool) -> Callable[[], bytes]:
        return lambda: docx_of([replace(p, **kw) if i in idx else p for i, p in enumerate(paras)])

    gui = [*goto_para(k), *select_line(), hotkey("ctrl", "b")]
    others = [p.text for i, p in enumerate(paras) if i != k]
    opts = {"paragraphs": _texts(paras), "bold": [paras[k].text], "not_bold": others}
    oracle = writer_solution("oracle", path, gui, styled([k], bold=True))
    near = [
        writer_solution(
            "wrong_paragraph",
            path,
            [*goto_para(k + 1), *select_line(), hotkey("ctrl", "b")],
            styled([k + 1], bold=True),
            why="bolds the next paragraph",
        ),
        writer_solution(
            "italic_instead",
            path,
            [*goto_para(k), *select_line(), hotkey("ctrl", "i")],
            styled([k], italic=True),
            why="italic, not bold",
        ),
        writer_solution(
            "whole_document",
            path,
            [hotkey("ctrl", "a"), hotkey("ctrl", "b")],
            styled(list(range(n)), bold=True),
            why="bolds everything",
        ),
        _unsaved(gui, path),
    ]
    return writer_spec(rng, instr, path, docx_of(paras), opts, oracle, near)


@family("writer_heading", "libreoffice_writer")
def heading(rng: random.Random) -> TaskSpec:
    title = f"{rng.choice(content.TOPICS).capitalize()} {rng.choice(['plan', 'review', 'update'])}"
    title = title.replace("The ", "")
    title = title[0].upper() + title[1:]
    paras = [Para(title), *make_paras(rng, 3, 5)]
    path = _path(rng)
    instr = (
        f'In {path}, give the first line "{title}" the paragraph style Heading 1 and save the '
        "document in Word format."
    )

    def styled(i: int, style: str) -> Callable[[], bytes]:
        return lambda: docx_of(
            [replace(p, style=style) if j == i else p for j, p in enumerate(paras)]
        )

    gui = [hotkey("ctrl", "home"), hotkey("ctrl", "1")]
    opts = {"paragraphs": _texts(paras), "styles": {title: "Heading 1", paras[1].text: "Normal"}}
    oracle = writer_solution("oracle", path, gui, styled(0, "Heading 1"))
    near = [
        writer_solution(
            "heading_2",
            path,
            [hotkey("ctrl", "home"), hotkey("ctrl", "2")],
            styled(0, "Heading 2"),
            why="Heading 2",
        ),
        writer_solution(
            "second_line",
            path,
            [*goto_para(1), hotkey("ctrl", "1")],
            styled(1, "Heading 1"),
            why="styles the second paragraph",
        ),
        writer_solution(
            "bold_only",
            path,
            [hotkey("ctrl", "home"), *select_line(), hotkey("ctrl", "b")],
            lambda: docx_of([replace(paras[0], bold=True), *paras[1:]]),
            why="looks like a heading, is not one",
        ),
        _unsaved(gui, path),
    ]
    return writer_spec(rng, instr, path, docx_of(paras), opts, oracle, near)


@family("writer_uppercase_paragraph", "libreoffice_writer")
def uppercase_paragraph(rng: random.Random) -> TaskSpec:
    paras = make_paras(rng)
    k = rng.randint(0, len(paras) - 2)
    path = _path(rng)
    up = paras[k].text.upper()
    instr = f'In {path}, change the paragraph "{paras[k].text}" to all capital letters and save.'

    def retyped(i: int, text: str) -> tuple[list[Action], Callable[[], bytes]]:
        gui = [*goto_para(i), *select_line(), write(text)]
        return gui, lambda: docx_of([Para(text) if j == i else p for j, p in enumerate(paras)])

    others = [p.text for i, p in enumerate(paras) if i != k]
    opts = {"upper": [up], "contains": others}
    gui, data = retyped(k, up)
    oracle = writer_solution("oracle", path, gui, data)
    g1, d1 = retyped(k, paras[k].text.title())
    g2, d2 = retyped(k + 1, paras[k + 1].text.upper())
    first, rest = paras[k].text.split(" ", 1)
    g3, d3 = retyped(k, f"{first} {rest.upper()}")
    near = [
        writer_solution("title_case", path, g1, d1, why="Title Case"),
        writer_solution("wrong_paragraph", path, g2, d2, why="uppercases the next paragraph"),
        writer_solution("first_word_missed", path, g3, d3, why="one word not capitalised"),
        _unsaved(gui, path),
    ]
    return writer_spec(rng, instr, path, docx_of(paras), opts, oracle, near)


@family("writer_table_cell", "libreoffice_writer")
def table_cell(rng: random.Random) -> TaskSpec:
    n = rng.randint(3, 5)
    people = content.pick(rng, content.PEOPLE, n)
    roles = [rng.choice(["Lead", "Editor", "Analyst", "Driver", "Clerk"]) for _ in people]
    hours = [str(rng.randint(4, 40)) for _ in people]
    r = rng.randint(1, n - 1)  # row index into people (0-based); table row r+1
    table = [["Name", "Role", "Hours"]] + [
        [p, ro, h] for p, ro, h in zip(people, roles, hours, strict=False)
    ]
    value = str(rng.randint(41, 60))
    table[r + 1][2] = ""
    paras = make_paras(rng, 2, 3)
    path = _path(rng)
    instr = (
        f"The table in {path} is missing the Hours of {people[r]}: enter {value} in that cell "
        "and save the document in Word format."
    )

    def filled(row: int, col: int) -> tuple[list[Action], Callable[[], bytes]]:
        t = [list(x) for x in table]
        t[row][col] = value
        gui: list[Action] = [hotkey("ctrl", "home")]
        tabs = row * 3 + col
        if tabs:
            gui.append(press("tab", tabs))
        gui.append(write(value))
        return gui, lambda: docx_of(paras, t)

    guards = [[0, r + 1, 0, people[r]], [0, r + 1, 1, roles[r]]]
    if r + 2 <= n:
        guards.append([0, r + 2, 2, table[r + 2][2]])
    opts = {"cells": [[0, r + 1, 2, value], *guards], "paragraphs": _texts(paras)}
    gui, data = filled(r + 1, 2)
    oracle = writer_solution("oracle", path, gui, data)
    g1, d1 = filled(r + 1, 1)
    g2, d2 = filled(r, 2) if r >= 1 else filled(r + 2, 2)
    near = [
        writer_solution("role_cell", path, g1, d1, why="types into the Role cell"),
        writer_solution("wrong_row", path, g2, d2, why="types into another person's row"),
        _unsaved(gui, path),
    ]
    return writer_spec(rng, instr, path, docx_of(paras, table), opts, oracle, near)


@family("writer_odt_replace", "libreoffice_writer")
def odt_replace(rng: random.Random) -> TaskSpec:
    title = f"{rng.choice(content.TOPICS).capitalize()} notes"
    body = content.sentences(rng, rng.randint(3, 6))
    k = rng.randint(0, len(body) - 2)
    new = content.sentence(rng)
    while new in body:
        new = content.sentence(rng)
    path = _path(rng, "odt")
    instr = (
        f'In the OpenDocument text {path}, replace the paragraph "{body[k]}" with "{new}" and '
        "save it, keeping the ODF format."
    )
    # goto_para counts the heading as paragraph 0
    want = [*body[:k], new, *body[k + 1 :]]
    gui = [*goto_para(k + 1), *select_line(), write(new)]
    oracle = writer_solution("oracle", path, gui, lambda: odt_bytes(want, heading=title), odf=True)
    near = [
        writer_solution(
            "replaced_heading",
            path,
            [*goto_para(0), *select_line(), write(new)],
            lambda: odt_bytes(body, heading=new),
            odf=True,
            why="overwrites the heading",
        ),
        writer_solution(
            "next_paragraph",
            path,
            [*goto_para(k + 2), *select_line(), write(new)],
            lambda: odt_bytes([*body[: k + 1], new, *body[k + 2 :]], heading=title),
            odf=True,
            why="replaces the paragraph after it",
        ),
        writer_solution(
            "appended",
            path,
            [hotkey("ctrl", "end"), press("enter"), write(new)],
            lambda: odt_bytes([*body, new], heading=title),
            odf=True,
            why="adds at the end",
        ),
        _unsaved(gui, path, odf=True),
    ]
    spec = writer_spec(
        rng,
        instr,
        path,
        odt_bytes(body, heading=title),
        {"paragraphs": [title, *want], "mimetype": "application/vnd.oasis.opendocument.text"},
        oracle,
        near,
        check="odf_text",
        check_alt="odf_text_raw",
    )
    return spec


# ------------------------------------------------------------------------------------------------
# Conversions


def pdf_of(lines: list[str]) -> bytes:
    """A real one-page PDF with these lines (simulated export; only tests call it)."""
    return pdf_pages([lines])


def pdf_pages(pages: list[list[str]]) -> bytes:
    """A real PDF, one page per entry (simulated exports; only tests call it, so PyMuPDF is
    needed by the tests, not by the build)."""
    import pymupdf

    doc = pymupdf.open()
    for lines in pages:
        page = doc.new_page()
        y = 72
        for line in lines:
            page.insert_text((72, y), line, fontsize=11)
            y += 16
    data = doc.tobytes(garbage=0, deflate=True)
    doc.close()
    return data


def convert_actions(src: str, fmt: str, outdir: str) -> list[Action]:
    """LibreOffice's headless converter, then a second for the file to land."""
    return [soffice_convert(src, fmt, outdir), wait(1.0)]


def convert_solution(
    name: str,
    src: str,
    fmt: str,
    outdir: str,
    dest: str,
    payload: Callable[[], bytes],
    why: str,
) -> Solution:
    """Converts `src` to `fmt` in `outdir`; `payload` builds the `dest` file (lazily: only tests
    need it)."""
    return Solution(name, convert_actions(src, fmt, outdir), lambda _i: {dest: payload()}, why)


# The near misses every document conversion has (Writer's and Impress's).


def saved_on_desktop(
    src: str, fmt: str, out: str, payload: Callable[[], bytes], why: str
) -> Solution:
    """The right conversion, written to the Desktop instead of `out`'s folder."""
    desktop_out = f"{DESKTOP}/{out.rsplit('/', 1)[1]}"
    return convert_solution("wrong_folder", src, fmt, DESKTOP, desktop_out, payload, why)


def old_draft_converted(
    name: str, old: str, fmt: str, out: str, payload: Callable[[], bytes], why: str
) -> Solution:
    """The older file `old` beside the source converted (in /tmp) and copied to `out`: the right
    name, the wrong content."""
    converted = f"/tmp/{old.rsplit('/', 1)[1].rsplit('.', 1)[0]}.{fmt}"
    acts = [*convert_actions(old, fmt, "/tmp"), execute(["cp", converted, out])]
    return Solution(name, acts, lambda _i: {out: payload()}, why)


def copied_unconverted(src: str, out: str, why: str) -> Solution:
    """`src` copied under `out`'s name, not converted (`docx_renamed`, `pptx_renamed`)."""
    ext = src.rsplit(".", 1)[1]
    return Solution(f"{ext}_renamed", [execute(["cp", src, out])], lambda i: {out: i[src]}, why)


def _conversion(
    rng: random.Random,
    fmt: str,
    *,
    instruction: Callable[[str, str], str],
    convert: Callable[[list[str]], bytes],
    whys: tuple[str, str, str],
    check: tuple[str, str],
    options: Callable[[list[str]], dict],
) -> TaskSpec:
    """A docx converted to `fmt` as `<stem>.<fmt>` beside it, with an older draft `old_<stem>.docx`
    in the same folder: `convert(texts)` is the converted file, `whys` explain the near misses
    (Desktop, old draft, renamed), `check` is the checker and its twin, given `options(texts)`."""
    paras = make_paras(rng, 3, 5)
    other = make_paras(rng, 3, 4)
    path = _path(rng)
    stem = path.rsplit("/", 1)[1][:-5]
    old = f"{DOCS}/old_{stem}.docx"
    out = f"{DOCS}/{stem}.{fmt}"
    texts = _texts(paras)
    oracle = convert_solution("oracle", path, fmt, DOCS, out, lambda: convert(texts), "")
    desktop_why, old_why, renamed_why = whys
    near = [
        saved_on_desktop(path, fmt, out, lambda: convert(texts), desktop_why),
        old_draft_converted(
            "other_document", old, fmt, out, lambda: convert(_texts(other)), old_why
        ),
        copied_unconverted(path, out, renamed_why),
    ]
    return office_spec(
        rng,
        app="libreoffice_writer",
        readme="Team documents.",
        instruction=instruction(path, out),
        files={path: docx_of(paras), old: docx_of(other)},
        opened=path,
        seconds=3,
        output=out,
        dest=f"out.{fmt}",
        check=check[0],
        check_alt=check[1],
        options=options(texts),
        oracle=oracle,
        near=near,
    )


@family("writer_export_pdf", "libreoffice_writer")
def export_pdf(rng: random.Random) -> TaskSpec:
    return _conversion(
        rng,
        "pdf",
        instruction=lambda path, out: f"Export {path} to PDF as {out}.",
        convert=pdf_of,
        whys=("PDF on the Desktop", "exports the old draft", "copies the docx under a .pdf name"),
        check=("pdf_text", "pdf_text_fitz"),
        options=lambda texts: {
            "docs": [{"file": "out.pdf", "pages": 1, "contains": [texts[0], texts[-1]]}]
        },
    )


@family("writer_docx_to_odt", "libreoffice_writer")
def docx_to_odt(rng: random.Random) -> TaskSpec:
    return _conversion(
        rng,
        "odt",
        instruction=lambda path, out: (
            f"Save a copy of {path} in OpenDocument Text format as {out}."
        ),
        convert=odt_bytes,
        whys=(
            "copy on the Desktop",
            "converts the old draft",
            "copies the docx under an .odt name",
        ),
        check=("odf_text", "odf_text_raw"),
        options=lambda texts: {
            "file": "out.odt",
            "paragraphs": texts,
            "mimetype": "application/vnd.oasis.opendocument.text",
        },
    )
