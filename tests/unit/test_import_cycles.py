"""scripts/import_cycles.py: the cycles it finds in a made-up package, what it leaves out
(imports under TYPE_CHECKING, unless --types) and its exit status against --max."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts/import_cycles.py"
spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
assert spec is not None and spec.loader is not None
ic = importlib.util.module_from_spec(spec)
sys.modules["import_cycles"] = ic
spec.loader.exec_module(ic)

FILES = {
    "pkg/__init__.py": "",
    # a <-> b at run time, one of them through a deferred (function-level) import
    "pkg/a.py": "from pkg import b\n",
    "pkg/b.py": "def f():\n    from . import a\n",
    # c -> d -> e -> c, the last only for types
    "pkg/c.py": "import pkg.d\n",
    "pkg/d.py": "from .e import thing\n",
    "pkg/e.py": (
        "from typing import TYPE_CHECKING\nthing = 1\nif TYPE_CHECKING:\n    from pkg.c import C\n"
    ),
    # a subpackage importing two siblings in one statement, one of which imports it back
    "pkg/sub/__init__.py": "from .. import f, g\n",
    "pkg/f.py": "import pkg.sub\n",
    "pkg/g.py": "",
}


@pytest.fixture
def package(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path / "pkg"


def test_cycles_of_imports_that_run(package: Path) -> None:
    found = ic.cycles(ic.graph(package))
    assert found == [["pkg.a", "pkg.b"], ["pkg.f", "pkg.sub"]]


def test_type_only_imports_join_with_types(package: Path) -> None:
    found = ic.cycles(ic.graph(package, types=True))
    assert found == [["pkg.c", "pkg.d", "pkg.e"], ["pkg.a", "pkg.b"], ["pkg.f", "pkg.sub"]]


def test_max_is_the_exit_status(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ic.main([str(package), "--max", "2"]) == 0
    assert ic.main([str(package), "--types", "--max", "2"]) == 1
    out = capsys.readouterr()
    assert "cycle of 3: pkg.c, pkg.d, pkg.e" in out.out
    assert "a cycle of 3 modules" in out.err and "over the bound of 2" in out.err
    assert ic.main([str(package), "--types", "--max", "3"]) == 0


def test_a_directory_that_is_no_package_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        ic.main([str(tmp_path)])
    assert exc.value.code == 2
