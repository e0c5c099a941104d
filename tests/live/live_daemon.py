"""A real `drumsd serve` with the Linux runtime, for live tests through the API.

They run wherever the host can run the runtime (root, CRIU, the image). A host that cannot skips
them, except under DRUMS_LIVE=1 (CI), where that is a failure, never a skip.
One daemon serves a whole test session: its template checkpoint (a cold boot and a dump) is
made once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness.py, for scripts run bare
from drumsd_process import Daemon, free_port, write_token

CACHE_ROOT = Path(os.environ.get("DRUMS_CACHE", "/var/cache/drums"))
CRIU = Path(os.environ.get("DRUMS_CRIU", "/usr/local/sbin/criu"))


def osworld_opt_in(what: str, needs: str = "") -> None:
    """Skip the calling module unless DRUMS_LIVE_OSWORLD=1 (the osworld image takes 9-15 min to
    build, more than CI's budget); opted in, DRUMS_LIVE=1 follows, so a missing image fails."""
    if os.environ.get("DRUMS_LIVE_OSWORLD") != "1":
        pytest.skip(
            f"{what} opt-in: DRUMS_LIVE_OSWORLD=1{needs} after `bash scripts/setup.sh osworld`",
            allow_module_level=True,
        )
    os.environ.setdefault("DRUMS_LIVE", "1")  # opted in: a missing image fails, never skips


def require_live(profile: str = "base") -> None:
    """Skip when the host lacks what is needed; fail instead under DRUMS_LIVE=1."""
    live = os.environ.get("DRUMS_LIVE") == "1"
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    if not os.access(CRIU, os.X_OK):
        problems.append(f"no CRIU at {CRIU} (run scripts/setup.sh)")
    try:
        from drumsd.linux.image import find_image

        find_image(profile, CACHE_ROOT)
    except Exception as exc:
        problems.append(f"no {profile} image: {exc}")
    if problems:
        if live:
            pytest.fail("DRUMS_LIVE=1 but " + "; ".join(problems))
        pytest.skip("live tests need DRUMS_LIVE=1: " + "; ".join(problems))


def live_config(tmp: Path, port: int, **overrides: Any) -> dict[str, Any]:
    """A config for a test daemon: its own state and journal, admission that fits a CI host."""
    config: dict[str, Any] = {
        "listen": f"127.0.0.1:{port}",
        "token_file": str(tmp / "token"),
        "state_dir": str(tmp / "state"),
        "journal_dir": str(tmp / "journal"),
        "forgotten_dir": str(tmp / "forgotten"),
        # DRUMS_LIVE_IMAGES_DIR: images assembled from this tree's guest sources
        # (`drumsd image build --cache DIR`) when the shared cache holds another tree's.
        "images_dir": os.environ.get("DRUMS_LIVE_IMAGES_DIR") or str(CACHE_ROOT / "images"),
        "criu": str(CRIU),
        "alive_after_s": 1.0,
        "drain_timeout_s": 10,
        "admission": {"min_available_mib": 1024, "min_available_pct": 2, "min_state_free_mib": 256},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def start_live_daemon(
    tmp: Path, *, image: str = "base", start_limit_s: float = 60, **overrides: Any
) -> Daemon:
    """Start the daemon (answering within `start_limit_s`) and wait until the template
    checkpoint of `image` is ready."""
    require_live(image)
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    token = write_token(tmp / "token")
    config_path = tmp / "drumsd.json"
    overrides.setdefault("default_image", image)
    config_path.write_text(json.dumps(live_config(tmp, port, **overrides)))
    daemon = Daemon(tmp, config_path, token, f"http://127.0.0.1:{port}").start(
        limit_s=start_limit_s
    )
    try:
        wait_template(daemon, image)
    except BaseException:
        # No caller gets the daemon to stop: one left running kept its slots' mounts (under a
        # pytest dir later renamed to garbage-*) and its desktops (issue 32's runner retry).
        daemon.stop()
        raise
    return daemon


def wait_template(daemon: Daemon, image: str, limit_s: float = 180) -> None:
    deadline = time.monotonic() + limit_s
    last: Any = None
    with daemon.client() as http:
        while time.monotonic() < deadline:
            body = http.get("/v1/checkpoints").json()
            last = body
            if any(
                cp["kind"] == "template" and cp.get("image") == image
                for cp in body.get("checkpoints", [])
            ):
                return
            if daemon.proc is not None and daemon.proc.poll() is not None:
                break
            time.sleep(0.2)
    raise AssertionError(
        f"no template checkpoint of {image!r} within {limit_s}s: {last}\n{daemon.log()[-4000:]}"
    )


def http_client(daemon: Daemon, timeout: float = 120) -> httpx.Client:
    return httpx.Client(
        base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"}, timeout=timeout
    )


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root` (from this process's mountinfo)."""
    prefix = str(root)
    targets = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4]
        if target == prefix or target.startswith(prefix + "/"):
            targets.append(target)
    return targets


def stop_and_clean(daemon: Daemon, state: Path, *dirs: Path) -> None:
    """Destroy the daemon's slots, stop it, unmount what its runtime leaves mounted under `state`
    after a stop (its image-cache tmpfs), and remove `state` and `dirs`."""
    try:
        with http_client(daemon, timeout=60) as http:
            for slot in http.get("/v1/slots").json().get("slots", []):
                http.delete(f"/v1/slots/{slot['id']}")
    except httpx.HTTPError:
        pass
    daemon.stop(limit_s=60)
    for target in sorted(mounts_under(state), reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)
    for d in (state, *dirs):
        shutil.rmtree(d, ignore_errors=True)
