"""drumsd's in-process tests run many trio runs in one interpreter: collect garbage after each, so
an async generator a test left behind (an abandoned supervisor, a destroy cut at its deadline) is
finalized between runs, not inside the next test's trio run, where trio's finalizer breaks that
run (TrioInternalError in asyncgens.finalize_remaining, seen in CI)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _collect_between_trio_runs() -> Iterator[None]:
    yield
    gc.collect()
