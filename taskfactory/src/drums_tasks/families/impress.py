"""LibreOffice Impress families: edit slide text in a seeded pptx, or convert the deck.

The keyboard oracle: Home (first slide), Page Down per slide, Tab selects the slide's objects in
z-order (title first, then the body), Enter starts text editing; the object is emptied (see
`clear_text`) before the new text is typed, never typed over a Ctrl+A selection.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from pptx import Presentation

from ..actions import (
    Action,
    activate_window,
    hotkey,
    office_save,
    press,
    wait,
    write,
)
from ..docfiles import odp_bytes, pptx_bytes
from ..spec import Solution, TaskSpec
from . import content
from .registry import family
from .writer import (
    convert_solution,
    copied_unconverted,
    office_spec,
    old_draft_converted,
    pdf_pages,
    saved_on_desktop,
)

DOCS = "/home/user/Documents"
DESKTOP = "/home/user/Desktop"
LOCKS = f"{DOCS}/.~lock.*#"
STEMS = ["deck", "slides", "pitch", "kickoff", "review_deck", "all_hands"]
ODP_MIME = "application/vnd.oasis.opendocument.presentation"


@dataclass(frozen=True)
class Slide:
    title: str
    body: list[str]


def pptx_of(slides: list[Slide]) -> bytes:
    prs = Presentation()
    layout = prs.slide_layouts[1]  # Title and Content: title placeholder first, then the body
    for s in slides:
        sl = prs.slides.add_slide(layout)
        sl.shapes.title.text = s.title
        tf = sl.placeholders[1].text_frame
        tf.text = s.body[0]
        for line in s.body[1:]:
            tf.add_paragraph().text = line
    return pptx_bytes(prs)


def make_deck(rng: random.Random) -> list[Slide]:
    n = rng.randint(3, 6)
    titles = [o.replace("the ", "").capitalize() for o in content.pick(rng, content.OBJECTS, n)]
    return [Slide(t, content.sentences(rng, rng.randint(1, 3))) for t in titles]


def to_object(slide: int, obj: int) -> list[Action]:
    """Select object `obj` (0 title, 1 body) of slide `slide`, not yet in text edit mode."""
    steps: list[Action] = [press("escape"), press("escape"), press("home")]
    if slide:
        steps.append(press("pagedown", slide))
    return [*steps, press("tab", obj + 1)]


# More than the longest seeded text object (three sentences), so the emptying never falls short.
_CLEAR_PRESSES = 250


def clear_text() -> list[Action]:
    """Empty the selected text object and leave the cursor in it, ready to type.

    Measured with screenshots on the office image (LibreOffice 7.4, a python-pptx body
    placeholder): after Enter and Ctrl+A, text typed over the selection goes wrong after about
    20 characters (each further key replaces the one before), and Delete on that selection can
    leave its last character or last paragraph behind. Typing after leaving and re-entering edit
    mode is faithful. So: delete what Ctrl+A selects, leave and re-enter edit mode, and backspace
    from the end over whatever is left.
    """
    return [
        press("enter"),
        wait(0.3),
        hotkey("ctrl", "a"),
        press("backspace"),
        wait(0.3),
        press("escape"),
        wait(0.5),
        press("enter"),
        wait(0.5),
        hotkey("ctrl", "end"),
        _py_backspaces(_CLEAR_PRESSES),
        wait(0.3),
    ]


def _py_backspaces(n: int) -> str:
    return f"import pyautogui; pyautogui.press('backspace', presses={n}, interval=0.01)"


def retype(slide: int, obj: int, text: str) -> list[Action]:
    """Replace the text of object `obj` (0 title, 1 body) of slide `slide`."""
    steps = [*to_object(slide, obj), *clear_text()]
    for i, line in enumerate(text.split("\n")):
        if i:
            steps.append(press("enter"))
        steps.append(write(line))
    return [*steps, press("escape"), press("escape")]


def impress_solution(
    name: str, path: str, gui: list[Action], deck: list[Slide] | None, why: str = ""
) -> Solution:
    fname = path.rsplit("/", 1)[1]
    acts: list[Action] = [activate_window(re.escape(fname)), wait(0.5), *gui]
    if deck is not None:
        acts += office_save()
    # The saved file is built only when a test simulates this solution.
    return Solution(name, acts, lambda _i: {path: pptx_of(deck)} if deck is not None else {}, why)


def impress_spec(
    rng: random.Random,
    instruction: str,
    path: str,
    deck: list[Slide],
    options: dict,
    oracle: Solution,
    near: list[Solution],
) -> TaskSpec:
    """A task that edits the deck `path` in place."""
    dest = path.rsplit("/", 1)[1]
    return office_spec(
        rng,
        app="libreoffice_impress",
        readme="Slides for the team.",
        instruction=instruction,
        files={path: pptx_of(deck)},
        opened=path,
        seconds=4,
        output=path,
        dest=dest,
        check="pptx_text",
        check_alt="pptx_text_raw",
        options={"file": dest, **options},
        oracle=oracle,
        near=near,
    )


def _path(rng: random.Random, ext: str = "pptx") -> str:
    return f"{DOCS}/{content.filename(rng, STEMS, ext)}"


def _with(deck: list[Slide], i: int, **kw) -> list[Slide]:
    return [replace(s, **kw) if j == i else s for j, s in enumerate(deck)]


def _title_task(rng: random.Random, make_title, describe) -> TaskSpec:
    deck = make_deck(rng)
    k = rng.randint(0, len(deck) - 2)
    old = deck[k].title
    new = make_title(rng, old)
    path = _path(rng)
    instr = describe(path, k, old, new)
    want = _with(deck, k, title=new)
    gui = retype(k, 0, new)
    oracle = impress_solution("oracle", path, gui, want)
    near = [
        impress_solution(
            "next_slide",
            path,
            retype(k + 1, 0, new),
            _with(deck, k + 1, title=new),
            why="edits the next slide's title",
        ),
        impress_solution(
            "into_body",
            path,
            retype(k, 1, new),
            _with(deck, k, body=[new]),
            why="types into the body, not the title",
        ),
        impress_solution(
            "typo",
            path,
            retype(k, 0, new[:-1]),
            _with(deck, k, title=new[:-1]),
            why="last character missing",
        ),
        impress_solution("not_saved", path, gui, None, why="edits, never saves"),
    ]
    opts = {"titles": [s.title for s in want]}
    return impress_spec(rng, instr, path, deck, opts, oracle, near)


@family("impress_edit_title", "libreoffice_impress")
def edit_title(rng: random.Random) -> TaskSpec:
    return _title_task(
        rng,
        lambda r, old: r.choice(["Updated", "Revised", "Final", "Draft"]) + " " + old.lower(),
        lambda path, k, old, new: (
            f'In the presentation {path}, change the title of slide {k + 1} ("{old}") to '
            f'"{new}" and save it in PowerPoint format.'
        ),
    )


@family("impress_uppercase_title", "libreoffice_impress")
def uppercase_title(rng: random.Random) -> TaskSpec:
    return _title_task(
        rng,
        lambda r, old: old.upper(),
        lambda path, k, old, new: (
            f'In {path}, rewrite the title of slide {k + 1} ("{old}") in capital letters and '
            "save the presentation in PowerPoint format."
        ),
    )


@family("impress_title_suffix", "libreoffice_impress")
def title_suffix(rng: random.Random) -> TaskSpec:
    suffix = rng.choice([" (draft)", " - v2", " 2025", " - final"])
    return _title_task(
        rng,
        lambda r, old: old + suffix,
        lambda path, k, old, new: (
            f'In {path}, append "{suffix}" to the title of slide {k + 1} so that it reads '
            f'"{new}", then save the presentation in PowerPoint format.'
        ),
    )


@family("impress_edit_body", "libreoffice_impress")
def edit_body(rng: random.Random) -> TaskSpec:
    deck = make_deck(rng)
    k = rng.randint(0, len(deck) - 2)
    new = content.sentence(rng)
    path = _path(rng)
    old = deck[k].body
    instr = (
        f'In {path}, replace the text in the content box of slide {k + 1} ("{deck[k].title}") '
        f'with the single line "{new}" and save the presentation in PowerPoint format.'
    )
    want = _with(deck, k, body=[new])
    gui = retype(k, 1, new)
    oracle = impress_solution("oracle", path, gui, want)
    near = [
        impress_solution(
            "next_slide",
            path,
            retype(k + 1, 1, new),
            _with(deck, k + 1, body=[new]),
            why="edits the next slide",
        ),
        impress_solution(
            "into_title",
            path,
            retype(k, 0, new),
            _with(deck, k, title=new),
            why="replaces the title instead",
        ),
        impress_solution(
            "kept_old_lines",
            path,
            retype(k, 1, "\n".join([*old, new])),
            _with(deck, k, body=[*old, new]),
            why="adds the line, keeps the old",
        ),
        impress_solution("not_saved", path, gui, None, why="edits, never saves"),
    ]
    opts = {"titles": [s.title for s in deck], "slide_contains": {str(k): [new]}, "absent": old}
    return impress_spec(rng, instr, path, deck, opts, oracle, near)


def _deck_files(rng: random.Random) -> tuple[list[Slide], list[Slide], str, str, str]:
    deck, other = make_deck(rng), make_deck(rng)
    path = _path(rng)
    stem = path.rsplit("/", 1)[1][:-5]
    return deck, other, path, f"{DOCS}/old_{stem}.pptx", stem


def _conversion_spec(
    rng: random.Random,
    instruction: str,
    deck: list[Slide],
    other: list[Slide],
    path: str,
    old: str,
    out: str,
    check: tuple[str, str],
    options: dict,
    oracle: Solution,
    near: list[Solution],
) -> TaskSpec:
    """The deck `path` converted to `out`, with the older deck `old` beside it."""
    return office_spec(
        rng,
        app="libreoffice_impress",
        readme="Slides for the team.",
        instruction=instruction,
        files={path: pptx_of(deck), old: pptx_of(other)},
        opened=path,
        seconds=4,
        output=out,
        dest=f"out.{out.rsplit('.', 1)[1]}",
        check=check[0],
        check_alt=check[1],
        options=options,
        oracle=oracle,
        near=near,
    )


# LibreOffice's PDF export filter with a page range: what printing only the current slide gives.
_PDF_FIRST_SLIDE = 'pdf:impress_pdf_Export:{"PageRange":{"type":"string","value":"1"}}'


@family("impress_export_pdf", "libreoffice_impress")
def export_pdf(rng: random.Random) -> TaskSpec:
    deck, other, path, old, stem = _deck_files(rng)
    out = f"{DOCS}/{stem}.pdf"
    instr = f"Export the presentation {path} to PDF as {out} (one page per slide)."

    def pdf(d: list[Slide]) -> Callable[[], bytes]:
        return lambda: pdf_pages([[s.title, *s.body] for s in d])

    oracle = convert_solution("oracle", path, "pdf", DOCS, out, pdf(deck), "")
    near = [
        saved_on_desktop(path, "pdf", out, pdf(deck), "PDF on the Desktop"),
        old_draft_converted("other_deck", old, "pdf", out, pdf(other), "exports the old deck"),
        copied_unconverted(path, out, "copies the pptx under a .pdf name"),
        convert_solution(
            "first_slide_only",
            path,
            _PDF_FIRST_SLIDE,
            DOCS,
            out,
            pdf(deck[:1]),
            "a PDF of the first slide only (e.g. printed the current slide)",
        ),
    ]
    opts = {
        "docs": [
            {
                "file": "out.pdf",
                "pages": len(deck),
                "contains": [s.title for s in deck] + [s.body[0] for s in deck],
            }
        ]
    }
    check = ("pdf_text", "pdf_text_fitz")
    return _conversion_spec(rng, instr, deck, other, path, old, out, check, opts, oracle, near)


@family("impress_pptx_to_odp", "libreoffice_impress")
def pptx_to_odp(rng: random.Random) -> TaskSpec:
    deck, other, path, old, stem = _deck_files(rng)
    out = f"{DOCS}/{stem}.odp"
    instr = f"Save a copy of the presentation {path} in OpenDocument format as {out}."

    def odp(d: list[Slide]) -> Callable[[], bytes]:
        return lambda: odp_bytes([[s.title, *s.body] for s in d])

    oracle = convert_solution("oracle", path, "odp", DOCS, out, odp(deck), "")
    near = [
        saved_on_desktop(path, "odp", out, odp(deck), "copy on the Desktop"),
        old_draft_converted("other_deck", old, "odp", out, odp(other), "converts the old deck"),
        copied_unconverted(path, out, "copies the pptx under an .odp name"),
    ]
    everything = [s.title for s in deck] + [b for s in deck for b in s.body]
    opts = {"file": "out.odp", "contains": everything, "mimetype": ODP_MIME}
    check = ("odf_text", "odf_text_raw")
    return _conversion_spec(rng, instr, deck, other, path, old, out, check, opts, oracle, near)
