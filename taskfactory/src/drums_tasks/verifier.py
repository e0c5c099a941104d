"""drums-tasks checkers: pure functions over local copies of a task's result files.

Every checker is `check(paths, options) -> float`: `paths` maps each result's `dest` to a local file
path, or to None when the file does not exist in the desktop. Each primary checker reads the state
through a library (openpyxl, python-docx, python-pptx, pypdf, odfpy, Pillow); its `*_raw` twin reads
the same state through another parser (zipfile + xml.etree over the raw OOXML/ODF, PyMuPDF,
hand-decoded PNG, bytes), so a parser bug shows up as a disagreement in the reward audit.
This file is self-contained (stdlib + those libraries): the build copies it verbatim into the
generated verifier module that drumsd imports.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import math
import os
import re
import struct
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Iterable
from html.parser import HTMLParser
from typing import Any, TypeVar
from xml.etree import ElementTree as ET

Paths = dict[str, "str | None"]
Options = dict[str, Any]
_T = TypeVar("_T")


def _file(paths: Paths, key: str) -> str | None:
    p = paths.get(key)
    if p is None or not os.path.isfile(p):
        return None
    return p


def _read(paths: Paths, key: str) -> bytes | None:
    p = _file(paths, key)
    if p is None:
        return None
    with open(p, "rb") as f:
        return f.read()


def _load(paths: Paths, key: str, parse: Callable[[str], _T | None]) -> _T | None:
    """`parse(path)` of a result file, or None (the checker scores 0) when the file is missing,
    `parse` raises on it (a damaged or foreign file), or `parse` itself rejects it with None."""
    p = _file(paths, key)
    if p is None:
        return None
    try:
        return parse(p)
    except Exception:
        return None


def _read_text(paths: Paths, key: str, encoding: str = "utf-8") -> str | None:
    """A result file's text, or None when it is missing or not valid `encoding`."""
    data = _read(paths, key)
    if data is None:
        return None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        return None


def _score(ok: bool) -> float:
    return 1.0 if ok else 0.0


def _same_value(got: Any, want: Any, tol: float) -> bool:
    """Numbers must be stored as numbers (text "42" is a near miss); text must match exactly."""
    if want is None:
        return got is None or got == ""
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=0, abs_tol=tol)
    return isinstance(got, str) and got == want


# ----------------------------------------------------------------------------------------------
# xlsx: cells, sheet names, percent formats, bold
# options: file, sheet, cells {ref: value}, sheet_names [..], percent [refs], bold [refs],
#          not_bold [refs], tol


def xlsx_cells(paths: Paths, options: Options) -> float:
    import openpyxl

    wb = _load(paths, options["file"], lambda p: openpyxl.load_workbook(p, data_only=True))
    if wb is None:
        return 0.0
    if "sheet_names" in options and wb.sheetnames != options["sheet_names"]:
        return 0.0
    sheet = options.get("sheet")
    if sheet is None:
        return 1.0
    if sheet not in wb.sheetnames:
        return 0.0
    ws = wb[sheet]
    tol = float(options.get("tol", 1e-6))
    for ref, want in options.get("cells", {}).items():
        if not _same_value(ws[ref].value, want, tol):
            return 0.0
    for ref in options.get("percent", []):
        if "%" not in (ws[ref].number_format or ""):
            return 0.0
    for ref in options.get("bold", []):
        if not ws[ref].font.b:
            return 0.0
    for ref in options.get("not_bold", []):
        if ws[ref].font.b:
            return 0.0
    return 1.0


_SS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_RELNS = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_PKG_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"


def _rels(zf: zipfile.ZipFile, part: str) -> dict[str, str]:
    """Relationship id -> absolute part name for `part` (e.g. xl/workbook.xml)."""
    base, name = part.rsplit("/", 1) if "/" in part else ("", part)
    rels_name = f"{base}/_rels/{name}.rels" if base else f"_rels/{name}.rels"
    out = {}
    root = ET.fromstring(zf.read(rels_name))
    for rel in root.iter(f"{_PKG_REL}Relationship"):
        target = rel.get("Target", "")
        if target.startswith("/"):
            full = target.lstrip("/")
        else:
            parts = (base.split("/") if base else []) + target.split("/")
            stack: list[str] = []
            for seg in parts:
                if seg == "..":
                    if stack:
                        stack.pop()
                elif seg and seg != ".":
                    stack.append(seg)
            full = "/".join(stack)
        out[rel.get("Id", "")] = full
    return out


def _xml_text(el: ET.Element, tag: str) -> str:
    return "".join(t.text or "" for t in el.iter(tag))


def _col_row(ref: str) -> tuple[int, int]:
    m = re.fullmatch(r"\$?([A-Z]+)\$?(\d+)", ref.upper())
    if not m:
        raise ValueError(f"bad cell reference {ref!r}")
    col = 0
    for ch in m.group(1):
        col = col * 26 + ord(ch) - 64
    return col, int(m.group(2))


def _raw_cells(zf: zipfile.ZipFile, sheet_part: str, shared: list[str]) -> dict[tuple, tuple]:
    """(col, row) -> (value, style index) from a worksheet part."""
    root = ET.fromstring(zf.read(sheet_part))
    cells: dict[tuple, tuple] = {}
    for c in root.iter(f"{_SS}c"):
        ref = c.get("r")
        if ref is None:
            continue
        t = c.get("t", "n")
        v = c.find(f"{_SS}v")
        vt = v.text if v is not None else None
        value: Any
        if t == "s":
            value = shared[int(vt)] if vt is not None else None
        elif t == "inlineStr":
            is_ = c.find(f"{_SS}is")
            value = _xml_text(is_, f"{_SS}t") if is_ is not None else ""
        elif t in ("str", "e"):
            value = vt
        elif t == "b":
            value = vt in ("1", "true")
        else:
            value = float(vt) if vt not in (None, "") else None
        cells[_col_row(ref)] = (value, int(c.get("s", "0")))
    return cells


def _raw_workbook(p: str) -> tuple[zipfile.ZipFile, list[tuple[Any, str]], list[str]]:
    """The package, its sheets as (name, worksheet part) in order, and its shared strings."""
    zf = zipfile.ZipFile(p)
    wb = ET.fromstring(zf.read("xl/workbook.xml"))
    rels = _rels(zf, "xl/workbook.xml")
    sheets = [
        (s.get("name"), rels.get(s.get(f"{_RELNS}id", ""), "")) for s in wb.iter(f"{_SS}sheet")
    ]
    shared: list[str] = []
    if "xl/sharedStrings.xml" in zf.namelist():
        sst = ET.fromstring(zf.read("xl/sharedStrings.xml"))
        for si in sst.findall(f"{_SS}si"):
            # Phonetic runs (rPh) are not part of the cell text.
            texts = [t.text or "" for t in si.findall(f"{_SS}t")]
            for r in si.findall(f"{_SS}r"):
                texts += [t.text or "" for t in r.findall(f"{_SS}t")]
            shared.append("".join(texts))
    return zf, sheets, shared


def xlsx_cells_raw(paths: Paths, options: Options) -> float:
    book = _load(paths, options["file"], _raw_workbook)
    if book is None:
        return 0.0
    zf, sheets, shared = book
    names = [n for n, _ in sheets]
    if "sheet_names" in options and names != options["sheet_names"]:
        return 0.0
    sheet = options.get("sheet")
    if sheet is None:
        return 1.0
    if sheet not in names:
        return 0.0
    part = dict(sheets)[sheet]
    try:
        cells = _raw_cells(zf, part, shared)
        styles = (
            ET.fromstring(zf.read("xl/styles.xml")) if "xl/styles.xml" in zf.namelist() else None
        )
    except Exception:
        return 0.0
    tol = float(options.get("tol", 1e-6))
    for ref, want in options.get("cells", {}).items():
        got = cells.get(_col_row(ref), (None, 0))[0]
        if isinstance(got, float) and got.is_integer() and isinstance(want, int):
            got = int(got)
        if not _same_value(got, want, tol):
            return 0.0
    need_styles = options.get("percent") or options.get("bold") or options.get("not_bold")
    if need_styles:
        xfs, fmts, fonts = [], {}, []
        if styles is not None:
            cx = styles.find(f"{_SS}cellXfs")
            xfs = list(cx.findall(f"{_SS}xf")) if cx is not None else []
            nf = styles.find(f"{_SS}numFmts")
            for f in nf.findall(f"{_SS}numFmt") if nf is not None else []:
                fmts[int(f.get("numFmtId", "0"))] = f.get("formatCode", "")
            fe = styles.find(f"{_SS}fonts")
            fonts = list(fe.findall(f"{_SS}font")) if fe is not None else []

        def xf(ref: str) -> ET.Element | None:
            s = cells.get(_col_row(ref), (None, 0))[1]
            return xfs[s] if s < len(xfs) else None

        def is_percent(ref: str) -> bool:
            x = xf(ref)
            if x is None:
                return False
            fid = int(x.get("numFmtId", "0"))
            return fid in (9, 10) or "%" in fmts.get(fid, "")

        def is_bold(ref: str) -> bool:
            x = xf(ref)
            if x is None:
                return False
            fi = int(x.get("fontId", "0"))
            if fi >= len(fonts):
                return False
            b = fonts[fi].find(f"{_SS}b")
            return b is not None and b.get("val", "1") not in ("0", "false")

        if not all(is_percent(r) for r in options.get("percent", [])):
            return 0.0
        if not all(is_bold(r) for r in options.get("bold", [])):
            return 0.0
        if any(is_bold(r) for r in options.get("not_bold", [])):
            return 0.0
    return 1.0


# ----------------------------------------------------------------------------------------------
# csv: options file, rows [[cell, ...], ...], delimiter


def _cell_eq(got: str, want: str) -> bool:
    try:
        return math.isclose(float(got), float(want), rel_tol=0, abs_tol=1e-9)
    except ValueError:
        return got == want


def _rows_eq(got: list[list[str]], want: list[list[str]]) -> bool:
    while got and not any(c.strip() for c in got[-1]):
        got = got[:-1]
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=False):
        if len(g) != len(w) or not all(_cell_eq(a, b) for a, b in zip(g, w, strict=False)):
            return False
    return True


def csv_rows(paths: Paths, options: Options) -> float:
    text = _read_text(paths, options["file"], "utf-8-sig")
    if text is None:
        return 0.0
    rows = list(csv.reader(io.StringIO(text), delimiter=options.get("delimiter", ",")))
    return _score(_rows_eq(rows, options["rows"]))


def csv_rows_raw(paths: Paths, options: Options) -> float:
    data = _read(paths, options["file"])
    if data is None:
        return 0.0
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    delim = options.get("delimiter", ",").encode()
    rows = []
    for line in data.split(b"\n"):
        line = line.rstrip(b"\r")
        cells = []
        for cell in line.split(delim) if line else [b""]:
            if len(cell) >= 2 and cell[:1] == b'"' and cell[-1:] == b'"':
                cell = cell[1:-1].replace(b'""', b'"')
            try:
                cells.append(cell.decode("utf-8"))
            except UnicodeDecodeError:
                return 0.0
        rows.append(cells)
    return _score(_rows_eq(rows, options["rows"]))


# ----------------------------------------------------------------------------------------------
# Text documents (docx, odt): the same option vocabulary, judged on a parsed document model
#   paragraphs [..]: the exact list of non-empty body paragraph texts
#   contains [..], absent [..]: substrings of the whole text
#   bold [..]: paragraphs (by exact text) whose every non-blank run is bold
#   not_bold [..]: paragraphs (by exact text) with no bold run
#   styles {text: style name}: paragraph style, compared case- and space-insensitively
#   upper [..]: paragraphs that must read in capitals (typed, or the caps character attribute)
#   cells [[table, row, col, text], ...]: table cells (docx only)


class _Para:
    def __init__(self, text: str, runs: list[tuple[str, bool, bool]], style: str) -> None:
        self.text = text
        self.runs = runs  # (text, bold, caps)
        self.style = style


def _norm_style(name: str) -> str:
    return re.sub(r"[\s_]", "", name).lower()


def _judge_text_doc(paras: list[_Para], cells: list[list[list[str]]], options: Options) -> bool:
    texts = [p.text.strip() for p in paras if p.text.strip()]
    full = "\n".join(texts)
    if "paragraphs" in options and texts != options["paragraphs"]:
        return False
    if not all(s in full for s in options.get("contains", [])):
        return False
    if any(s in full for s in options.get("absent", [])):
        return False
    by_text = {p.text.strip(): p for p in paras}
    for t in options.get("bold", []):
        p = by_text.get(t)
        runs = [r for r in p.runs if r[0].strip()] if p else []
        if not runs or not all(r[1] for r in runs):
            return False
    for t in options.get("not_bold", []):
        p = by_text.get(t)
        if p is None or any(r[1] for r in p.runs if r[0].strip()):
            return False
    for t, style in options.get("styles", {}).items():
        p = by_text.get(t)
        if p is None or _norm_style(p.style) != _norm_style(style):
            return False
    for t in options.get("upper", []):
        ok = False
        for p in paras:
            if p.text.strip() == t:
                ok = True
            elif p.text.strip().upper() == t and p.text.strip() != t:
                runs = [r for r in p.runs if r[0].strip()]
                ok = bool(runs) and all(r[2] or r[0] == r[0].upper() for r in runs)
            if ok:
                break
        if not ok:
            return False
    for ti, r, c, want in options.get("cells", []):
        try:
            if cells[ti][r][c].strip() != want:
                return False
        except IndexError:
            return False
    return True


def docx_text(paths: Paths, options: Options) -> float:
    import docx

    doc = _load(paths, options["file"], docx.Document)
    if doc is None:
        return 0.0
    paras = []
    for para in doc.paragraphs:
        runs = [(r.text, bool(r.bold), bool(r.font.all_caps)) for r in para.runs]
        paras.append(_Para(para.text, runs, para.style.name if para.style is not None else ""))
    cells = [[[c.text for c in row.cells] for row in t.rows] for t in doc.tables]
    return _score(_judge_text_doc(paras, cells, options))


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def _w_on(rpr: ET.Element | None, tag: str) -> bool:
    if rpr is None:
        return False
    el = rpr.find(f"{_W}{tag}")
    return el is not None and el.get(f"{_W}val", "true") not in ("0", "false", "none")


def _w_para(p: ET.Element, style_names: dict[str, str]) -> _Para:
    runs = []
    for r in p.iter(f"{_W}r"):
        text = ""
        for ch in r:
            if ch.tag == f"{_W}t":
                text += ch.text or ""
            elif ch.tag == f"{_W}tab":
                text += "\t"
            elif ch.tag in (f"{_W}br", f"{_W}cr"):
                text += "\n"
        rpr = r.find(f"{_W}rPr")
        runs.append((text, _w_on(rpr, "b"), _w_on(rpr, "caps")))
    ppr = p.find(f"{_W}pPr")
    sid = ""
    if ppr is not None and ppr.find(f"{_W}pStyle") is not None:
        sid = ppr.find(f"{_W}pStyle").get(f"{_W}val", "")
    style = style_names.get(sid, sid) if sid else style_names.get("__default__", "Normal")
    return _Para("".join(r[0] for r in runs), runs, style)


def _raw_document(p: str) -> tuple[ET.Element, dict[str, str]]:
    """word/document.xml and the style names by id (the default paragraph style as __default__)."""
    zf = zipfile.ZipFile(p)
    root = ET.fromstring(zf.read("word/document.xml"))
    style_names: dict[str, str] = {}
    if "word/styles.xml" in zf.namelist():
        for s in ET.fromstring(zf.read("word/styles.xml")).iter(f"{_W}style"):
            name = s.find(f"{_W}name")
            sid = s.get(f"{_W}styleId", "")
            if name is not None:
                style_names[sid] = name.get(f"{_W}val", sid)
                if s.get(f"{_W}type") == "paragraph" and s.get(f"{_W}default") in ("1", "true"):
                    style_names["__default__"] = style_names[sid]
    return root, style_names


def docx_text_raw(paths: Paths, options: Options) -> float:
    document = _load(paths, options["file"], _raw_document)
    if document is None:
        return 0.0
    root, style_names = document
    body = root.find(f"{_W}body")
    if body is None:
        return 0.0
    paras, cells = [], []
    for el in body:
        if el.tag == f"{_W}p":
            paras.append(_w_para(el, style_names))
        elif el.tag == f"{_W}tbl":
            rows = []
            for tr in el.findall(f"{_W}tr"):
                rows.append(
                    [
                        "\n".join(_w_para(q, style_names).text for q in tc.findall(f"{_W}p"))
                        for tc in tr.findall(f"{_W}tc")
                    ]
                )
            cells.append(rows)
    return _score(_judge_text_doc(paras, cells, options))


_ODF_MIME_TEXT = "application/vnd.oasis.opendocument.text"


def _odf_mimetype_ok(p: str, options: Options) -> bool:
    """The package says it is the ODF type the task wants (option `mimetype`, text by default)."""
    with zipfile.ZipFile(p) as zf:
        try:
            return zf.read("mimetype").decode().strip() == options.get("mimetype", _ODF_MIME_TEXT)
        except KeyError:
            return False


def odf_text(paths: Paths, options: Options) -> float:
    """ODF (odt, odp) text through odfpy; options as for text documents plus `mimetype`."""
    from odf import teletype
    from odf import text as odftext
    from odf.opendocument import load

    doc = _load(paths, options["file"], lambda p: load(p) if _odf_mimetype_ok(p, options) else None)
    if doc is None:
        return 0.0
    paras = []
    for el in doc.body.getElementsByType(odftext.P) + doc.body.getElementsByType(odftext.H):
        t = teletype.extractText(el)
        paras.append((el, t))
    # getElementsByType returns P then H; put them back into document order.
    order = {id(e): i for i, e in enumerate(_odf_walk(doc.body))}
    paras.sort(key=lambda pt: order.get(id(pt[0]), 0))
    model = [_Para(t, [(t, False, False)], "") for _, t in paras]
    return _score(_judge_text_doc(model, [], options))


def _odf_walk(node: Any) -> Iterable[Any]:
    for ch in node.childNodes:
        yield ch
        yield from _odf_walk(ch)


_TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"


def _odf_el_text(el: ET.Element) -> str:
    out = [el.text or ""]
    for ch in el:
        if ch.tag == f"{_TEXT}s":
            out.append(" " * int(ch.get(f"{_TEXT}c", "1")))
        elif ch.tag == f"{_TEXT}tab":
            out.append("\t")
        elif ch.tag == f"{_TEXT}line-break":
            out.append("\n")
        elif ch.tag in (f"{_TEXT}p", f"{_TEXT}h"):
            pass  # nested paragraphs are their own entries
        else:
            out.append(_odf_el_text(ch))
        out.append(ch.tail or "")
    return "".join(out)


def odf_text_raw(paths: Paths, options: Options) -> float:
    def content(p: str) -> ET.Element | None:
        if not _odf_mimetype_ok(p, options):
            return None
        with zipfile.ZipFile(p) as zf:
            return ET.fromstring(zf.read("content.xml"))

    root = _load(paths, options["file"], content)
    if root is None:
        return 0.0
    body = root.find("{urn:oasis:names:tc:opendocument:xmlns:office:1.0}body")
    if body is None:
        return 0.0
    paras = [
        _Para(_odf_el_text(el), [], "")
        for el in body.iter()
        if el.tag in (f"{_TEXT}p", f"{_TEXT}h")
    ]
    for q in paras:
        q.runs = [(q.text, False, False)]
    return _score(_judge_text_doc(paras, [], options))


# ----------------------------------------------------------------------------------------------
# pptx: options file, titles [..] (every slide's title, in order: fixes the slide count),
#       slide_contains {"<slide index>": [..]}, absent [..], upper_titles (bool)


def _judge_slides(slides: list[tuple[str, str]], options: Options) -> bool:
    """slides: (title, all text of the slide)."""
    if "titles" in options and [t.strip() for t, _ in slides] != options["titles"]:
        return False
    for idx, wants in options.get("slide_contains", {}).items():
        i = int(idx)
        if i >= len(slides) or not all(w in slides[i][1] for w in wants):
            return False
    everything = "\n".join(s for _, s in slides)
    return not any(a in everything for a in options.get("absent", []))


def pptx_text(paths: Paths, options: Options) -> float:
    from pptx import Presentation

    def slides_of(p: str) -> list[tuple[str, str]]:
        slides = []
        for slide in Presentation(p).slides:
            title = slide.shapes.title
            texts = [s.text_frame.text for s in slide.shapes if s.has_text_frame]
            slides.append((title.text_frame.text if title is not None else "", "\n".join(texts)))
        return slides

    slides = _load(paths, options["file"], slides_of)
    if slides is None:
        return 0.0
    return _score(_judge_slides(slides, options))


_P = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"


def _a_text(el: ET.Element) -> str:
    paras = []
    for ap in el.iter(f"{_A}p"):
        s = ""
        for ch in ap.iter():
            if ch.tag == f"{_A}t":
                s += ch.text or ""
            elif ch.tag == f"{_A}br":
                s += "\v"
        paras.append(s)
    return "\n".join(paras)


def _raw_slides(p: str) -> list[tuple[str, str]]:
    """(title, all text) of every slide, in the order of the presentation's slide list."""
    zf = zipfile.ZipFile(p)
    pres = ET.fromstring(zf.read("ppt/presentation.xml"))
    rels = _rels(zf, "ppt/presentation.xml")
    slides = []
    lst = pres.find(f"{_P}sldIdLst")
    for sid in lst.findall(f"{_P}sldId") if lst is not None else []:
        part = rels[sid.get(f"{_RELNS}id", "")]
        root = ET.fromstring(zf.read(part))
        title, texts = "", []
        for sp in root.iter(f"{_P}sp"):
            tx = sp.find(f"{_P}txBody")
            if tx is None:
                continue
            text = _a_text(tx)
            texts.append(text)
            ph = sp.find(f"{_P}nvSpPr/{_P}nvPr/{_P}ph")
            if ph is not None and ph.get("type") in ("title", "ctrTitle") and not title:
                title = text
        slides.append((title, "\n".join(texts)))
    return slides


def pptx_text_raw(paths: Paths, options: Options) -> float:
    slides = _load(paths, options["file"], _raw_slides)
    if slides is None:
        return 0.0
    return _score(_judge_slides(slides, options))


# ----------------------------------------------------------------------------------------------
# pdf: options docs [{file, pages (int or absent), contains [..], absent [..]}]


def _squash(s: str) -> str:
    # NFKC: PDF text extractors differ on ligatures (pypdf keeps U+FB00 "ff", PyMuPDF expands).
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", s)).strip()


def _judge_pdf(n_pages: int, text: str, doc: Options) -> bool:
    if "pages" in doc and n_pages != doc["pages"]:
        return False
    flat = _squash(text)
    if not all(_squash(c) in flat for c in doc.get("contains", [])):
        return False
    return not any(_squash(a) in flat for a in doc.get("absent", []))


def _judge_pdfs(
    paths: Paths, options: Options, extract: Callable[[bytes], tuple[int, str]]
) -> float:
    """Every document of `docs`, read by `extract(data) -> (page count, text)`."""
    for doc in options["docs"]:
        data = _read(paths, doc["file"])
        if data is None or not data.startswith(b"%PDF"):
            return 0.0
        try:
            n, text = extract(data)
        except Exception:
            return 0.0
        if not _judge_pdf(n, text, doc):
            return 0.0
    return 1.0


def pdf_text(paths: Paths, options: Options) -> float:
    from pypdf import PdfReader

    def extract(data: bytes) -> tuple[int, str]:
        reader = PdfReader(io.BytesIO(data))
        text = "\n".join(pg.extract_text() or "" for pg in reader.pages)
        return len(reader.pages), text

    return _judge_pdfs(paths, options, extract)


def pdf_text_fitz(paths: Paths, options: Options) -> float:
    os.environ.setdefault("PYMUPDF_MESSAGE", "fd:2")
    import pymupdf

    def extract(data: bytes) -> tuple[int, str]:
        with pymupdf.open(stream=data, filetype="pdf") as d:
            return d.page_count, "\n".join(pg.get_text() for pg in d)

    return _judge_pdfs(paths, options, extract)


# ----------------------------------------------------------------------------------------------
# Images: options file, format (PNG|JPEG), width, height, samples [[x, y, r, g, b], ...], tol,
#         gray (bool: every sample must have r == g == b within 3)


def _judge_pixels(get: Any, w: int, h: int, options: Options) -> bool:
    if (w, h) != (options["width"], options["height"]):
        return False
    tol = options.get("tol", 40)
    for x, y, r, g, b in options.get("samples", []):
        px = get(x, y)
        if max(abs(px[0] - r), abs(px[1] - g), abs(px[2] - b)) > tol:
            return False
        if options.get("gray") and max(px[:3]) - min(px[:3]) > 3:
            return False
    return True


def image_pixels(paths: Paths, options: Options) -> float:
    from PIL import Image

    def rgb_of(p: str) -> Image.Image | None:
        with Image.open(p) as im:
            return im.convert("RGB") if im.format == options.get("format", "PNG") else None

    rgb = _load(paths, options["file"], rgb_of)
    if rgb is None:
        return 0.0
    return _score(_judge_pixels(lambda x, y: rgb.getpixel((x, y)), rgb.width, rgb.height, options))


def _png_decode(data: bytes) -> tuple[int, int, list[bytes], int]:
    """Width, height, unfiltered rows and channels of an 8-bit non-interlaced PNG."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG")
    pos, idat, palette = 8, b"", b""
    w = h = depth = ctype = interlace = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"PLTE":
            palette = chunk
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    if depth != 8 or interlace:
        raise ValueError("only 8-bit non-interlaced PNGs are decoded here")
    chans = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(idat)
    stride = w * chans
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        ftype, line = raw[i], bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - chans] if x >= chans else 0
            b = prev[x]
            c = prev[x - chans] if x >= chans else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 255
            elif ftype == 2:
                line[x] = (line[x] + b) & 255
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ftype == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 255
        rows.append(bytes(line))
        prev = line
    if ctype == 3:  # expand the palette to RGB
        rows = [b"".join(palette[3 * k : 3 * k + 3] for k in r) for r in rows]
        chans = 3
    return w, h, rows, chans


def _jpeg_size(data: bytes) -> tuple[int, int]:
    if not data.startswith(b"\xff\xd8"):
        raise ValueError("not a JPEG")
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise ValueError("bad JPEG marker")
        marker = data[pos + 1]
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if marker in (0xC0, 0xC1, 0xC2):
            h, w = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return w, h
        pos += 2 + length
    raise ValueError("no SOF marker")


def image_pixels_raw(paths: Paths, options: Options) -> float:
    """PNG decoded by hand (zlib + filters); JPEG judged on its SOF header (size only)."""
    data = _read(paths, options["file"])
    if data is None:
        return 0.0
    try:
        if options.get("format", "PNG") == "JPEG":
            w, h = _jpeg_size(data)
            return _score((w, h) == (options["width"], options["height"]))
        w, h, rows, chans = _png_decode(data)
    except Exception:
        return 0.0

    def get(x: int, y: int) -> tuple[int, int, int]:
        px = rows[y][x * chans : x * chans + chans]
        return (px[0], px[0], px[0]) if chans <= 2 else (px[0], px[1], px[2])

    return _score(_judge_pixels(get, w, h, options))


# ----------------------------------------------------------------------------------------------
# Plain text: options file, expected (str); text_equals ignores trailing whitespace at the end
# lines_equal: options file, lines [..] (trailing empty lines ignored, \r\n accepted)


def text_equals(paths: Paths, options: Options) -> float:
    text = _read_text(paths, options["file"])
    if text is None:
        return 0.0
    return _score(text.rstrip() == options["expected"])


def text_equals_raw(paths: Paths, options: Options) -> float:
    data = _read(paths, options["file"])
    if data is None:
        return 0.0
    return _score(data.rstrip(b" \t\r\n\v\f") == options["expected"].encode("utf-8"))


def lines_equal(paths: Paths, options: Options) -> float:
    text = _read_text(paths, options["file"])
    if text is None:
        return 0.0
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    return _score(lines == options["lines"])


def lines_equal_raw(paths: Paths, options: Options) -> float:
    data = _read(paths, options["file"])
    if data is None:
        return 0.0
    lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in data.split(b"\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return _score(lines == [ln.encode("utf-8") for ln in options["lines"]])


# ----------------------------------------------------------------------------------------------
# Answers read off the task's own source file: options file (the answer), source (the seeded
# file's dest), source_type (html | xlsx | text), source_sha256, question {kind, ...}. The options
# hold no answer: the checker works it out from the source the agent was given (the hash proves it
# is the seeded one, untouched), so a task's JSON does not give its answer away (issue 36: `forge`
# typed the `expected` of text_equals tasks without solving them). Kinds, over the source's
# first HTML table (rows of cell texts, header first) or the first sheet of a workbook:
#   table_cell {key, column}: the cell `column` (0-based) of the row whose first cell is `key`
#   table_count {column, equals}: how many data rows have that text in `column`
#   table_sum {column}: the sum of `column` over the data rows
#   table_count_above {column, above}: how many data rows hold a number > `above` in `column`
#   heading {}: the text of the first <h1>
#   link {label}: the href of the <a> whose text is `label`
#   line_count {contains}: how many lines of a text source contain `contains`


def _number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _answer_of(
    question: Options,
    table: list[list[Any]],
    heading: str | None,
    links: dict[str, str],
    lines: list[str],
) -> str | None:
    """The answer `question` asks for, from what a parser found in the source (pure)."""
    kind = question.get("kind")
    data = table[1:]
    col = question.get("column", 0)
    try:
        if kind == "table_cell":
            hits = [r[col] for r in data if r and str(r[0]) == question["key"]]
            return None if len(hits) != 1 else _cell_text(hits[0])
        if kind == "table_count":
            return str(sum(_cell_text(r[col]) == question["equals"] for r in data))
        if kind == "table_sum":
            return _number_text(sum(float(r[col]) for r in data))
        if kind == "table_count_above":
            return str(sum(float(r[col]) > question["above"] for r in data))
    except (IndexError, ValueError, TypeError):
        return None
    if kind == "heading":
        return heading
    if kind == "link":
        return links.get(question["label"])
    if kind == "line_count":
        return str(sum(question["contains"] in ln for ln in lines))
    return None


def _cell_text(v: Any) -> str:
    return _number_text(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


class _Page(HTMLParser):
    """First table's cell texts, the first h1's text, link texts -> hrefs (html.parser)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.table: list[list[Any]] = []
        self.heading: str | None = None
        self.links: dict[str, str] = {}
        self._open: list[tuple[str, list[str], str]] = []  # (tag, text parts, href)
        self._tables = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("td", "th", "h1", "a"):
            self._open.append((tag, [], dict(attrs).get("href") or ""))
        elif tag == "table":
            self._tables += 1
        elif tag == "tr" and self._tables == 1:
            self.table.append([])

    def handle_endtag(self, tag: str) -> None:
        if not self._open or self._open[-1][0] != tag:
            return
        _, parts, href = self._open.pop()
        text = "".join(parts).strip()
        if tag in ("td", "th") and self._tables == 1 and self.table:
            self.table[-1].append(text)
        elif tag == "h1" and self.heading is None:
            self.heading = text
        elif tag == "a":
            self.links.setdefault(text, href)
        if self._open:
            self._open[-1][1].append(text)

    def handle_data(self, data: str) -> None:
        if self._open:
            self._open[-1][1].append(data)


def _source(paths: Paths, options: Options) -> bytes | None:
    """The seeded source, or None when it is missing or not the seeded bytes."""
    data = _read(paths, options["source"])
    if data is None or hashlib.sha256(data).hexdigest() != options["source_sha256"]:
        return None
    return data


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()


def answer_from_source(paths: Paths, options: Options) -> float:
    import openpyxl

    text = _read_text(paths, options["file"])
    data = _source(paths, options)
    if text is None or data is None:
        return 0.0
    table: list[list[Any]] = []
    heading, links = None, {}
    if options["source_type"] == "xlsx":
        wb = _load(paths, options["source"], lambda p: openpyxl.load_workbook(p, data_only=True))
        if wb is None:
            return 0.0
        table = [list(r) for r in wb.worksheets[0].iter_rows(values_only=True)]
    elif options["source_type"] == "html":
        page = _Page()
        page.feed(data.decode("utf-8", errors="replace"))
        table, heading, links = page.table, page.heading, page.links
    want = _answer_of(options["question"], table, heading, links, _lines(data))
    return _score(want is not None and text.rstrip() == want)


def _raw_page(html: str) -> tuple[list[list[str]], str | None, dict[str, str]]:
    """The same three things as _Page, by regular expressions over the markup."""
    import html as html_mod

    def text(fragment: str) -> str:
        return html_mod.unescape(re.sub(r"<[^>]*>", "", fragment)).strip()

    table: list[list[str]] = []
    m = re.search(r"<table\b.*?</table>", html, re.S | re.I)
    if m:
        for row in re.findall(r"<tr\b.*?</tr>", m.group(0), re.S | re.I):
            table.append([text(c) for c in re.findall(r"<t[dh]\b[^>]*>(.*?)</t[dh]>", row, re.S)])
    h = re.search(r"<h1\b[^>]*>(.*?)</h1>", html, re.S | re.I)
    links: dict[str, str] = {}
    for href, label in re.findall(r'<a\b[^>]*href="([^"]*)"[^>]*>(.*?)</a>', html, re.S | re.I):
        links.setdefault(text(label), html_mod.unescape(href))
    return table, text(h.group(1)) if h else None, links


def answer_from_source_raw(paths: Paths, options: Options) -> float:
    got = _read(paths, options["file"])
    data = _source(paths, options)
    if got is None or data is None:
        return 0.0
    table: list[list[Any]] = []
    heading, links = None, {}
    if options["source_type"] == "xlsx":
        book = _load(paths, options["source"], _raw_workbook)
        if book is None:
            return 0.0
        zf, sheets, shared = book
        try:
            cells = _raw_cells(zf, sheets[0][1], shared)
        except Exception:
            return 0.0
        n_rows = max((r for _, r in cells), default=0)
        n_cols = max((c for c, _ in cells), default=0)
        table = [
            [cells.get((c, r), (None, 0))[0] for c in range(1, n_cols + 1)]
            for r in range(1, n_rows + 1)
        ]
    elif options["source_type"] == "html":
        table, heading, links = _raw_page(data.decode("utf-8", errors="replace"))
    lines = [ln.decode("utf-8", errors="replace") for ln in data.split(b"\n")]
    want = _answer_of(options["question"], table, heading, links, lines)
    return _score(want is not None and got.rstrip(b" \t\r\n\v\f") == want.encode("utf-8"))


# ----------------------------------------------------------------------------------------------
# Files: options present {dest: sha256}, absent [dest], sizes {dest: n}, blake2b {dest: hex}


def files_state(paths: Paths, options: Options) -> float:
    for dest, want in options.get("present", {}).items():
        data = _read(paths, dest)
        if data is None or hashlib.sha256(data).hexdigest() != want:
            return 0.0
    return _score(all(_file(paths, d) is None for d in options.get("absent", [])))


def files_state_raw(paths: Paths, options: Options) -> float:
    """Same state by another route: stat sizes first, then a streamed BLAKE2b."""
    for dest, want in options.get("blake2b", {}).items():
        p = _file(paths, dest)
        if p is None or os.stat(p).st_size != options["sizes"][dest]:
            return 0.0
        h = hashlib.blake2b()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(65536), b""):
                h.update(block)
        if h.hexdigest() != want:
            return 0.0
    for d in options.get("absent", []):
        p = paths.get(d)
        if p is not None and os.path.lexists(p):
            return 0.0
    return 1.0


CHECKS = {
    f.__name__: f
    for f in (
        xlsx_cells,
        xlsx_cells_raw,
        csv_rows,
        csv_rows_raw,
        docx_text,
        docx_text_raw,
        odf_text,
        odf_text_raw,
        pptx_text,
        pptx_text_raw,
        pdf_text,
        pdf_text_fitz,
        image_pixels,
        image_pixels_raw,
        text_equals,
        text_equals_raw,
        lines_equal,
        lines_equal_raw,
        answer_from_source,
        answer_from_source_raw,
        files_state,
        files_state_raw,
    )
}


# ----------------------------------------------------------------------------------------------
# Reference semantics of the scope manifest (the daemon's audit implements the same rule).


def path_allowed(path: str, allow: list[str]) -> bool:
    """Globs match absolute paths with fnmatch rules: `*` also crosses `/`."""
    return any(fnmatch.fnmatchcase(path, g) for g in allow)


def scope_violations(scope: Options, current: dict[str, str | None]) -> list[str]:
    """Paths under the roots that changed and are not allowed.

    `current` maps every file path under the roots that exists now, or that was seeded, to its
    sha256 (None when it no longer exists). A file counts as changed when it was seeded and its
    hash differs (or it is gone), or when it was not seeded and exists now (files that come from
    the desktop image and are unchanged are not listed by an upper-layer scan).
    """
    roots = [r.rstrip("/") + "/" for r in scope["roots"]]
    seeded = scope["seeded"]
    out = []
    for path in sorted(set(current) | set(seeded)):
        if not any(path.startswith(r) for r in roots):
            continue
        now = current.get(path)
        changed = (now != seeded[path]) if path in seeded else now is not None
        if changed and not path_allowed(path, scope["allow"]):
            out.append(path)
    return out
