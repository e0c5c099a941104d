"""Shared fixtures: one small build per test session (every family, a few tasks each)."""

from __future__ import annotations

from pathlib import Path

import pytest
from drums_tasks.build import build

SMALL_PER_FAMILY = 3


@pytest.fixture(scope="session")
def small_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("build-a")
    build(7, out, per_family=SMALL_PER_FAMILY, log=lambda _m: None)
    return out


@pytest.fixture(scope="session")
def small_per_family() -> int:
    return SMALL_PER_FAMILY


# Checker libraries that the daemon's checker venv has but a dev venv may lack (the workspace
# lock must list them: see taskfactory/pyproject.toml). A test needing one skips naming it.
CHECK_MODULES = {
    "pdf_text": ["pypdf", "pymupdf"],  # pymupdf also writes the simulated PDFs
    "pdf_text_fitz": ["pymupdf"],
    "odf_text": ["odf"],
}


def _require_check_libs(*checks: str) -> None:
    for check in checks:
        for module in CHECK_MODULES.get(check, []):
            pytest.importorskip(
                module, reason=f"{module} missing: run `uv sync --all-packages` (checker {check})"
            )


@pytest.fixture
def require_check_libs():
    """Call with checker names; skips the test when their libraries are not installed."""
    return _require_check_libs
