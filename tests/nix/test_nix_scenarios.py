"""The NixOS VM tests' scenario modules, run against a real `drumsd serve` on this machine
through the local stand-in for `machine` (vm-tests/local_machine.py).

daemon_token and crash_recovery need no desktop: they always run on the in-memory runtime. Every
scenario also runs on the Linux runtime (real CRIU-restored desktops) under DRUMS_LIVE=1, as CI
sets it: there a host without the runtime fails those tests; without DRUMS_LIVE=1 they skip.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
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


@pytest.mark.live
@pytest.mark.parametrize(
    "scenario", ["daemon_token", "crash_recovery", "episode", "fork_isolation", "gate_quarantine"]
)
def test_scenario_on_the_linux_runtime(scenario: str, tmp_path: Path) -> None:
    require_live_runtime()
    run_scenario(scenario, tmp_path, live=True)
