"""The trainer compatibility matrix in docs/verifiers.md: the table is the rendering of
docs/trainer-matrix.json (scripts/render_trainer_matrix.py), whose results the tests wrote
(matrix_results.py); each verl / SkyRL row names the versions scripts/trainers/*.txt pins (a pin
that moves fails here until the row's checks are rerun and the results taken in) and checks that
exist."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = json.loads((REPO / "docs" / "trainer-matrix.json").read_text())
TESTS = Path(__file__).parent
# trainer name in the table -> its requirement list
PINS = {"verl": "verl.txt", "SkyRL (skyrl-train)": "skyrl.txt", "SkyRL (skyrl)": "skyrl-vlm.txt"}
sys.path.insert(0, str(REPO / "scripts"))
import render_trainer_matrix as renderer  # noqa: E402


def pinned(reqs: str, package: str) -> str:
    for line in (REPO / "scripts" / "trainers" / reqs).read_text().splitlines():
        match = re.fullmatch(rf"{re.escape(package)}==(\S+)", line.strip())
        if match:
            return match.group(1)
    raise AssertionError(f"{package} is not pinned with == in scripts/trainers/{reqs}")


def test_the_docs_table_is_the_rendering_of_the_recorded_results():
    table = renderer.docs_table((REPO / "docs" / "verifiers.md").read_text())
    assert table == renderer.render(SPEC), "run scripts/render_trainer_matrix.py"


def test_the_renderer_takes_a_run_and_keeps_a_pass_over_a_later_skip(tmp_path: Path):
    spec = {"rows": [{"trainer": "t", "version": "", "packages": ["verl"], "path": "p",
                      "runs": "r", "checks": ["a_check.py::test_a"], "note": ""}],
            "results": {}}  # fmt: skip
    result = {"check": "a_check.py::test_a", "mode": "fake", "outcome": "passed",
              "date": "2026-12-06", "seconds": 2.5, "versions": {"verl": "9.9"},
              "facts": {"result": {"advantages": [0.0]}}}  # fmt: skip
    (tmp_path / "a.fake.json").write_text(json.dumps(result))
    assert renderer.fold(spec, tmp_path) == 1
    (tmp_path / "a.fake.json").write_text(json.dumps({**result, "outcome": "skipped"}))
    assert renderer.fold(spec, tmp_path) == 0
    row = renderer.render(spec).splitlines()[2]
    assert row == ("| t | verl 9.9 | p | r | `a_check.py::test_a`: passed 2026-12-06, 2.5 s "
                   '(result: {"advantages": [0.0]}) |')  # fmt: skip


@pytest.mark.parametrize("trainer", list(PINS))
def test_verl_and_skyrl_rows_name_the_pinned_versions_and_existing_checks(trainer: str):
    rows = [row for row in SPEC["rows"] if row["trainer"] == trainer]
    assert rows, f"{trainer} has no row"
    for row in rows:
        for check in row["checks"]:
            file, _, test = check.partition(" [")[0].partition("::")
            name = test.partition("[")[0]
            assert f"def {name}(" in (TESTS / file).read_text(), f"{check} does not exist"
            result = SPEC["results"].get(renderer.result_key(check))
            if result is None or result["outcome"] == "skipped":
                continue  # a live row not run here: the table says so
            for package in row["packages"]:
                want = pinned(PINS[trainer], package)
                have = result["versions"].get(package)
                assert have == want, f"{check} ran with {package} {have}, the pin is {want}"
