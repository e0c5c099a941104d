"""The real apps, without a desktop: solutions made of shell commands (terminal, LibreOffice's
headless converter, GIMP batch, Chromium headless) run here under a temp dir standing for
/home/user, and files that the GUI oracles leave behind are re-saved by LibreOffice itself, so
the checkers are proven on what the apps write, not only on what our writers write.

Each test skips when its app is not installed on this host (the desktop image has them all).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from drums_tasks import FAMILIES, load_all
from drums_tasks.build import generate
from drums_tasks.offline import final_state
from drums_tasks.spec import Solution, TaskSpec, scope_probe, task_json
from drums_tasks.verifier import CHECKS, scope_violations
from harness import day_sample

load_all()
HOME = "/home/user"
APPS = {
    "soffice": shutil.which("soffice"),
    "gimp": shutil.which("gimp"),
    "chromium": shutil.which("chromium"),
}


class NeedsGui(Exception):
    """The solution has GUI input this local runner cannot replay."""


def _remap(obj: Any, root: str) -> Any:
    if isinstance(obj, str):
        return obj.replace(HOME, root)
    if isinstance(obj, list):
        return [_remap(x, root) for x in obj]
    return obj


def _needs(argv: list[str]) -> None:
    app = Path(argv[0]).name
    if app in APPS and APPS[app] is None:
        pytest.skip(f"{app} is not installed on this host")


def _run(argv: list[str]) -> None:
    # A private LibreOffice profile per test process keeps parallel converters apart.
    env = {**os.environ, "PYMUPDF_MESSAGE": "fd:2"}
    subprocess.run(argv, check=False, timeout=300, env=env, capture_output=True)


def replayable(sol: Solution) -> bool:
    """Only shell-level actions: execute, wait, and commands typed into the xterm."""
    terminal = any(
        isinstance(a, dict) and "--class xterm" in str(a.get("command")) for a in sol.actions
    )
    return all(
        isinstance(a, dict)
        or (terminal and ("pyautogui.write(" in a or "pyautogui.press('enter'" in a))
        for a in sol.actions
    )


def replay(sol: Solution, root: str) -> None:
    """Run a solution's shell-level actions with /home/user mapped to `root`."""
    if not replayable(sol):
        raise NeedsGui(sol.name)
    typed: str | None = None
    for a in sol.actions:
        if isinstance(a, dict):
            if a["type"] == "wait":
                continue
            argv = _remap(a["command"], root)
            if argv[:2] == ["sh", "-c"] and "xdotool" in argv[2]:
                continue  # window activation: nothing to activate here
            _needs(argv)
            _run(argv)
            continue
        if "pyautogui.write(" in a:
            typed = ast.literal_eval(a.split("pyautogui.write(", 1)[1].rsplit(", interval", 1)[0])
        elif "pyautogui.press('enter'" in a and typed is not None:
            _run(["sh", "-c", _remap(typed, root)])
            typed = None
        else:
            raise NeedsGui(a[:60])


def seed(spec: TaskSpec, root: Path) -> None:
    for d in spec.dirs:
        (root / d[len(HOME) + 1 :]).mkdir(parents=True, exist_ok=True)
    for p, data in spec.files.items():
        local = root / p[len(HOME) + 1 :]
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)


def judge_local(spec: TaskSpec, root: Path, seeded: dict[str, str]) -> tuple[float, float, list]:
    paths = {}
    for vm, dest in spec.results:
        local = root / vm[len(HOME) + 1 :]
        paths[dest] = str(local) if local.is_file() else None
    score = CHECKS[spec.check](paths, spec.options)
    alt = CHECKS[spec.check_alt](paths, spec.options)
    current = {}
    for r in spec.roots:
        base = root / r[len(HOME) + 1 :]
        for p in base.rglob("*") if base.exists() else []:
            if p.is_file():
                vm = HOME + "/" + p.relative_to(root).as_posix()
                current[vm] = hashlib.sha256(p.read_bytes()).hexdigest()
    scope = {"roots": spec.roots, "seeded": seeded, "allow": spec.allow}
    return score, alt, scope_violations(scope, current)


SHELL_FAMILIES = sorted(n for n in FAMILIES if replayable(generate(21, n, 0)[1].oracle))

# The families whose solutions start a slow app (a GIMP batch ~2.5 s a start, ~12 s a family's
# branches; a LibreOffice conversion ~6 s a family) run in CI a few a day in turn; the rest of
# them, and every other family (shell and Chromium: under 5 s), run every day.
# DRUMS_TASK_APPS_ALL=1 runs every family.
APP_PER_DAY = {"gimp": 2, "soffice": 2}
EVERY_FAMILY = os.environ.get("DRUMS_TASK_APPS_ALL") == "1"


@functools.cache
def slow_app(family: str) -> str | None:
    """The APP_PER_DAY app the family's oracle runs, if any."""
    for a in generate(21, family, 0)[1].oracle.actions:
        if isinstance(a, dict) and a["type"] != "wait":
            name = Path(a["command"][0]).name
            if name in APP_PER_DAY:
                return name
    return None


@functools.cache
def sampled_today() -> frozenset[str]:
    """The slow-app families CI runs today: APP_PER_DAY of each app, in turn."""
    picked: set[str] = set()
    for app, per_day in APP_PER_DAY.items():
        picked |= set(day_sample([f for f in SHELL_FAMILIES if slow_app(f) == app], per_day))
    return frozenset(picked)


def test_the_daily_sample_covers_every_slow_family_within_four_days() -> None:
    import datetime

    day = datetime.date(2026, 12, 7).toordinal()
    slow = {f for f in SHELL_FAMILIES if slow_app(f) is not None}
    seen: set[str] = set()
    for k in range(4):
        today = set()
        for app, per_day in APP_PER_DAY.items():
            mine = [f for f in SHELL_FAMILIES if slow_app(f) == app]
            today |= set(day_sample(mine, per_day, day + k))
        assert len(today) == sum(APP_PER_DAY.values())
        seen |= today
    assert seen == slow and len(slow) >= 10


@pytest.mark.parametrize("family", SHELL_FAMILIES)
def test_shell_solutions_really_run(family: str, tmp_path: Path, require_check_libs) -> None:
    app = slow_app(family)
    if app is not None and not EVERY_FAMILY and family not in sampled_today():
        pytest.skip(
            f"{family} ({app}) is not in CI's sample today ({APP_PER_DAY[app]} {app} families a "
            "day, in turn): DRUMS_TASK_APPS_ALL=1 runs every family"
        )
    tid, spec = generate(21, family, 0)
    require_check_libs(spec.check, spec.check_alt)
    seeded = task_json(spec, tid, 21, 0)["evaluator"]["scope"]["seeded"]
    ran = 0
    branches = [("oracle", spec.oracle, 1.0), ("probe", scope_probe(spec), 1.0)]
    branches += [(f"near:{s.name}", s, 0.0) for s in spec.near_misses]
    for name, sol, want in branches:
        root = tmp_path / name.replace(":", "_")
        seed(spec, root)
        try:
            replay(sol, str(root))
        except NeedsGui:
            continue
        ran += 1
        score, alt, violations = judge_local(spec, root, seeded)
        assert (score, alt) == (want, want), (family, name)
        if name == "oracle":
            assert violations == [], (family, violations)
        if name == "probe":
            assert spec.decoy in violations
    assert ran >= 2, f"{family}: almost nothing could be replayed locally"


# Office files that GUI oracles leave behind, re-saved by LibreOffice in the same format.
RESAVE = {
    ".xlsx": "xlsx:Calc MS Excel 2007 XML",
    ".docx": "docx:MS Word 2007 XML",
    ".pptx": "pptx:Impress MS PowerPoint 2007 XML",
    ".odt": "odt",
    ".odp": "odp",
}
GUI_OFFICE = sorted(
    n
    for n in FAMILIES
    if n not in SHELL_FAMILIES and FAMILIES[n].app.startswith(("libreoffice", "multi"))
)


@pytest.mark.skipif(APPS["soffice"] is None, reason="LibreOffice is not installed on this host")
def test_checkers_accept_libreoffice_written_files(tmp_path: Path, require_check_libs) -> None:
    """Simulated outcomes of GUI solutions, round-tripped through LibreOffice in one batch."""
    cases: list[tuple[str, str, TaskSpec, dict[str, str], float]] = []
    by_ext: dict[str, list[Path]] = {}
    for family in GUI_OFFICE:
        _, spec = generate(21, family, 0)
        require_check_libs(spec.check, spec.check_alt)
        sols = [(spec.oracle, 1.0)] + [(s, 0.0) for s in spec.near_misses]
        for k, (sol, want) in enumerate(sols):
            state = final_state(spec, sol)
            paths = {}
            for vm, dest in spec.results:
                if vm not in state:
                    paths[dest] = ""
                    continue
                ext = Path(vm).suffix
                src = tmp_path / "in" / f"{family}-{k}-{dest}"
                src.parent.mkdir(exist_ok=True)
                src.write_bytes(state[vm])
                by_ext.setdefault(ext, []).append(src)
                paths[dest] = str(tmp_path / "out" / src.name)
            cases.append((family, sol.name, spec, paths, want))
    profile = f"file://{tmp_path}/lo-profile"
    for ext, files in by_ext.items():
        # LibreOffice picks the import filter by content, the export filter from RESAVE
        renamed = []
        for f in files:
            g = f.with_name(f.name + ext)
            f.rename(g)
            renamed.append(str(g))
        _run(
            [
                "soffice",
                f"-env:UserInstallation={profile}",
                "--headless",
                "--convert-to",
                RESAVE[ext],
                "--outdir",
                str(tmp_path / "conv"),
                *renamed,
            ]
        )
        for f in files:
            out = tmp_path / "conv" / (f.name + ext)
            assert out.is_file(), f"LibreOffice did not re-save {f.name}"
            (tmp_path / "out").mkdir(exist_ok=True)
            out.rename(tmp_path / "out" / f.name)
    assert len(cases) > 50, "the round trip covered too few solutions"
    failures = []
    for family, name, spec, paths, want in cases:
        p = {d: (v or None) for d, v in paths.items()}
        got = (CHECKS[spec.check](p, spec.options), CHECKS[spec.check_alt](p, spec.options))
        if got != (want, want):
            failures.append((family, name, got, want))
    assert failures == []


# Runs real processes (a trainer in its own venv, vf-eval, the office apps): the integration
# tier, not the fast unit tier (conftest.py).
pytestmark = pytest.mark.integration
