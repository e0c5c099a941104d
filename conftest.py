"""Test tiers as markers, applied by directory (see the README's fast-tier command):

live         tests/live, and tests marked live elsewhere: real daemon, CRIU, desktops (root)
integration  tests/integration, tests/nix: real processes (drumsd serve, fuzzers, nix eval)
unit         everything else: one layer in process, fakes only at its edge
slow         marked by hand on the few long ones (the OpenAPI fuzzer, the task-set build)
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).parent
BY_DIRECTORY = {
    ROOT / "tests" / "live": "live",
    ROOT / "tests" / "integration": "integration",
    ROOT / "tests" / "nix": "integration",
}


def tier_of(path: Path) -> str:
    for directory, tier in BY_DIRECTORY.items():
        if path.is_relative_to(directory):
            return tier
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(Path(str(item.path)))
        if tier == "unit" and item.get_closest_marker("live") is not None:
            continue  # a live test outside tests/live (e.g. the guest on a real desktop)
        item.add_marker(getattr(pytest.mark, tier))
