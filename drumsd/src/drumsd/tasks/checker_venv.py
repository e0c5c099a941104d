"""The checker virtualenv: OSWorld's metric code and its libraries, apart from the daemon.

It lives in `<root>/checker-venv-<hash>`, the hash covering the pinned requirements, the
desktop-env version, the Python version and checker_runner.py, so a change to any of them builds a
new one beside the old (old ones can be deleted by hand). A build happens in a temporary directory
renamed into place at the end, so a half-built venv is never used. After the build, a probe inside
the venv records which metric names load (`drums-probe.json`), which is what `support()` reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import trio

from .model import NOBODY, CheckerEnv, MetricCatalog, TaskContext

log = logging.getLogger("drumsd.tasks.checker_venv")

DESKTOP_ENV = "desktop-env==1.0.2"
DEFAULT_ROOT = Path("/var/cache/drums")
PROBE_FILE = "drums-probe.json"
MARKER_FILE = "drums-venv.json"
RUNNER_DIR = "drums-checker"
BUILD_TIMEOUT_S = 1200.0

Progress = Callable[[str, str], None]


class CheckerVenvError(RuntimeError):
    """The checker venv could not be built or read."""


@dataclass(frozen=True)
class CheckerVenv:
    path: Path
    catalog: MetricCatalog
    build_s: float | None = None

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def runner(self) -> Path:
        return self.path / RUNNER_DIR / "checker_runner.py"


def requirements_text() -> str:
    return resources.files("drumsd.tasks").joinpath("checker-requirements.txt").read_text()


def pinned_requirements() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in requirements_text().splitlines())
    return sorted(line for line in lines if line)


def venv_hash() -> str:
    digest = hashlib.sha256()
    for part in [DESKTOP_ENV, f"python{sys.version_info.major}.{sys.version_info.minor}"]:
        digest.update(part.encode() + b"\n")
    for line in pinned_requirements():
        digest.update(line.encode() + b"\n")
    # The runner is copied into the venv, so a new runner means a new venv.
    digest.update(runner_source().encode())
    return digest.hexdigest()[:16]


def runner_source() -> str:
    return resources.files("drumsd.tasks").joinpath("checker_runner.py").read_text()


def venv_path(root: Path = DEFAULT_ROOT) -> Path:
    return root / f"checker-venv-{venv_hash()}"


def load_checker_venv(root: Path = DEFAULT_ROOT, path: Path | None = None) -> CheckerVenv | None:
    """The built venv for the current pins (or the one at `path`, the config's
    tasks.checker_venv), or None when it has not been built yet."""
    path = path if path is not None else venv_path(root)
    marker = path / MARKER_FILE
    if not marker.exists():
        return None
    probe = json.loads((path / PROBE_FILE).read_text())
    meta = json.loads(marker.read_text())
    return CheckerVenv(
        path=path,
        catalog=MetricCatalog(exported=probe["exported"], unsupported=probe["unsupported"]),
        build_s=meta.get("build_s"),
    )


def _usable_by_anyone(path: Path) -> bool:
    """True when an unprivileged uid can execute this interpreter (e.g. not under a 0700 /root)."""
    try:
        real = path.resolve(strict=True)
    except OSError:
        return False
    if not real.stat().st_mode & 0o001:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in real.parents)


def pick_base_python() -> str:
    """A Python of the daemon's version that the checker's unprivileged uid can run."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [Path(f"/usr/bin/python{version}"), Path(sys.executable), Path("/usr/bin/python3")]
    for candidate in candidates:
        if candidate.name.endswith(version) or candidate == Path(sys.executable):
            if _usable_by_anyone(candidate):
                return str(candidate)
    raise CheckerVenvError(
        f"no python{version} that an unprivileged uid can execute (tried "
        f"{', '.join(map(str, candidates))}); install python{version} system-wide or pass python="
    )


def _log_progress(stage: str, detail: str) -> None:
    log.info("checker venv: %s: %s", stage, detail)


async def _run(argv: list[str], what: str, timeout_s: float) -> str:
    with trio.move_on_after(timeout_s) as scope:
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    if scope.cancelled_caught:
        raise CheckerVenvError(f"{what} took longer than {timeout_s:.0f} s: {' '.join(argv)}")
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace")[-2000:]
        raise CheckerVenvError(
            f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n{tail}\n"
            "Check that PyPI is reachable and the pins in checker-requirements.txt exist."
        )
    return done.stdout.decode(errors="replace")


async def probe_metrics(python: Path, runner: Path, timeout_s: float = 120.0) -> MetricCatalog:
    """Ask the venv which exported metric names load there."""
    with trio.move_on_after(timeout_s) as scope:
        done = await trio.run_process(
            [str(python), str(runner)],
            stdin=b'{"kind": "probe"}',
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**_clean_env(), "PYMUPDF_MESSAGE": "fd:2"},
        )
    if scope.cancelled_caught:
        raise CheckerVenvError(f"the metric probe in {python} took longer than {timeout_s} s")
    try:
        answer = json.loads(done.stdout)
    except ValueError as exc:
        raise CheckerVenvError(
            f"the metric probe in {python} gave no answer (exit {done.returncode}): "
            f"{done.stderr.decode(errors='replace')[-2000:]}"
        ) from exc
    return MetricCatalog(exported=answer["exported"], unsupported=answer["unsupported"])


def _clean_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONNOUSERSITE": "1"}


def _size_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _open_up(path: Path) -> None:
    # The checker runs as an unprivileged uid: it needs to read and execute everything here.
    for dirpath, dirs, files in os.walk(path):
        os.chmod(dirpath, 0o755)
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                mode = os.stat(full).st_mode
                os.chmod(full, mode | 0o444 | (0o111 if mode & 0o100 else 0))
        del dirs  # walked by os.walk itself


async def ensure_checker_venv(
    root: Path = DEFAULT_ROOT,
    *,
    python: str | None = None,
    progress: Progress = _log_progress,
    timeout_s: float = BUILD_TIMEOUT_S,
) -> CheckerVenv:
    """Return the checker venv for the current pins, building it first when missing."""
    existing = load_checker_venv(root)
    if existing is not None:
        return existing
    final = venv_path(root)
    os.makedirs(root, exist_ok=True)
    os.chmod(root, os.stat(root).st_mode | 0o755)
    staging = root / f".{final.name}.building-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    base_python = python or pick_base_python()
    uv = shutil.which("uv")
    started = time.monotonic()
    try:
        with trio.fail_after(timeout_s):
            progress("venv", f"creating {final} with {base_python}")
            if uv:
                await _run(
                    [uv, "venv", "-q", "--python", base_python, str(staging)], "uv venv", 120
                )
                install = [uv, "pip", "install", "-q", "--python", str(staging / "bin" / "python")]
            else:
                await _run([base_python, "-m", "venv", str(staging)], "python -m venv", 120)
                install = [str(staging / "bin" / "python"), "-m", "pip", "install", "-q"]
            progress("desktop-env", f"installing {DESKTOP_ENV} without its dependencies")
            await _run([*install, "--no-deps", DESKTOP_ENV], "installing desktop-env", 600)
            progress("libraries", f"installing {len(pinned_requirements())} pinned libraries")
            req = staging / "checker-requirements.txt"
            req.write_text(requirements_text())
            await _run([*install, "-r", str(req)], "installing the checker libraries", 900)
            runner_dir = staging / RUNNER_DIR
            runner_dir.mkdir()
            (runner_dir / "checker_runner.py").write_text(runner_source())
            progress("probe", "loading every exported metric module")
            catalog = await probe_metrics(
                staging / "bin" / "python", runner_dir / "checker_runner.py"
            )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    build_s = round(time.monotonic() - started, 1)
    probe = {"exported": catalog.exported, "unsupported": catalog.unsupported}
    (staging / PROBE_FILE).write_text(json.dumps(probe, indent=1, sort_keys=True))
    size = _size_bytes(staging)
    meta = {"hash": venv_hash(), "build_s": build_s, "size_bytes": size, "desktop_env": DESKTOP_ENV}
    (staging / MARKER_FILE).write_text(json.dumps(meta, indent=1))
    _open_up(staging)
    # uv and venv write absolute paths of the staging dir into activate scripts only; the python
    # symlink and site-packages are relative to the venv, so renaming is safe.
    try:
        os.replace(staging, final)
    except OSError:
        # Another process finished the same build first: keep its venv.
        shutil.rmtree(staging, ignore_errors=True)
        existing = load_checker_venv(root)
        if existing is None:
            raise
        return existing
    progress(
        "done",
        f"{final}: {size / 2**20:.0f} MiB in {build_s} s; "
        f"{len(catalog.exported) - len(catalog.unsupported)}/{len(catalog.exported)} metrics load",
    )
    return CheckerVenv(path=final, catalog=catalog, build_s=build_s)


def context_for_checker(
    ctx: TaskContext,
    venv: CheckerVenv,
    *,
    uid: int = NOBODY,
    gid: int = NOBODY,
    scratch_root: Path | None = None,
    memory_mib: int | None = None,
    cpu_s: float | None = None,
) -> TaskContext:
    """The task context with this venv's metric catalog and checker process settings."""
    env = CheckerEnv(
        python=venv.python,
        runner=venv.runner,
        uid=uid,
        gid=gid,
        scratch_root=scratch_root or Path("/tmp"),
        memory_mib=memory_mib,
        cpu_s=cpu_s,
    )
    return ctx.model_copy(update={"metrics": venv.catalog, "checker": env})


def main(argv: list[str] | None = None) -> int:
    """`python -m drumsd.tasks [ROOT]`: build (or find) the checker venv and say what it lacks."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else DEFAULT_ROOT
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    venv = trio.run(ensure_checker_venv, root)
    print(json.dumps({"path": str(venv.path), "unsupported": venv.catalog.unsupported}, indent=1))
    return 0
