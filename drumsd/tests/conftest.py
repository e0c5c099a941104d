"""drumsd's in-process tests run many trio runs in one interpreter: collect garbage after each, so
an async generator a test left behind (an abandoned supervisor, a destroy cut at its deadline) is
finalized between runs, not inside the next test's trio run, where trio's finalizer breaks that
run (TrioInternalError in asyncgens.finalize_remaining, seen in CI).

Fixtures over tests/harness.py: `api` (the API in process) and `autojump_clock` (virtual time)."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio.testing
from harness import Api, open_api


@pytest.fixture(autouse=True)
def _collect_between_trio_runs() -> Iterator[None]:
    yield
    gc.collect()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with open_api(tmp_path) as a:
        yield a


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """pytest-trio's MockClock, jumping only after 50 ms of real idleness: with a threshold of 0
    it also ran while a worker thread (the sampler, the journal writer) worked, so on a loaded
    host virtual time ran through every limit between two of a service's iterations. A test
    that takes this fixture runs on it (its sleeps and limits are virtual)."""
    return trio.testing.MockClock(autojump_threshold=0.05)
