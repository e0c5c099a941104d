"""scripts/trainer-venv.sh builds one venv at a time: a second caller waits and reuses it.

Two builds of one venv at once used to fail (both removed and re-made the same directory; one
died in ensurepip). The script is run as it is, on a tiny requirement list in a copy of
scripts/, with the cache in a temp dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_builds_at_once_build_once_and_both_succeed(tmp_path: Path) -> None:
    (tmp_path / "scripts" / "trainers").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "trainer-venv.sh", tmp_path / "scripts")
    (tmp_path / "scripts" / "trainers" / "tiny.txt").write_text(
        "# a venv with pip only\n---\npip\n"
    )
    env = {**os.environ, "DRUMS_CACHE": str(tmp_path / "cache")}
    cmd = ["bash", str(tmp_path / "scripts" / "trainer-venv.sh"), "tiny"]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
    paths = {out.strip().splitlines()[-1] for _, out, _ in results}
    assert len(paths) == 1, paths
    venv = Path(paths.pop())
    assert (venv / ".complete").exists() and (venv / "bin" / "python").exists()
    built = [err for _, _, err in results if "trainer-venv: built tiny" in err]
    assert len(built) == 1, [err[-500:] for _, _, err in results]
