"""Shared helpers of the Nix packaging's CI tests (a uniquely named module, not a conftest, so a
whole-repo pytest session cannot confuse it with another directory's): tool lookup that fails
under CI, and a real `drumsd serve` managed by the local stand-in for a NixOS test machine."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VM_TESTS = REPO / "vm-tests"
SCENARIOS = VM_TESTS / "scenarios"
for path in (VM_TESTS, SCENARIOS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# The stand-in, importable once vm-tests is on the path.
from local_machine import (  # noqa: E402
    CommandFailed,
    LocalMachine,
    LocalUnit,
    UnsupportedByStandIn,
)

__all__ = ["CommandFailed", "LocalMachine", "LocalUnit", "UnsupportedByStandIn"]

CACHE_ROOT = Path(os.environ.get("DRUMS_CACHE", "/var/cache/drums"))
CRIU = Path(os.environ.get("DRUMS_CRIU", "/usr/local/sbin/criu"))


# The Nix scripts/setup.sh unpacks (nix/ci-nix.sh); DRUMS_NIX_BIN names another bin directory.
CI_NIX_BIN = Path(os.environ.get("DRUMS_NIX_BIN", CACHE_ROOT / "ci-nix" / "bin"))
NIX_TOOLS = ("nix", "nix-instantiate", "nix-store")
# nixpkgs 25.11's lib/minfeatures.nix; lib.fileset needs builtins.readFileType.
NIX_MINIMUM = (2, 18)


def _missing(message: str) -> None:
    if os.environ.get("DRUMS_CI") == "1":
        pytest.fail(f"DRUMS_CI=1 but {message}")
    pytest.skip(message)


@functools.cache
def nix_version(nix: str) -> tuple[int, ...]:
    import subprocess

    out = subprocess.run([nix, "--version"], capture_output=True, text=True, check=True).stdout
    return tuple(int(part) for part in out.split()[-1].split(".")[:2])


def require_tool(name: str) -> str:
    """Path of `name`; under DRUMS_CI=1 a missing tool fails the test instead of skipping it. Nix's
    tools come from CI_NIX_BIN when it exists, else PATH, and must be Nix >= 2.18."""
    if name in NIX_TOOLS:
        found = str(CI_NIX_BIN / name) if (CI_NIX_BIN / name).exists() else shutil.which(name)
        if not found:
            _missing(f"{name} not found in {CI_NIX_BIN} or on PATH (run: bash nix/ci-nix.sh)")
        version = nix_version(found)
        if version < NIX_MINIMUM:
            _missing(
                f"{found} is Nix {'.'.join(map(str, version))}; nixpkgs 25.11 needs >= 2.18 "
                "(run: bash nix/ci-nix.sh)"
            )
        return found
    found = shutil.which(name)
    if not found:
        _missing(f"{name} not found on PATH")
    return found


def nix_env() -> dict[str, str]:
    """Offline Nix: no binary cache to retry, no store writes beyond what parsing needs."""
    return {
        **os.environ,
        "NIX_CONFIG": "substituters =\nexperimental-features = nix-command flakes",
    }


def live_runtime_problems() -> list[str]:
    """What this host lacks for drumsd's Linux runtime (empty: it can run real desktops)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    if not os.access(CRIU, os.X_OK):
        problems.append(f"no CRIU at {CRIU} (run scripts/prepare-host.sh)")
    try:
        from drumsd.linux.image import find_image

        find_image("base", CACHE_ROOT)
    except Exception as exc:  # the image module says what to run
        problems.append(f"no base image: {exc}")
    return problems


def require_live_runtime() -> None:
    """Live scenarios run under DRUMS_LIVE=1 (CI sets it) and fail there when the host cannot run
    the Linux runtime; without it they skip, like tests/live: a Linux-runtime daemon sweeps every
    slot cgroup on the host, so it must not start during someone else's live run by accident."""
    if os.environ.get("DRUMS_LIVE") != "1":
        problems = live_runtime_problems()
        why = "; ".join(problems) if problems else "the host has it; set DRUMS_LIVE=1 to run"
        pytest.skip(f"needs the Linux runtime and DRUMS_LIVE=1 ({why})")
    problems = live_runtime_problems()
    if problems:
        pytest.fail("DRUMS_LIVE=1 but the Linux runtime cannot run here: " + "; ".join(problems))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def daemon_argv(config: Path) -> list[str]:
    """`drumsd serve --config PATH`; DRUMS_DAEMON_CMD overrides it ({config} is substituted)."""
    override = os.environ.get("DRUMS_DAEMON_CMD")
    if override:
        return [part.replace("{config}", str(config)) for part in shlex.split(override)]
    launcher = "import sys\nfrom drumsd.cli import main\nsys.exit(main())"
    return [sys.executable, "-c", launcher, "serve", "--config", str(config)]


@dataclass
class LocalDaemon:
    machine: object
    target: object
    config_path: Path
    log_path: Path
    live: bool

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def config_model_fields() -> set[str]:
    from drumsd.core.config import Config

    return set(Config.model_fields)


def local_config(tmp: Path, port: int, live: bool) -> dict:
    state_dir = Path(f"/run/drums-nixtest-{uuid.uuid4().hex[:8]}") if live else tmp / "state"
    config = {
        "listen": f"127.0.0.1:{port}",
        "token_file": str(tmp / "secrets" / "token"),
        "state_dir": str(state_dir),
        "journal_dir": str(tmp / "journal"),
        "forgotten_dir": str(tmp / "forgotten"),
        "images_dir": str(tmp / "images"),
        "tasks": {"cache_dir": str(tmp / "task-cache")},
        # This small CI machine: admit on what it has, not a production host's margins.
        "admission": {"min_available_mib": 512, "min_state_free_mib": 64, "min_available_pct": 1},
        "log_level": "debug",
    }
    if live:
        # As the README's main job does: drumsd finds the built image in images_dir by profile.
        config.update(criu=str(CRIU), images_dir=str(CACHE_ROOT / "images"))
        if "runtime" in config_model_fields():
            config.update(runtime="linux")
    else:
        # The in-memory runtime fakes desktops but still wants an image to name.
        (tmp / "lower").mkdir(exist_ok=True)
        config.update(crash_watch=False, lower=str(tmp / "lower"), image_sha256="0" * 64)
        if "runtime" in config_model_fields():
            config.update(runtime="memory")
    extra = os.environ.get("DRUMS_NIXTEST_CONFIG")
    if extra:
        config.update(json.loads(Path(extra).read_text()))
    return config


@contextlib.contextmanager
def open_local_daemon(tmp: Path, live: bool) -> Iterator[LocalDaemon]:
    """A real `drumsd serve` run as the emulated unit `drumsd` of a LocalMachine, stopped (and,
    for the Linux runtime, its mounts removed) on exit."""
    from drums_http import Target
    from local_machine import LocalMachine, LocalUnit

    port = free_port()
    config = local_config(tmp, port, live)
    config_path = tmp / "drumsd.json"
    config_path.write_text(json.dumps(config, indent=2))
    log_path = tmp / "drumsd.log"
    src = [REPO / "drumsd" / "src", REPO / "sdk" / "src"]
    env = {"PYTHONPATH": os.pathsep.join(str(p) for p in src), "PYTHONUNBUFFERED": "1"}
    unit = LocalUnit(
        name="drumsd",
        argv=daemon_argv(config_path),
        token_file=Path(config["token_file"]),
        env=env,
        log_path=log_path,
        # No unit cgroup (LocalUnit(delegate=True)) here: drumsd keeps one cgroup group per state
        # dir itself, and with the v1 unit cgroup the hardened runtime's daemon was killed during
        # its template boot on this host (03:20 UTC; trusted passed either way). See docs/nix.md.
        delegate=False,
    )
    machine = LocalMachine([unit])
    target = Target(
        base_url=f"http://127.0.0.1:{port}",
        token_file=config["token_file"],
        state_dir=config["state_dir"],
        journal_dir=config["journal_dir"],
        config_path=str(config_path),
    )
    machine.start()
    try:
        yield LocalDaemon(machine, target, config_path, log_path, live)
    finally:
        # KillMode=process leaves slots running across a stop (by design); a test must not.
        _destroy_every_slot(machine, target)
        machine.shutdown()
        if live:
            _unmount_below(Path(config["state_dir"]))


def _destroy_every_slot(machine: object, target: object) -> None:
    """Best effort: a failed test may have left slots, or the daemon may be down."""
    from drums_http import DrumsHttp

    api = DrumsHttp(machine, target)
    try:
        api.wait_healthy(timeout_s=10)
        for slot_id in api.live_slot_ids():
            api.request("DELETE", f"/v1/slots/{slot_id}", max_time_s=60)
    except Exception as exc:  # teardown must go on to stop the daemon
        print(f"teardown: could not destroy every slot: {exc}")


def _unmount_below(root: Path) -> None:
    """Leave no mount of a live run behind, deepest first (a failed test may have left some)."""
    import subprocess

    targets = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(str(root))
    ]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False)
    shutil.rmtree(root, ignore_errors=True)
