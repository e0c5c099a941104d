"""Fixtures: a running `drumsd serve` (in-memory runtime)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from drumsd_process import Daemon, make_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path).start()
    try:
        yield d
    finally:
        d.stop()
