"""Schema-driven fuzz (schemathesis) of a running daemon: hundreds of cases, no 5xx."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from drumsd_process import Daemon


def schemathesis_cli() -> list[str]:
    exe = Path(sys.executable).with_name("schemathesis")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("schemathesis")
    if found is None:
        pytest.fail("schemathesis is not installed: uv sync --group dev (it is a dev dependency)")
    return [found]


@pytest.mark.slow
def test_fuzz_finds_no_server_error(daemon: Daemon, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *schemathesis_cli(),
            "run",
            daemon.url + "/openapi.json",
            "-H",
            f"Authorization: Bearer {daemon.token}",
            "--checks",
            "not_a_server_error",
            "--phases",
            "coverage,fuzzing,stateful",
            "--max-examples",
            "8",
            "--max-time",
            "75",  # a bound: the seeded run ends at max-examples (~45 s idle; CI hit 150 s)
            "--seed",
            "20261130",
            "--workers",
            "1",
            "--request-timeout",
            "90",  # above the longest legitimate request: a `wait` action of up to 60 s
            "--generation-database",
            "none",
            "--no-color",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path / "report"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", out)
    assert cases, out[-3000:]
    generated, passed = int(cases.group(1)), int(cases.group(2))
    assert generated >= 200 and passed == generated, out[-3000:]
    assert "unexpected" not in daemon.log(), "the catch-all 500 handler fired"
    assert "Traceback" not in daemon.log()
