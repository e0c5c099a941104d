"""docs/runtime.md's table of the design's fields and routes is what the code says today, every
row not built has a reason, and the lists match the design document where it is present."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from drumsd.api.design_table import DOCUMENTED_FIELDS, DOCUMENTED_ROUTES, render, rows

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "runtime.md"
DESIGN = ROOT.parent / "shared" / "DESIGN.md"


def test_the_docs_table_is_rendered_from_the_code() -> None:
    text = DOC.read_text()
    table = text.split("<!-- design-table:start -->\n", 1)[1].split("<!-- design-table:end -->")[0]
    assert table == render(), (
        "docs/runtime.md's design table is stale: regenerate it with "
        "`python -c 'from drumsd.api.design_table import render; print(render())'`"
    )


def test_no_row_is_missing_without_a_reason() -> None:
    bare = [row.what for row in rows() if row.status == "missing"]
    assert not bare, f"documented and missing, with no reason: {bare}"


def test_a_field_the_model_drops_shows_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from drumsd.api import design_table

    monkeypatch.setattr(design_table, "_model_has", lambda model, key: False)
    assert design_table.field_status("listen") == "missing"


def test_the_lists_are_the_design_documents() -> None:
    if not DESIGN.is_file():
        pytest.skip(f"the design document is not at {DESIGN} (a clone without ../shared)")
    text = DESIGN.read_text()
    config = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    for key in DOCUMENTED_FIELDS[: DOCUMENTED_FIELDS.index("tasks") + 1]:
        assert re.search(f"`{re.escape(key.rpartition('.')[2])}[`: ]", config), key
    api = text.split("## The daemon's API", 1)[1].split("\n## ", 1)[0]
    assert documented_routes(api) == set(DOCUMENTED_ROUTES)


def documented_routes(api: str) -> set[str]:
    """`GET/POST /v1/x`, `GET/DELETE /v1/x/{id}` and `POST /v1/y`, `.../release` cells."""
    found: set[str] = set()
    for cell in re.findall(r"^\| (`[^|]+`) \|", api, re.M):
        methods, path = "", ""
        for part in re.findall(r"`([^`]+)`", cell):
            if part.startswith("..."):
                path = path.rsplit("/", 1)[0] + part[3:]
            else:
                methods, _, path = part.partition(" ")
            found |= {f"{m} {path}" for m in methods.split("/")}
    return found


def test_the_route_reader_reads_the_design_s_shapes() -> None:
    api = "| `GET/POST /v1/c`, `DELETE /v1/c/{id}` | x |\n| `POST /v1/s/{id}/q`, `.../r` | y |\n"
    assert documented_routes(api) == {
        "GET /v1/c",
        "POST /v1/c",
        "DELETE /v1/c/{id}",
        "POST /v1/s/{id}/q",
        "POST /v1/s/{id}/r",
    }
