"""The pinned OSWorld checkout: where its task files come from (config `tasks.osworld`).

Three ways, in this order: a configured directory (an offline copy, or Nix's fetcher output), a
fetched pin in the cache (`<cache_dir>/<sha256>/`, fetched by `drumsd tasks fetch-osworld` on a
host with network: the commit's tarball, checked against the sha256), or none, and the daemon runs
without OSWorld's tasks and says why in /v1/health. Only `evaluation_examples/` is kept: the task
files are data; no OSWorld code is unpacked.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from drumsd.core.config import OsworldConfig

from .coverage import examples_dir

MARKER = ".drums-osworld.json"
KEEP = "evaluation_examples"
FETCH_TIMEOUT_S = 120.0
MAX_TARBALL_BYTES = 2 * 2**30


class OsworldFetchError(RuntimeError):
    """The fetch failed or the tarball is not the pinned one; the message says which."""


@dataclass(frozen=True)
class OsworldSource:
    """Where the daemon takes OSWorld's tasks from, or why it has none."""

    state: str  # dir | pinned | not_fetched | missing | off
    tasks_dir: Path | None
    detail: str

    @property
    def configured(self) -> bool:
        return self.state != "off"

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "tasks_dir": str(self.tasks_dir) if self.tasks_dir else None,
            "detail": self.detail,
        }


def tarball_url(repository: str, commit: str) -> str:
    """GitHub serves any commit as `<repo>/archive/<commit>.tar.gz`."""
    return f"{repository}/archive/{commit}.tar.gz"


def pinned_dir(cfg: OsworldConfig) -> Path | None:
    return cfg.cache_dir / cfg.sha256 if cfg.sha256 else None


def _has_tasks(directory: Path) -> bool:
    return any(directory.rglob("*.json"))


def resolve_osworld(cfg: OsworldConfig) -> OsworldSource:
    """Which OSWorld tasks this host has (reads the configured dir and the cache only)."""
    if cfg.dir is not None:
        found = examples_dir(cfg.dir)
        if found.is_dir() and _has_tasks(found):
            return OsworldSource("dir", found, f"OSWorld tasks from the configured dir {found}")
        return OsworldSource(
            "missing",
            None,
            f"tasks.osworld.dir {cfg.dir} holds no task files (looked in {found}); running "
            "without OSWorld tasks",
        )
    pinned = pinned_dir(cfg)
    if pinned is None:
        return OsworldSource("off", None, "no OSWorld checkout configured (tasks.osworld)")
    marker = pinned / MARKER
    if marker.is_file():
        found = pinned / "examples"
        return OsworldSource(
            "pinned", found, f"OSWorld {cfg.commit} from {cfg.repository} (sha256 {cfg.sha256})"
        )
    return OsworldSource(
        "not_fetched",
        None,
        f"OSWorld {cfg.commit} is pinned but not in {cfg.cache_dir}; run `drumsd tasks "
        "fetch-osworld --config ...` on a host with network, or set tasks.osworld.dir to a "
        "copy; running without OSWorld tasks",
    )


def _download(url: str, dest: Path, timeout_s: float) -> str:
    """Stream `url` into `dest`; returns the sha256 of what arrived."""
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, dest.open("wb") as out:
            while chunk := response.read(1 << 20):
                size += len(chunk)
                if size > MAX_TARBALL_BYTES:
                    raise OsworldFetchError(f"{url} is larger than {MAX_TARBALL_BYTES} bytes")
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:  # URLError, timeouts, refused connections
        raise OsworldFetchError(f"cannot fetch {url}: {exc}") from exc
    return digest.hexdigest()


def _extract_examples(tarball: Path, dest: Path) -> int:
    """Unpack only `<top>/evaluation_examples/examples/**` into `dest` (data filter: no links
    out, no devices, no absolute paths). Returns the files written."""
    written = 0
    try:
        with tarfile.open(tarball, "r:*") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if len(parts) < 4 or parts[1] != KEEP or parts[2] != "examples":
                    continue
                if not (member.isfile() or member.isdir()):
                    continue
                member.name = str(PurePosixPath(*parts[3:]))
                tar.extract(member, dest, filter="data")
                written += member.isfile()
    except (tarfile.TarError, OSError) as exc:
        raise OsworldFetchError(f"cannot unpack {tarball}: {exc}") from exc
    return written


def fetch_osworld(
    cfg: OsworldConfig, url: str | None = None, timeout_s: float = FETCH_TIMEOUT_S
) -> Path:
    """Fetch the pinned commit's tarball, check its sha256, keep its task files in
    `<cache_dir>/<sha256>/examples`. Cached: a second call fetches nothing. `url` overrides the
    tarball's address (a mirror, or a file:// URL in tests)."""
    if not cfg.commit or not cfg.sha256:
        raise OsworldFetchError("tasks.osworld.commit and tasks.osworld.sha256 are not set")
    final = cfg.cache_dir / cfg.sha256
    if (final / MARKER).is_file():
        return final / "examples"
    url = url or tarball_url(cfg.repository, cfg.commit)
    cfg.cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{cfg.sha256[:16]}.", dir=cfg.cache_dir))
    try:
        tarball = staging / "osworld.tar.gz"
        got = _download(url, tarball, timeout_s)
        if got != cfg.sha256:
            raise OsworldFetchError(
                f"{url} has sha256 {got}, not the pinned {cfg.sha256}; refusing it (update the "
                "pin only after checking the commit)"
            )
        files = _extract_examples(tarball, staging / "examples")
        tarball.unlink()
        if not files:
            raise OsworldFetchError(f"{url} holds no {KEEP}/examples task files")
        marker = {"repository": cfg.repository, "commit": cfg.commit, "sha256": cfg.sha256}
        marker["files"] = files
        (staging / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        staging.chmod(0o755)
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final / "examples"


def add_fetch_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="the drumsd JSON config")
    parser.add_argument("--url", default=None, help="fetch the tarball from here instead")


def main_fetch(args: argparse.Namespace) -> int:
    from drumsd.linux.config_file import load_config_or_report

    config = load_config_or_report(args.config)
    if config is None:
        return 1
    cfg = config.tasks.osworld
    try:
        where = fetch_osworld(cfg, url=args.url)
    except OsworldFetchError as exc:
        print(f"drumsd tasks fetch-osworld: {exc}", file=sys.stderr)
        return 1
    print(f"OSWorld {cfg.commit}: task files in {where}")
    return 0
