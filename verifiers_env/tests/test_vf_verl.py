"""The verl adapter inside verl 0.9.1 itself, run in the verl venv (scripts/trainer-venv.sh verl).

verl pins torch/transformers/ray versions the workspace cannot share, so verl_check.py runs there,
with this checkout's sources on PYTHONPATH. The unit run uses the fake drumsd; the live run starts
a real drumsd on the office image and runs the agent loop on OSWorld task e0df059f, the daemon
given only through DRUMS_URL / DRUMS_TOKEN_FILE. A venv that cannot be built fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
OSWORLD = REPO.parent / "shared" / "osworld"
TASK = "e0df059f-28a6-4169-924f-b9623e7184cc"


def verl_venv() -> Path:
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "trainer-venv.sh"), "verl"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert built.returncode == 0, f"the verl venv did not build:\n{built.stderr[-4000:]}"
    return Path(built.stdout.strip().splitlines()[-1])


def run_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    venv = verl_venv()
    paths = [REPO / "sdk" / "src", REPO / "verifiers_env" / "src", Path(__file__).parent]
    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
         "-q", "-rA", "-s", str(Path(__file__).with_name("verl_check.py")), *args],
        cwd=REPO, env=full, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def passed(result: subprocess.CompletedProcess[str]) -> int:
    tail = result.stdout[-3000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    match = re.search(r"(\d+) passed", result.stdout)
    assert match, tail
    return int(match.group(1))


def test_verl_tool_and_agent_loop_against_verl_0_9_1():
    env = {"DRUMS_VERL_LIVE_TASK": ""}
    assert passed(run_check(env)) == 3


@pytest.mark.live
def test_verl_agent_loop_on_a_real_daemon(tmp_path: Path):
    if os.environ.get("DRUMS_LIVE") != "1":
        pytest.skip("needs DRUMS_LIVE=1 (root, CRIU, the office image)")
    sys.path[:0] = [str(REPO / "tests" / "live"), str(REPO / "tests" / "integration")]
    from live_daemon import http_client, start_live_daemon, stop_and_clean

    assert OSWORLD.is_dir(), f"no shared OSWorld tasks at {OSWORLD}"
    started = time.monotonic()
    live = start_live_daemon(tmp_path / "d", image="office", tasks={"dirs": [str(OSWORLD)]})
    try:
        print(f"verl live daemon {live.url}: office template in {time.monotonic() - started:.1f}s")
        with http_client(live) as http:
            before = http.get("/v1/slots").json()["slots"]
        env = {
            "DRUMS_VERL_LIVE_TASK": TASK,
            "DRUMS_URL": live.url,
            "DRUMS_TOKEN_FILE": str(live.dir / "token"),
        }
        os.environ.pop("DRUMS_TOKEN", None)
        t0 = time.monotonic()
        result = run_check(env)
        print(f"verl live episode in {time.monotonic() - t0:.1f}s")
        print("\n".join(line for line in result.stdout.splitlines() if "DRUMS_VERL" in line))
        assert passed(result) == 1
        assert "DRUMS_VERL_RESULT" in result.stdout
        with http_client(live) as http:
            after = http.get("/v1/slots").json()["slots"]
        assert before == [] and after == [], (before, after)
    finally:
        try:
            stop_and_clean(live, tmp_path / "d" / "state")
        except httpx.HTTPError:
            pass
