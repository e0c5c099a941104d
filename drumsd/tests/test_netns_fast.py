"""Unit tests of netns_fast's parts: the restore argv and the exec helper as CRIU's action script
(lo up in the restored tree's new net namespace at setup-namespaces, nothing at other actions).
The restore itself is tested live (tests/live/test_runtime_linux.py::test_netns_fast_...)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from drumsd.linux import criu
from drumsd.linux.exec_helper import ensure_exec_helper, lo_up_script


def test_netns_fast_asks_criu_for_an_empty_netns_and_the_helper_as_action_script() -> None:
    plain = criu.restore_argv(Path("/c"), Path("/i"), Path("/w"), Path("/r"), Path("/p"))
    assert "--empty-ns" not in plain and "--action-script" not in plain
    fast = criu.restore_argv(
        Path("/c"), Path("/i"), Path("/w"), Path("/r"), Path("/p"), lo_up_script="/bin/h"
    )
    assert fast[-4:] == ["--empty-ns", "net", "--action-script", "/bin/h"]
    assert lo_up_script(Path("/bin/h")) == "/bin/h"
    assert lo_up_script(None) is None  # CRIU execs a path: no compiled helper, no netns_fast


def _lo_after(helper: Path, action: str) -> str:
    """Run the helper as CRIU would (no arguments, CRTOOLS_* set) for a process in a new net
    namespace (`unshare -n`, lo down), then read that namespace's lo."""
    script = (
        f'CRTOOLS_SCRIPT_ACTION={action} CRTOOLS_INIT_PID=$$ {helper} || echo "helper failed"; '
        "ip -o link show lo"
    )
    run = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_helper_brings_lo_up_only_at_setup_namespaces(tmp_path: Path) -> None:
    helper = ensure_exec_helper(tmp_path)
    assert helper is not None, "no C compiler (scripts/prepare-host.sh installs build-essential)"
    assert os.geteuid() == 0, "unshare -n needs root (the unit tier runs as root)"
    up = _lo_after(helper, "setup-namespaces")
    down = _lo_after(helper, "pre-restore")
    assert "<LOOPBACK,UP," in up and "helper failed" not in up, up
    assert "<LOOPBACK>" in down and "helper failed" not in down, down
