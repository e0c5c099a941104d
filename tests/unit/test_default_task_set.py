"""The default task set builds byte for byte twice (`--check`) at the size the brief promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow  # builds the whole default set twice (~40 s)
def test_default_build_is_reproducible_and_large_enough(tmp_path: Path) -> None:
    out = tmp_path / "default"
    proc = subprocess.run(
        [sys.executable, "-m", "drums_tasks.build", "--seed", "0", "--out", str(out), "--check"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    index = json.loads((out / "index.json").read_text())
    counts = index["counts"]
    assert counts["tasks"] >= 1640 and counts["near_misses"] >= 4285, counts
    assert counts["families"] >= 37 and counts["apps"] >= 6, counts
    tasks = (out / "tasks.jsonl").read_text().splitlines()
    assert len(tasks) == counts["tasks"]
    assert not any('"oracle"' in line or '"near_misses"' in line for line in tasks)
