"""Multi-app workflows: read in one app, write in another."""

from __future__ import annotations

import random
from collections.abc import Callable

from openpyxl.utils import get_column_letter

from ..actions import Action, soffice_convert, wait, write
from ..spec import Solution, TaskSpec
from . import calc, chromium, content, impress, writer
from .registry import family

DOCS = "/home/user/Documents"
DESKTOP = "/home/user/Desktop"
LOCKS = f"{DOCS}/.~lock.*#"


def _open(path: str, seconds: float = 3) -> list[dict]:
    return [
        {"type": "open", "parameters": {"path": path}},
        {"type": "sleep", "parameters": {"seconds": seconds}},
    ]


def multi_spec(
    rng: random.Random,
    *,
    instruction: str,
    files: dict[str, bytes],
    launch: list[dict],
    results: list[tuple[str, str]],
    check: str,
    check_alt: str,
    options: dict,
    allow: list[str],
    oracle: Solution,
    near_misses: list[Solution],
    related_apps: list[str],
    roots: list[str] | None = None,
    dirs: list[str] | None = None,
) -> TaskSpec:
    """A multi-app task over `files` plus the README decoy in Documents (its text is drawn from
    `rng` here, last); the apps' lock files may change besides `allow`."""
    decoy = f"{DOCS}/README.txt"
    return TaskSpec(
        family="",
        app="multi_apps",
        instruction=instruction,
        files={**files, decoy: ("Shared work folder.\n" + content.sentence(rng) + "\n").encode()},
        launch=launch,
        results=results,
        check=check,
        check_alt=check_alt,
        options=options,
        roots=roots or [DOCS],
        allow=[*allow, LOCKS],
        oracle=oracle,
        near_misses=near_misses,
        decoy=decoy,
        related_apps=related_apps,
        dirs=dirs or [],
    )


@family("multi_xlsx_total_to_docx", "multi_apps")
def xlsx_total_to_docx(rng: random.Random) -> TaskSpec:
    t = calc.make_table(rng)
    xlsx = f"{DOCS}/{content.filename(rng, calc.STEMS, 'xlsx')}"
    docx_path = f"{DOCS}/{content.filename(rng, writer.STEMS, 'docx')}"
    c = rng.randint(2, 4)
    quarter = t.header[c - 1]
    vals = [r[c - 1] for r in t.rows]
    total = sum(vals)
    paras = writer.make_paras(rng, 3, 5)
    k = rng.randint(1, len(paras) - 1)
    line = f"The {quarter} total is TBD."
    paras.insert(k, writer.Para(line))

    def doc_with(value: int) -> tuple[list[Action], Callable[[], bytes]]:
        new = f"The {quarter} total is {value}."
        gui = [*writer.goto_para(k), *writer.select_line(), write(new)]
        return gui, lambda: writer.docx_of(
            [writer.Para(new) if i == k else p for i, p in enumerate(paras)]
        )

    instr = (
        f'{docx_path} says "{line}" Replace TBD with the sum of the {quarter} column of sheet '
        f"'{t.sheet}' in {xlsx} (both files are open), so the sentence ends with the number "
        "and a period. Save the document in Word format."
    )
    gui, data = doc_with(total)
    want = [p.text for p in paras]
    want[k] = f"The {quarter} total is {total}."
    oracle = writer.writer_solution("oracle", docx_path, gui, data)
    cands = [
        ("next_column", sum(r[c] for r in t.rows)),
        ("without_last_row", sum(vals[:-1])),
        ("largest_value", max(vals)),
    ]
    near = []
    for name, v in cands:
        if v != total:
            g, d = doc_with(v)
            near.append(writer.writer_solution(name, docx_path, g, d, why=f"{name}: {v}"))
    near.append(
        writer.writer_solution(
            "not_saved", docx_path, gui, None, save=False, why="edits, never saves"
        )
    )
    return multi_spec(
        rng,
        instruction=instr,
        files={
            xlsx: calc.table_xlsx(t),
            docx_path: writer.docx_of(paras),
        },
        launch=[*_open(xlsx), *_open(docx_path)],
        results=[(docx_path, "report.docx")],
        check="docx_text",
        check_alt="docx_text_raw",
        options={"file": "report.docx", "paragraphs": want},
        allow=[docx_path],
        oracle=oracle,
        near_misses=near,
        related_apps=["libreoffice_calc", "libreoffice_writer"],
    )


@family("multi_web_rate_to_xlsx", "multi_apps")
def web_rate_to_xlsx(rng: random.Random) -> TaskSpec:
    regions = content.pick(rng, content.REGIONS, rng.randint(4, 6))
    rates = {r: rng.randint(5, 60) for r in regions}
    html_path = f"{DOCS}/rates_{rng.randint(10, 99)}.html"
    html = chromium.page(
        "Rates",
        "Commission rates",
        chromium.table_html(["Region", "Rate (%)"], [[r, str(v)] for r, v in rates.items()]),
    )
    import openpyxl

    from ..docfiles import xlsx_bytes

    wb = openpyxl.Workbook()
    ws = wb.active
    sheet = rng.choice(content.SHEETS)
    ws.title = sheet
    ws.append(["Region", "Rate"])
    order = list(regions)
    rng.shuffle(order)
    k = rng.randint(0, len(order) - 2)
    for i, r in enumerate(order):
        ws.append([r, None if i == k else rates[r]])
    wb.create_sheet(rng.choice(content.OTHER_SHEETS)).append(["Note"])
    xlsx = f"{DOCS}/{content.filename(rng, calc.STEMS, 'xlsx')}"
    region = order[k]
    ref = f"B{k + 2}"
    want = rates[region]
    instr = (
        f"The web page open in Chromium lists commission rates. In {xlsx} (open in Calc), sheet "
        f"'{sheet}', the Rate of {region} (cell {ref}) is empty: fill in the rate from the page "
        "as a plain number, then save the file as xlsx."
    )
    other = rates[order[k + 1]]
    oracle = calc.calc_solution("oracle", xlsx, 2, [calc.Edit(0, ref, str(want), want)])
    near = [
        calc.calc_solution(
            "cell_below",
            xlsx,
            2,
            [calc.Edit(0, f"B{k + 3}", str(want), want)],
            why="writes over the next region",
        ),
        calc.calc_solution(
            "as_text",
            xlsx,
            2,
            [calc.Edit(0, ref, f"'{want}", str(want))],
            why="number stored as text",
        ),
        calc.calc_solution(
            "with_percent",
            xlsx,
            2,
            [calc.Edit(0, ref, f"{want}%", want / 100)],
            why="typed with a percent sign: stored as a fraction",
        ),
    ]
    if other != want:
        near.append(
            calc.calc_solution(
                "next_region_rate",
                xlsx,
                2,
                [calc.Edit(0, ref, str(other), other)],
                why="rate of another region",
            )
        )
    guard = {f"B{k + 3}": rates[order[k + 1]], f"A{k + 2}": region}
    return multi_spec(
        rng,
        instruction=instr,
        files={html_path: html, xlsx: xlsx_bytes(wb)},
        launch=[
            *_open(xlsx),
            {
                "type": "launch",
                "parameters": {"command": [*chromium.CHROMIUM, f"file://{html_path}"]},
            },
            {"type": "sleep", "parameters": {"seconds": 4}},
        ],
        results=[(xlsx, "rates.xlsx")],
        check="xlsx_cells",
        check_alt="xlsx_cells_raw",
        options={"file": "rates.xlsx", "sheet": sheet, "cells": {ref: want, **guard}},
        allow=[xlsx],
        oracle=oracle,
        near_misses=near,
        related_apps=["chrome", "libreoffice_calc"],
    )


@family("multi_text_title_to_pptx", "multi_apps")
def text_title_to_pptx(rng: random.Random) -> TaskSpec:
    deck = impress.make_deck(rng)
    pptx = f"{DOCS}/{content.filename(rng, impress.STEMS, 'pptx')}"
    txt = f"{DOCS}/new_title.txt"
    kind = rng.choice(["roadmap", "in numbers", "recap"])
    new = f"{rng.choice(content.TOPICS).capitalize()} {kind}"
    k = 0
    instr = (
        f"The file {txt} holds the new title for the first slide of {pptx} (open in Impress). "
        "Set the first slide's title to exactly that text and save the presentation in "
        "PowerPoint format."
    )
    want = impress._with(deck, k, title=new)
    gui = impress.retype(k, 0, new)
    oracle = impress.impress_solution("oracle", pptx, gui, want)
    near = [
        impress.impress_solution(
            "second_slide",
            pptx,
            impress.retype(1, 0, new),
            impress._with(deck, 1, title=new),
            why="edits slide 2",
        ),
        impress.impress_solution(
            "file_name_as_title",
            pptx,
            impress.retype(k, 0, "new_title.txt"),
            impress._with(deck, k, title="new_title.txt"),
            why="types the file name",
        ),
        # (Not "lower case": Impress's autocorrect capitalizes the first letter back.)
        impress.impress_solution(
            "last_word_missing",
            pptx,
            impress.retype(k, 0, new.rsplit(" ", 1)[0]),
            impress._with(deck, k, title=new.rsplit(" ", 1)[0]),
            why="title typed without its last word",
        ),
        impress.impress_solution("not_saved", pptx, gui, None, why="edits, never saves"),
    ]
    return multi_spec(
        rng,
        instruction=instr,
        files={
            pptx: impress.pptx_of(deck),
            txt: (new + "\n").encode(),
        },
        launch=[{"type": "launch", "parameters": {"command": ["xterm"]}}, *_open(pptx, 4)],
        results=[(pptx, "deck.pptx")],
        check="pptx_text",
        check_alt="pptx_text_raw",
        options={"file": "deck.pptx", "titles": [s.title for s in want]},
        allow=[pptx],
        oracle=oracle,
        near_misses=near,
        related_apps=["libreoffice_impress", "os"],
    )


@family("multi_export_both_pdf", "multi_apps")
def export_both_pdf(rng: random.Random) -> TaskSpec:
    paras = writer.make_paras(rng, 2, 4)
    t = calc.make_table(rng, n_rows=rng.randint(4, 6))
    docx_path = f"{DOCS}/{content.filename(rng, writer.STEMS, 'docx')}"
    xlsx = f"{DOCS}/{content.filename(rng, calc.STEMS, 'xlsx')}"
    outdir = f"{DESKTOP}/pdf"
    d_out = f"{outdir}/{docx_path.rsplit('/', 1)[1][:-5]}.pdf"
    x_out = f"{outdir}/{xlsx.rsplit('/', 1)[1][:-5]}.pdf"
    instr = (
        f"Export both {docx_path} and {xlsx} to PDF into the folder {outdir} (it exists), "
        "keeping their file names (with .pdf)."
    )
    doc_pdf = lambda: writer.pdf_of([p.text for p in paras])  # noqa: E731
    xls_pdf = lambda: writer.pdf_of(["  ".join(map(str, r)) for r in [t.header, *t.rows]])  # noqa: E731

    def export(name: str, which: list[str], where: str, why: str = "") -> Solution:
        acts: list[Action] = []
        eff: dict = {}
        for src in which:
            acts += [soffice_convert(src, "pdf", where), wait(1.0)]
            stem = src.rsplit("/", 1)[1].rsplit(".", 1)[0]
            eff[f"{where}/{stem}.pdf"] = doc_pdf if src == docx_path else xls_pdf
        return Solution(name, acts, lambda _i: {k: f() for k, f in eff.items()}, why)

    oracle = export("oracle", [docx_path, xlsx], outdir)
    near = [
        export("document_only", [docx_path], outdir, "forgets the workbook"),
        export("workbook_only", [xlsx], outdir, "forgets the document"),
        export("wrong_folder", [docx_path, xlsx], DESKTOP, "PDFs on the Desktop itself"),
    ]
    docs = [
        {"file": "doc.pdf", "contains": [paras[0].text]},
        {"file": "sheet.pdf", "contains": [t.rows[0][0], t.rows[-1][0]]},
    ]
    return multi_spec(
        rng,
        instruction=instr,
        files={
            docx_path: writer.docx_of(paras),
            xlsx: calc.table_xlsx(t),
            f"{outdir}/.keep": b"",
        },
        launch=[*_open(docx_path), *_open(xlsx)],
        results=[(d_out, "doc.pdf"), (x_out, "sheet.pdf")],
        check="pdf_text",
        check_alt="pdf_text_fitz",
        options={"docs": docs},
        roots=[DOCS, DESKTOP],
        allow=[d_out, x_out, outdir],
        oracle=oracle,
        near_misses=near,
        related_apps=["libreoffice_writer", "libreoffice_calc"],
    )


@family("multi_calc_count_to_answer", "multi_apps")
def calc_count_to_answer(rng: random.Random) -> TaskSpec:
    t = calc.make_table(rng, n_rows=rng.randint(8, 12))
    xlsx = f"{DOCS}/{content.filename(rng, calc.STEMS, 'xlsx')}"
    c = rng.randint(2, 5)
    vals = [r[c - 1] for r in t.rows]
    threshold = rng.choice(sorted(vals)[2:-2])
    want = sum(v > threshold for v in vals)
    col = get_column_letter(c)
    instr = (
        f"Using {xlsx} (open in Calc), count how many items have a {t.header[c - 1]} value "
        f"(column {col}) greater than {threshold}, and write just that number into "
        f"{chromium.ANSWER}."
    )
    other = [r[c] if c < 5 else r[c - 2] for r in t.rows]
    cands = [
        ("at_least", sum(v >= threshold for v in vals)),
        ("other_column", sum(v > threshold for v in other)),
        ("one_more", want + 1),
        ("at_most", sum(v <= threshold for v in vals)),
    ]
    near = [chromium.answer(nm, str(v), why=nm) for nm, v in cands if v != want][:3]
    near.append(
        chromium.answer(
            "wrong_folder", str(want), f"{DOCS}/answer.txt", why="right count, saved in Documents"
        )
    )
    book = calc.table_xlsx(t)
    question = {"kind": "table_count_above", "column": c - 1, "above": threshold}
    return multi_spec(
        rng,
        instruction=instr,
        files={xlsx: book},
        launch=[*_open(xlsx), {"type": "launch", "parameters": {"command": ["xterm"]}}],
        results=[(chromium.ANSWER, "answer.txt"), (xlsx, "source.xlsx")],
        check="answer_from_source",
        check_alt="answer_from_source_raw",
        options=chromium.source_answer("xlsx", book, question),
        roots=[DOCS, DESKTOP],
        allow=[chromium.ANSWER],
        oracle=chromium.answer("oracle", str(want)),
        near_misses=near,
        related_apps=["libreoffice_calc", "os"],
        dirs=[DESKTOP],
    )
