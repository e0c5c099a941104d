"""The daemon's version is written once (drumsd/pyproject.toml) and read from package metadata."""

from __future__ import annotations

import tomllib
from pathlib import Path

from drumsd.version import VERSION

PKG = Path(__file__).resolve().parents[1]


def test_the_version_is_the_packages_metadata() -> None:
    project = tomllib.loads((PKG / "pyproject.toml").read_text())["project"]
    assert VERSION == project["version"]


def test_no_module_writes_the_version_again() -> None:
    quoted = (f'"{VERSION}"', f"'{VERSION}'")
    repeats = [
        str(path.relative_to(PKG))
        for path in (PKG / "src" / "drumsd").rglob("*.py")
        if any(q in path.read_text() for q in quoted)
    ]
    assert not repeats, f"{repeats} write the version {VERSION}: import drumsd.version.VERSION"
