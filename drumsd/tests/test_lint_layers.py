"""The layer contract over the whole daemon (pyproject's [tool.importlinter], issue 31) fails on
a deliberate violation of each kind: an upward import, the guest importing the daemon, the daemon
importing the benches, a new top-level module given no layer. Run with `lint-imports` on a copy of
drumsd/src under a copy of the project's config, so the real tree is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

# module (relative to drumsd/src/drumsd) -> what it imports; each against the contract.
VIOLATIONS = {
    "tasks/upward_probe.py": "drumsd.serve",  # tasks below serve (was tasks/coverage.py)
    "linux/upward_probe.py": "drumsd.tasks.apps",  # linux below tasks (was linux/image.py)
    "core/upward_probe.py": "drumsd.runtime.supervisor",  # core below everything but guest
    "guest/daemon_probe.py": "drumsd.core.config",  # the guest runs in the desktop: stdlib only
    "runtime/bench_probe.py": "drumsd.bench.runtime",  # the daemon never imports its benches
}


def lint_imports() -> str:
    found = Path(sys.executable).parent / "lint-imports"
    path = str(found) if found.exists() else shutil.which("lint-imports")
    if path is None:
        pytest.fail("lint-imports is not installed: import-linter is in the dev group")
    return path


def run_contracts(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "drumsd/src")}  # the copy, not the install
    return subprocess.run(
        [lint_imports(), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        ROOT / "drumsd/src/drumsd",
        tmp_path / "drumsd/src/drumsd",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return tmp_path


def test_the_copy_keeps_the_contracts(tree: Path) -> None:
    out = run_contracts(tree)
    assert out.returncode == 0, out.stdout + out.stderr


def test_each_kind_of_violation_breaks_the_layer_contract(tree: Path) -> None:
    package = tree / "drumsd/src/drumsd"
    for module, target in VIOLATIONS.items():
        (package / module).write_text(f"import {target}  # deliberate: expects a refusal\n")
    (package / "unplaced.py").write_text('"""A new top-level module with no layer."""\n')
    out = run_contracts(tree)
    report = out.stdout + out.stderr
    assert out.returncode != 0, report
    assert "guest < core < linux < tasks < runtime < api < serve, bench < cli BROKEN" in report
    for module, target in VIOLATIONS.items():
        source = "drumsd." + module.removesuffix(".py").replace("/", ".")
        assert f"{source} -> {target}" in report, (source, target, report)
    assert "drumsd.unplaced" in report, report
