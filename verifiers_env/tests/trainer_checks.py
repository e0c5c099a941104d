"""Run a *_check.py module inside a trainer's own venv (scripts/trainer-venv.sh NAME).

The trainers pin torch/transformers/ray versions the workspace cannot share; their venvs hold only
third-party packages, and this checkout's sources go on PYTHONPATH. A venv that cannot be built
fails the calling test (never a skip).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent


def trainer_venv(name: str) -> Path:
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "trainer-venv.sh"), name],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert built.returncode == 0, f"the {name} venv did not build:\n{built.stderr[-4000:]}"
    return Path(built.stdout.strip().splitlines()[-1])


def run_check(name: str, check: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    venv = trainer_venv(name)
    paths = [REPO / "sdk" / "src", REPO / "verifiers_env" / "src", HERE]
    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    full.pop("DRUMS_TOKEN", None)
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
         "-q", "-rA", "-s", str(HERE / check)],
        cwd=REPO, env=full, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def passed(result: subprocess.CompletedProcess[str]) -> int:
    tail = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    match = re.search(r"(\d+) passed", result.stdout)
    assert match, tail
    return int(match.group(1))


def result_lines(result: subprocess.CompletedProcess[str], marker: str) -> list[str]:
    """The lines a check printed after `marker` (pytest's progress dots may precede them)."""
    return [line[line.index(marker) :] for line in result.stdout.splitlines() if marker in line]
