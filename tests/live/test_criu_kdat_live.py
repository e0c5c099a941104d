"""drums' CRIU keeps what it learnt of the kernel between runs in the dir the daemon makes
(criu.KDAT_DIR, its build's RUNDIR), on a tmpfs whatever /run is: a second run loads it
instead of probing the kernel again. Root and drums' CRIU; no desktop needed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from drumsd.linux import criu, host_share
from drumsd.linux.write_track import criu_tracks_writes

CRIU = Path(os.environ.get("DRUMS_CRIU", "/usr/local/sbin/criu"))


def test_a_second_criu_run_loads_the_kernel_facts_the_first_saved(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not criu_tracks_writes(CRIU):
        pytest.skip(f"needs root and drums' CRIU at {CRIU} (scripts/setup.sh builds it)")
    assert host_share.ensure_criu_cache_dir(criu.KDAT_DIR) is None
    cache = criu.KDAT_DIR / "criu.kdat"
    cache.unlink(missing_ok=True)  # the first run below probes and saves it
    logs = []
    for run in range(2):
        victim = subprocess.Popen(
            ["sleep", "600"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            images = tmp_path / f"run{run}"
            images.mkdir()
            argv = [str(CRIU), "dump", "-t", str(victim.pid), "-D", str(images), "-v4"]
            done = subprocess.run([*argv, "-o", "dump.log"], capture_output=True, timeout=60)
            assert done.returncode == 0, done.stderr[-2000:]
            logs.append((images / "dump.log").read_text(errors="replace"))
        finally:
            victim.kill()
            victim.wait()
    assert cache.is_file()
    assert f"Loaded kdat cache from {cache}" not in logs[0]
    assert f"Loaded kdat cache from {cache}" in logs[1], logs[1][:3000]
