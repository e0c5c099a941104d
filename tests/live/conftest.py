"""Session fixtures: one real daemon with the Linux runtime for every live API test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_daemon import Daemon, start_live_daemon


@pytest.fixture(scope="session")
def live_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = start_live_daemon(Path(tmp_path_factory.mktemp("live-drumsd")))
    try:
        yield daemon
    finally:
        daemon.stop(limit_s=60)
