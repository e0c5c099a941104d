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
