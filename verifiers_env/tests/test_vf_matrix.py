"""The trainer compatibility matrix in docs/verifiers.md, checked against what the tests run: each
verl / SkyRL row names the versions scripts/trainers/*.txt pins (a pin that moves fails here until
the row is rerun and updated) and the checks it ran, which must exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "verifiers.md"
TESTS = Path(__file__).parent
# trainer name in the table -> (its requirement list, the packages whose pins the row names)
PINS = {
    "verl": ("verl.txt", ("verl", "transferqueue")),
    "SkyRL (skyrl-train)": ("skyrl.txt", ("skyrl-train", "skyrl-gym")),
    "SkyRL (skyrl)": ("skyrl-vlm.txt", ("skyrl", "skyrl-gym")),
}


def matrix_rows() -> list[list[str]]:
    text = DOC.read_text()
    start = text.index("## Compatibility matrix")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        if line.startswith("| ") and not line.startswith("| trainer") and "---" not in line:
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def pinned(reqs: str, package: str) -> str:
    for line in (REPO / "scripts" / "trainers" / reqs).read_text().splitlines():
        match = re.fullmatch(rf"{re.escape(package)}==(\S+)", line.strip())
        if match:
            return match.group(1)
    raise AssertionError(f"{package} is not pinned with == in scripts/trainers/{reqs}")


def test_verl_and_skyrl_rows_name_the_pinned_versions_and_existing_checks():
    rows = [row for row in matrix_rows() if row[0] in PINS]
    assert {row[0] for row in rows} == set(PINS), "a verl/SkyRL trainer has no row"
    for trainer, version, path, runs, result in rows:
        reqs, packages = PINS[trainer]
        for package in packages:
            assert f"{package} {pinned(reqs, package)}" in version, (trainer, package, version)
        checks = re.findall(r"`(\w+\.py)::(\w+)`", runs)
        assert checks, f"the {trainer} row ({path}) names no check"
        for file, test in checks:
            assert f"def {test}(" in (TESTS / file).read_text(), f"{file}::{test} does not exist"
        assert result, f"the {trainer} row ({path}) has no result"
