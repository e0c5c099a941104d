"""ruff's SLF001 holds the daemon's modules to each other's public names (issue 31): a module of
drumsd/src that reaches into another object's private member fails `ruff check`, while tests may
still look inside what they test. Run on a temp tree under a copy of the project's ruff config."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
REACHING_IN = "def save(sup):\n    sup._save_slot(None, 'created')\n"


def ruff() -> str:
    found = Path(sys.executable).parent / "ruff"
    path = str(found) if found.exists() else shutil.which("ruff")
    if path is None:
        pytest.fail("ruff is not installed: it is in the dev group (uv sync --group dev)")
    return path


def violations(tree: Path) -> dict[str, list[str]]:
    """Rule codes ruff reports per file (relative path) under the project's config."""
    out = subprocess.run(
        [ruff(), "check", "--no-cache", "--output-format", "json", "--exit-zero", "."],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, list[str]] = {}
    for v in json.loads(out.stdout):
        found.setdefault(str(Path(v["filename"]).relative_to(tree)), []).append(v["code"])
    return found


def test_a_daemon_module_reaching_into_a_private_member_fails(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    module = tmp_path / "drumsd/src/drumsd/runtime/ops_new.py"
    test = tmp_path / "drumsd/tests/test_ops_new.py"
    for path in (module, test):
        path.parent.mkdir(parents=True)
        path.write_text(REACHING_IN)
    found = violations(tmp_path)
    assert found.get("drumsd/src/drumsd/runtime/ops_new.py") == ["SLF001"], found
    assert "drumsd/tests/test_ops_new.py" not in found, found


def test_the_daemon_has_no_private_access_across_modules() -> None:
    out = subprocess.run(
        [ruff(), "check", "--no-cache", "--select", "SLF001", "drumsd/src"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
