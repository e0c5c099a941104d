"""Session fixtures: one real daemon with the Linux runtime for every live API test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_daemon import Daemon, start_live_daemon, stop_and_clean


@pytest.fixture(scope="session")
def live_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = Path(tmp_path_factory.mktemp("live-drumsd"))
    daemon = start_live_daemon(tmp)
    try:
        yield daemon
    finally:
        # Destroys what tests left, stops the daemon and unmounts what its runtime leaves mounted
        # (a bare stop left a spare's mounts under pytest's tmp, and every later rm_rf warned).
        stop_and_clean(daemon, tmp)
