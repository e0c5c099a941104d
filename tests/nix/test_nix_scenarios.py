"""The NixOS VM tests' scenario modules, run against a real `drumsd serve` on this machine
through the local stand-in for `machine` (vm-tests/local_machine.py).

daemon_token and crash_recovery need no desktop: they always run on the in-memory runtime. Every
scenario also runs on the Linux runtime (real CRIU-restored desktops) under DRUMS_LIVE=1, as CI
sets it: there a host without the runtime fails those tests; without DRUMS_LIVE=1 they skip.
On the Linux runtime (~20-27 s each) CI takes two of the five a day, in turn (each every third
day at least); DRUMS_NIX_SCENARIOS_ALL=1 runs all five.
"""

from __future__ import annotations

import datetime
import importlib
import os
from pathlib import Path

import pytest
from harness import day_sample
from nix_support import open_local_daemon, require_live_runtime


def run_scenario(name: str, tmp_path: Path, live: bool) -> None:
    from drums_http import plain_subtest

    scenario = importlib.import_module(name)
    with open_local_daemon(tmp_path, live) as daemon:
        try:
            scenario.run(daemon.machine, daemon.target, plain_subtest)
        except BaseException:
            print(f"--- drumsd log ({daemon.log_path}) ---\n{daemon.log_tail()}")
            raise


@pytest.mark.parametrize("scenario", ["daemon_token", "crash_recovery"])
def test_scenario_on_the_memory_runtime(scenario: str, tmp_path: Path) -> None:
    run_scenario(scenario, tmp_path, live=False)


LIVE_SCENARIOS = ("daemon_token", "crash_recovery", "episode", "fork_isolation", "gate_quarantine")
LIVE_PER_DAY = 2


def live_sample(day: int) -> set[str]:
    """The scenarios CI runs on the Linux runtime on `day` (an ordinal): LIVE_PER_DAY in turn."""
    return set(day_sample(LIVE_SCENARIOS, LIVE_PER_DAY, day))


def test_the_live_sample_takes_every_scenario_within_three_days() -> None:
    day = datetime.date(2026, 12, 6).toordinal()
    seen = set().union(*(live_sample(day + k) for k in range(3)))
    assert seen == set(LIVE_SCENARIOS)
    assert all(len(live_sample(day + k)) == LIVE_PER_DAY for k in range(5))


@pytest.mark.live
@pytest.mark.parametrize("scenario", LIVE_SCENARIOS)
def test_scenario_on_the_linux_runtime(scenario: str, tmp_path: Path) -> None:
    require_live_runtime()
    everything = os.environ.get("DRUMS_NIX_SCENARIOS_ALL") == "1"
    if not everything and scenario not in live_sample(datetime.date.today().toordinal()):
        pytest.skip(
            f"{scenario} on the Linux runtime is not in CI's sample today (2 of 5 a day, in turn): "
            "DRUMS_NIX_SCENARIOS_ALL=1 runs all five"
        )
    run_scenario(scenario, tmp_path, live=True)
