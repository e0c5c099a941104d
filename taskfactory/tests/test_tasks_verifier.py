"""The checkers on their own: refusing garbage, the raw parsers on files other writers make,
and the reference scope rule."""

from __future__ import annotations

import io
import random
import zipfile
from pathlib import Path

import openpyxl
import pytest
from drums_tasks import verifier
from drums_tasks.verifier import CHECKS, path_allowed, scope_violations
from PIL import Image

# Options that make every checker look for the file under "f".
OPTIONS = {
    "xlsx_cells": {"file": "f", "sheet": "S", "cells": {"A1": 1}},
    "csv_rows": {"file": "f", "rows": [["a"]]},
    "docx_text": {"file": "f", "contains": ["x"]},
    "odf_text": {"file": "f", "contains": ["x"]},
    "pptx_text": {"file": "f", "titles": ["x"]},
    "pdf_text": {"docs": [{"file": "f", "contains": ["x"]}]},
    "image_pixels": {"file": "f", "width": 2, "height": 2, "samples": []},
    "text_equals": {"file": "f", "expected": "x"},
    "lines_equal": {"file": "f", "lines": ["x"]},
    "answer_from_source": {
        "file": "f",
        "source": "f",
        "source_type": "text",
        "source_sha256": "0" * 64,
        "question": {"kind": "line_count", "contains": "x"},
    },
    "files_state": {"present": {"f": "0" * 64}, "blake2b": {"f": "0"}, "sizes": {"f": 1}},
}


def _opts(name: str) -> dict:
    for base, opts in OPTIONS.items():
        if name.startswith(base):
            return opts
    raise KeyError(name)


GARBAGE = [
    b"",
    b"\x00" * 10,
    b"PK\x03\x04 not really a zip",
    b"%PDF-1.4 broken",
    b"\x89PNG\r\n\x1a\n truncated",
    b"\xff\xd8\xff junk",
    "caf\u00e9".encode("latin-1"),
]


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for k, v in entries.items():
            zf.writestr(k, v)
    return buf.getvalue()


GARBAGE.append(_zip({"mimetype": b"application/vnd.oasis.opendocument.text"}))
GARBAGE.append(_zip({"xl/workbook.xml": b"<nope"}))


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_missing_file_scores_zero(name: str, require_check_libs) -> None:
    require_check_libs(name)
    assert CHECKS[name]({"f": None}, _opts(name)) == 0.0
    assert CHECKS[name]({}, _opts(name)) == 0.0
    assert CHECKS[name]({"f": "/nonexistent/drums/file"}, _opts(name)) == 0.0


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_garbage_scores_zero_without_raising(name: str, tmp_path: Path, require_check_libs) -> None:
    require_check_libs(name)
    for i, data in enumerate(GARBAGE):
        p = tmp_path / f"g{i}"
        p.write_bytes(data)
        assert CHECKS[name]({"f": str(p)}, _opts(name)) == 0.0, (name, data[:20])


def test_checks_come_in_pairs() -> None:
    primaries = [n for n in CHECKS if not n.endswith(("_raw", "_fitz"))]
    for n in primaries:
        assert any(m != n and m.startswith(n) for m in CHECKS), n


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P"])
def test_png_decoder_matches_pillow(mode: str, tmp_path: Path) -> None:
    rng = random.Random(mode)
    img = Image.new("RGB", (23, 17))
    img.putdata(
        [(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(23 * 17)]
    )
    img = img.convert(mode)
    for optimize in (False, True):
        buf = io.BytesIO()
        img.save(buf, "PNG", optimize=optimize)
        w, h, rows, chans = verifier._png_decode(buf.getvalue())
        ref = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        assert (w, h) == ref.size
        for y in range(h):
            for x in range(w):
                px = rows[y][x * chans : x * chans + chans]
                got = (px[0],) * 3 if chans <= 2 else tuple(px[:3])
                assert got == ref.getpixel((x, y)), (mode, x, y)


def test_xlsx_raw_reads_inline_strings_and_absolute_targets(tmp_path: Path) -> None:
    """A workbook written the way some producers do: inline strings, t="str" formula results,
    absolute relationship targets; openpyxl and the raw parser must both read it."""
    ns = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    rns = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'
    files = {
        "[Content_Types].xml": (
            '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
            'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats'
            '-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-'
            'officedocument.spreadsheetml.sheet.main+xml"/><Override PartName="/xl/worksheets/'
            's1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.'
            'worksheet+xml"/></Types>'
        ),
        "_rels/.rels": (
            '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/'
            '2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/'
            'officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/>'
            "</Relationships>"
        ),
        "xl/workbook.xml": (
            f'<?xml version="1.0"?><workbook {ns} {rns}><sheets><sheet name="S" sheetId="1" '
            'r:id="rId7"/></sheets></workbook>'
        ),
        "xl/_rels/workbook.xml.rels": (
            '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/'
            '2006/relationships"><Relationship Id="rId7" Type="http://schemas.openxmlformats.org/'
            'officeDocument/2006/relationships/worksheet" Target="/xl/worksheets/s1.xml"/>'
            "</Relationships>"
        ),
        "xl/worksheets/s1.xml": (
            f'<?xml version="1.0"?><worksheet {ns}><sheetData><row r="1">'
            '<c r="A1" t="inlineStr"><is><t>Hello</t></is></c><c r="B1"><v>42</v></c>'
            '<c r="C1" t="str"><f>"x"&amp;"y"</f><v>xy</v></c></row></sheetData></worksheet>'
        ),
    }
    p = tmp_path / "w.xlsx"
    p.write_bytes(_zip({k: v.encode() for k, v in files.items()}))
    good = {"file": "f", "sheet": "S", "cells": {"A1": "Hello", "B1": 42, "C1": "xy"}}
    bad = {"file": "f", "sheet": "S", "cells": {"A1": "Hello", "B1": 43}}
    for name in ("xlsx_cells", "xlsx_cells_raw"):
        assert CHECKS[name]({"f": str(p)}, good) == 1.0, name
        assert CHECKS[name]({"f": str(p)}, bad) == 0.0, name


def test_xlsx_number_stored_as_text_is_a_miss(tmp_path: Path) -> None:
    wb = openpyxl.Workbook()
    wb.active.title = "S"
    wb.active["A1"] = "1"
    p = tmp_path / "t.xlsx"
    wb.save(p)
    for name in ("xlsx_cells", "xlsx_cells_raw"):
        assert CHECKS[name]({"f": str(p)}, {"file": "f", "sheet": "S", "cells": {"A1": 1}}) == 0.0


def test_text_checks_ignore_only_trailing_whitespace(tmp_path: Path) -> None:
    p = tmp_path / "a.txt"
    for data, want in [
        (b"42\n", 1.0),
        (b"42\r\n", 1.0),
        (b"42", 1.0),
        (b" 42\n", 0.0),
        (b"4 2\n", 0.0),
        (b"42.0\n", 0.0),
    ]:
        p.write_bytes(data)
        for name in ("text_equals", "text_equals_raw"):
            assert CHECKS[name]({"f": str(p)}, {"file": "f", "expected": "42"}) == want, data


def test_glob_rule_crosses_slashes() -> None:
    assert path_allowed("/home/user/Documents/.~lock.a.xlsx#", ["/home/user/Documents/.~lock.*#"])
    assert path_allowed("/home/user/x/y/z", ["/home/user/x/*"])
    assert not path_allowed("/home/user/Documents/a.xlsx", ["/home/user/Documents/b.xlsx"])


def test_scope_violations_rule() -> None:
    scope = {
        "roots": ["/home/user/Documents"],
        "seeded": {"/home/user/Documents/a": "h1", "/home/user/Documents/keep": "h2"},
        "allow": ["/home/user/Documents/a", "/home/user/Documents/out.*"],
    }
    base = {"/home/user/Documents/a": "h1", "/home/user/Documents/keep": "h2"}
    assert scope_violations(scope, base) == []
    assert scope_violations(scope, {**base, "/home/user/Documents/a": "zz"}) == []
    assert scope_violations(scope, {**base, "/home/user/Documents/out.pdf": "n"}) == []
    assert scope_violations(scope, {**base, "/home/user/Documents/keep": "zz"}) == [
        "/home/user/Documents/keep"
    ]
    assert scope_violations(scope, {**base, "/home/user/Documents/keep": None}) == [
        "/home/user/Documents/keep"
    ]
    assert scope_violations(scope, {**base, "/home/user/Documents/new": "n"}) == [
        "/home/user/Documents/new"
    ]
    # outside the roots nothing is judged
    assert scope_violations(scope, {**base, "/home/user/.config/x": "n"}) == []


def test_pdf_text_normalizes_ligatures() -> None:
    # Chromium's PDFs keep the "ff" ligature that pypdf returns as U+FB00 and PyMuPDF expands.
    assert verifier._squash("The sta\ufb00  survey\n") == "The staff survey"


PAGE = (
    b'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>T</title></head>\n'
    b"<body><h1>Fish &amp; chips</h1>\n<table><tr><th>Item</th><th>Price</th><th>State</th></tr>\n"
    b"<tr><td>Lamp</td><td>12.50</td><td>open</td></tr>\n"
    b"<tr><td>Desk</td><td>30</td><td>closed</td></tr>\n"
    b"<tr><td>Chair</td><td>7</td><td>open</td></tr>\n</table>\n"
    b'<ul><li><a href="https://x.example/a?b=1&amp;c=2">Handbook</a></li></ul></body></html>\n'
)


@pytest.mark.parametrize(
    ("question", "right", "wrong"),
    [
        ({"kind": "table_cell", "key": "Desk", "column": 1}, "30", "12.50"),
        ({"kind": "table_count", "column": 2, "equals": "open"}, "2", "3"),
        ({"kind": "table_sum", "column": 1}, "49.5", "49"),
        ({"kind": "heading"}, "Fish & chips", "Fish &amp; chips"),
        ({"kind": "link", "label": "Handbook"}, "https://x.example/a?b=1&c=2", "Handbook"),
    ],
)
def test_answer_from_source_on_a_page(tmp_path: Path, question, right, wrong) -> None:
    """Both routes work the answer out of the page; the options never hold it."""
    import hashlib

    (tmp_path / "page").write_bytes(PAGE)
    opts = {
        "file": "a",
        "source": "s",
        "source_type": "html",
        "source_sha256": hashlib.sha256(PAGE).hexdigest(),
        "question": question,
    }
    paths = {"a": str(tmp_path / "a"), "s": str(tmp_path / "page")}
    for text, want in ((right + "\n", 1.0), (wrong, 0.0)):
        (tmp_path / "a").write_text(text)
        got = (
            CHECKS["answer_from_source"](paths, opts),
            CHECKS["answer_from_source_raw"](paths, opts),
        )
        assert got == (want, want), (question, text)
    # An agent that edits the page to fit its answer gets nothing: the source is not the seeded one.
    (tmp_path / "a").write_text(wrong)
    (tmp_path / "page").write_bytes(PAGE.replace(right.encode(), wrong.encode()))
    assert CHECKS["answer_from_source"](paths, opts) == 0.0
    assert CHECKS["answer_from_source_raw"](paths, opts) == 0.0
