"""A built task set installed where a live drumsd reads it, and an `office` daemon serving it.

Used by tests/live/test_validator_live.py and by hand (`python tests/live/validator_fixture.py
OUT_DIR` builds, installs, starts the daemon and prints its URL and token file, then waits).

The daemon reads verifier modules only from root-owned directories it is configured with, and
runs checkers as an unprivileged uid: so the build is copied to a root-owned directory under /run
(mode 0755, readable by that uid), not served from a world-writable /tmp.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from live_daemon import Daemon, start_live_daemon, stop_and_clean

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def build_set(
    out: Path, seed: int = 1, per_family: int = 1, families: list[str] | None = None
) -> Path:
    """Run the real build CLI (a pure function of the seed: cheap, about a second)."""
    cmd = [PYTHON, "-m", "drums_tasks.build", "--seed", str(seed), "--out", str(out)]
    cmd += ["--per-family", str(per_family)]
    if families:
        cmd += ["--families", *families]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return out


def install_set(build: Path, root: Path) -> Path:
    """Copy a build into a root-owned 0755 tree (verifier module + assets), return its path."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    root.chmod(0o755)
    target = root / "set"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(build, target)
    for dirpath, _dirnames, filenames in os.walk(target):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return target


OFFICE_SUFFIXES = (".xlsx", ".xls", ".ods", ".csv", ".docx", ".doc", ".odt", ".pptx", ".odp")


def run_validation(
    daemon_url: str,
    token: str,
    installed: Path,
    report: Path,
    per_family: int = 1,
    families: list[str] | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """drums_tasks.validate.run over the installed set, `jobs` tasks in flight."""
    import drums
    from drums_tasks import validate

    with drums.connect(daemon_url, token) as client:
        return validate.run(
            client,
            installed,
            per_family,
            report,
            families,
            lambda m: print(m, file=sys.stderr, flush=True),
            jobs,
        )


def start_validator_daemon(installed: Path, tmp: Path | None = None) -> Daemon:
    """An `office` daemon whose task assets and verifier modules come from `installed`."""
    tmp = tmp or Path(tempfile.mkdtemp(prefix="drums-validator-"))
    state = _state_dir()
    state.mkdir(mode=0o755, exist_ok=True)
    started = time.monotonic()
    daemon = start_live_daemon(
        tmp,
        image="office",
        state_dir=str(state),
        tasks={
            "assets_dir": str(installed / "assets"),
            "verifier_dirs": [str(installed)],
            "eval_timeout_s": 60.0,
        },
    )
    print(f"validator daemon: office template ready in {time.monotonic() - started:.1f}s")
    return daemon


def _state_dir() -> Path:
    # On /run (tmpfs) as in production; root-owned 0755.
    return Path(f"/run/drums-validator-state-{os.getpid()}")


def stop_validator_daemon(daemon: Daemon) -> None:
    """Destroy what is left, stop the daemon, unmount its image cache, remove its state."""
    stop_and_clean(daemon, _state_dir())


if __name__ == "__main__":
    # python validator_fixture.py OUT [PER_FAMILY [FAMILY ...]]: build, install, serve, validate.
    # VALIDATE_JOBS=N in the environment: N tasks in flight (default 1).
    out = Path(sys.argv[1])
    per_family = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    families = sys.argv[3:] or None
    build = build_set(out / "build", per_family=per_family)
    installed = install_set(build, Path(f"/run/drums-validator-{os.getpid()}"))
    daemon = start_validator_daemon(installed, out / "daemon")
    print(f"url={daemon.url} token_file={daemon.dir / 'token'} set={installed}", flush=True)
    try:
        summary = run_validation(
            daemon.url,
            daemon.token,
            installed,
            out / "report.jsonl",
            per_family,
            families,
            int(os.environ.get("VALIDATE_JOBS", "1")),
        )
        print(json.dumps(summary, indent=1))
    finally:
        stop_validator_daemon(daemon)
        shutil.rmtree(installed.parent, ignore_errors=True)


@contextmanager
def open_validator_host(
    tmp: Path, name: str, families: list[str] | None, per_family: int
) -> Iterator[tuple[Daemon, Path]]:
    """Build the sampled set, install it under /run and serve it from a validator daemon:
    (daemon, installed dir), everything removed on the way out."""
    build = build_set(tmp / "build", seed=1, per_family=per_family, families=families)
    root = Path(f"/run/drums-{name}-{os.getpid()}")
    installed = install_set(build, root)
    daemon = start_validator_daemon(installed, tmp / "daemon")
    try:
        yield daemon, installed
    finally:
        stop_validator_daemon(daemon)
        shutil.rmtree(root, ignore_errors=True)
