"""Desktop images built elsewhere (the Nix image's root.tar) registered where drumsd finds its own
builds: <images_dir>/<profile>-<name>/ with root/, manifest.tsv, apps.json and image.json.

image.json is written last and atomically: its presence means the image is whole, so a run that
died half-way starts over and a finished one is never touched again (checkpoints name its sha256).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from drumsd.linux.image import ImageBuildError, ImageInfo, Progress, find_image
from drumsd.linux.image_apps import probe_apps
from drumsd.linux.image_apps import write_manifest as write_app_manifest
from drumsd.linux.image_manifest import write_manifest

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def unpack_image(
    tar: Path, images_dir: Path, profile: str, name: str, progress: Progress = print
) -> ImageInfo:
    """Unpack `tar` (a root file system, owners numeric) as image `<profile>-<name>` under
    `images_dir`, or return it when an earlier run finished it."""
    for what, value in (("profile", profile), ("name", name)):
        if not _NAME.fullmatch(value):
            raise ImageBuildError(
                f"image {what} {value!r} is not a directory name (letters, digits, . _ + -)"
            )
    if not tar.is_file():
        raise ImageBuildError(
            f"no image tarball at {tar}; build it (nix build .#desktop-image) or name another"
        )
    final = images_dir / f"{profile}-{name}"
    if (final / "image.json").exists():
        return find_image(str(final), images_dir.parent)
    final.mkdir(parents=True, exist_ok=True)
    images_dir.chmod(0o755)
    final.chmod(0o755)
    partial = final / "root.partial"
    for stale in (partial, final / "root"):
        shutil.rmtree(stale, ignore_errors=True)
    partial.mkdir()
    progress(f"image: unpacking {tar} into {final / 'root'}")
    # GNU tar keeps the owners and modes the store cannot hold (uid 1000's home, /tmp's 1777).
    result = subprocess.run(
        ["tar", "-x", "-p", "--numeric-owner", "-f", str(tar), "-C", str(partial)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ImageBuildError(
            f"tar could not unpack {tar} into {partial} (exit {result.returncode}): "
            f"{result.stderr.strip()[-500:]}"
        )
    partial.chmod(0o755)
    os.replace(partial, final / "root")
    sha = write_manifest(final / "root", final / "manifest.tsv")
    write_app_manifest(final, probe_apps(final / "root", profile))
    meta = {
        "profile": profile,
        "key": name,
        "sha256": sha,
        "root": str(final / "root"),
        "builder": "tar",
        "source": str(tar),
    }
    partial_meta = final / "image.json.partial"
    partial_meta.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(partial_meta, final / "image.json")
    progress(f"image: {final / 'root'} sha256 {sha}")
    return find_image(str(final), images_dir.parent)
