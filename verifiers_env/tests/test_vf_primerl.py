"""drums-verifiers in prime-rl's own environment (its pinned verifiers commit, not PyPI's 0.4).

The venv is scripts/trainer-venv.sh primerl, built from the archives in ../shared/trainers
(prime-rl and the verifiers commit its submodule pins); where that folder is absent (a user's
clone) these tests skip, naming it. primerl_check.py runs inside the venv.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from trainer_checks import REPO, passed, result_lines, run_check

SHARED = REPO.parent / "shared" / "trainers"
PINNED = {"verifiers": "0.3.1.dev62", "mcp": "1.27.1", "openai": "2.38.0"}


def primerl_venv() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"prime-rl's sources are not at {SHARED} (../shared/trainers)")
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "trainer-venv.sh"), "primerl"],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    return Path(built.stdout.strip().splitlines()[-1])


def test_installing_drums_verifiers_keeps_prime_rl_pins(tmp_path: Path) -> None:
    """pip's own plan for `pip install sdk verifiers_env` in prime-rl's environment: it must
    install our two packages and replace nothing prime-rl pinned (it used to swap verifiers for
    0.4.0, whose import of the taskset then failed)."""
    venv = primerl_venv()
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet",
         "--report", str(report), str(REPO / "sdk"), str(REPO / "verifiers_env")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    plan = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.load(report.open())["install"]
    }
    assert not set(plan) & set(PINNED), plan
    assert {"drums-sdk", "drums-verifiers"} <= set(plan), plan
    have = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m, json; "
         f"print(json.dumps({{n: m.version(n) for n in {list(PINNED)!r}}}))"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert json.loads(have) == PINNED


def test_prime_rl_config_test_passes_with_the_pinned_verifiers() -> None:
    """The project's prime-rl config test, whole-file parses included, in prime-rl's env."""
    venv = primerl_venv()
    paths = [REPO / "sdk" / "src", REPO / "verifiers_env" / "src", Path(__file__).parent]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    env["DRUMS_PRIME_RL_PYTHON"] = str(venv / "bin" / "python")
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-o",
         "addopts=", "-q", "-rA", str(Path(__file__).parent / "test_vf_prime_rl_config.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert passed(proc) == 5 and "skipped" not in proc.stdout, proc.stdout[-3000:]


def primerl_env(venv: Path) -> dict[str, str]:
    """What a prime-rl user's environment adds: this checkout's packages (on PYTHONPATH, as
    the trainer checks do: the venv holds only third-party packages) and the venv's bin."""
    paths = [REPO / "sdk" / "src", REPO / "verifiers_env" / "src"]
    return {
        "PYTHONPATH": os.pathsep.join(map(str, paths)),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }


def test_the_documented_command_in_prime_rl_env(fake_host, policy, tmp_path: Path) -> None:
    """The README's vf-eval command with prime-rl's verifiers, whose v1 CLI is `eval`."""
    from test_vf_documented_command import run_documented
    from vf_support import error_text, write_tasks

    venv = primerl_venv()
    write_tasks(tmp_path / "tasks", ["solve"])
    proc, episodes = run_documented(
        str(venv / "bin" / "eval"), tmp_path, policy.base_url, fake_host.url,
        fake_host.token_file, tmp_path / "tasks", extra_env=primerl_env(venv),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == 1, proc.stderr[-3000:]
    assert traces[0]["ok"], error_text(traces[0])
    assert traces[0]["rewards"]["task_success"]["score"] == 1.0, traces[0]["rewards"]
    assert fake_host.stats()["live_slots"] == []


def test_the_matrix_names_the_pinned_versions() -> None:
    """docs/verifiers.md's prime-rl rows name the versions prime-rl's environment has."""
    venv = primerl_venv()
    have = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
         f"{[*PINNED, 'prime-rl-configs']!r}}}))"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    versions = json.loads(have)
    rows = [
        line
        for line in (REPO / "docs" / "verifiers.md").read_text().splitlines()
        if line.startswith("| prime-rl |")
    ]
    assert len(rows) == 5, rows
    first = rows[0].split("|")[2]
    for name in PINNED:
        assert f"{name} {versions[name]}" in first, (name, versions[name], first)
    assert f"prime-rl-configs {versions['prime-rl-configs']}" in rows[1]
    assert all("559b44772" in row for row in rows)


def test_rl_dry_run_and_a_rollout_through_the_env_server() -> None:
    primerl_venv()
    result = run_check("primerl", "primerl_check.py", {})
    assert passed(result) == 3
    rows = result_lines(result, "PRIMERL-ROW")
    assert len(rows) == 3, result.stdout[-3000:]


pytestmark = pytest.mark.integration
