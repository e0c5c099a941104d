"""Test tiers as markers, applied by directory (see the README's fast-tier command):

live         tests/live, and tests marked live elsewhere: real daemon, CRIU, desktops (root)
integration  tests/integration, tests/nix: real processes (drumsd serve, fuzzers, nix eval)
unit         everything else: one layer in process, fakes only at its edge (a test that runs
             real apps or a trainer in a subprocess marks itself integration)
slow         marked by hand on the few long ones (the OpenAPI fuzzer, the task-set build)
"""

from __future__ import annotations

import gc
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent
BY_DIRECTORY = {
    ROOT / "tests" / "live": "live",
    ROOT / "tests" / "integration": "integration",
    ROOT / "tests" / "nix": "integration",
}


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal gives it. A run started as a background job of a non-interactive
    shell (`bash scripts/test.sh &`) inherits SIGINT ignored, so Python installs no
    KeyboardInterrupt handler and the processes the tests start inherit the ignore: every
    Ctrl-C test (the SDK's cleanup, the RL loop's) would fail for the way it was launched. A
    Python handler is reset to the default on exec, so the children get it back too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def tier_of(path: Path) -> str:
    for directory, tier in BY_DIRECTORY.items():
        if path.is_relative_to(directory):
            return tier
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(Path(str(item.path)))
        if tier == "unit" and any(
            item.get_closest_marker(m) is not None for m in ("live", "integration")
        ):
            continue  # e.g. the guest on a real desktop, a trainer run in its own venv
        item.add_marker(getattr(pytest.mark, tier))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (every imported module, ~600k objects) out of the garbage
    collector's reach: drumsd's tests collect garbage after each test (drumsd/tests/conftest.py),
    and a full collection over those objects cost ~0.4 s of CPU per test, most of the fast
    tier's time. Frozen, a collection scans only what the tests made since."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failing test's report carries the log tail of every test daemon that exited on its own
    (tests/integration/drumsd_process.py): the cause, where a client only sees a refused port."""
    outcome = yield
    report = outcome.get_result()
    process = sys.modules.get("drumsd_process")
    if not report.failed or process is None:
        return
    for daemon in process.Daemon.started:
        if daemon.died():
            kept = process.keep_log(daemon)
            tail = daemon.log()[-6000:]
            report.sections.append(
                (f"drumsd {daemon.url} exited {daemon.proc.returncode} (log kept: {kept})", tail)
            )
            daemon.stopped = True  # reported once, with the first test that failed after it
