"""An instance's files on the host, synchronous (the Linux runtime calls these through
trio.to_thread): its directory under `state_dir/slots/<iid>` with `owner.json`, its tmpfs, upper
copy and overlay root (idmapped in the hardened profile), and the runtime's tmpfs copy of CRIU
images."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drumsd.linux import idmap, mounts, save_delta, sparse, trees, upper_links
from drumsd.linux.exec_helper import overlay_as_argv

# ------------------------------------------------------------------ owner.json


def read_owner_record(d: Path) -> dict[str, Any]:
    try:
        record = json.loads((d / "owner.json").read_text())
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def write_owner(
    paths: mounts.SlotPaths,
    owner: str | None,
    uid_index: int | None = None,
    init: tuple[int, int] | None = None,
) -> None:
    """owner.json: who the instance serves, hardened its uid range, and its init (pid,
    starttime) so a sweep can kill it even if its cgroups moved (kept across claims)."""
    record = read_owner_record(paths.dir)
    if owner is not None:
        record["owner"] = owner
    if uid_index is not None:
        record["uid_index"] = uid_index
    if init is not None:
        record["init"] = list(init)
    tmp = paths.dir / "owner.json.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, paths.dir / "owner.json")


def read_owner(d: Path) -> str | None:
    owner = read_owner_record(d).get("owner")
    return str(owner) if owner is not None else None


def held_uid_ranges(slots_dir: Path) -> set[int]:
    """Create `slots_dir` if needed; the uid ranges its instance dirs hold (a previous daemon's
    slots hold theirs until swept)."""
    slots_dir.mkdir(parents=True, exist_ok=True)
    held: set[int] = set()
    for d in slots_dir.iterdir():
        index = read_owner_record(d).get("uid_index")
        if isinstance(index, int):
            held.add(index)
    return held


def instance_names(slots_dir: Path) -> list[str]:
    """The instance dirs under `slots_dir` (none if it does not exist)."""
    return [d.name for d in slots_dir.iterdir()] if slots_dir.is_dir() else []


# ------------------------------------------------------------------ file systems


def make_instance_dir(
    state_dir: Path, iid: str, owner: str, uid_index: int | None
) -> mounts.SlotPaths:
    paths = mounts.SlotPaths.of(state_dir, iid)
    paths.dir.mkdir(parents=True, exist_ok=False)
    write_owner(paths, owner, uid_index)
    return paths


def build_fs(
    paths: mounts.SlotPaths,
    upper_src: Path | None,
    lower: Sequence[Path],
    tmpfs_mib: int,
    uid_index: int | None,
    userns_of: Callable[[int], int],
    helper: Path | None,
) -> None:
    """The instance's tmpfs with a copy of the upper snapshot and the overlay root. Hardened:
    the image and the tmpfs are seen through idmapped binds of the slot's uid range (files
    on disk keep in-slot ids) and the overlay is mounted acting as the range's root. On a
    failure the caller tears down what was made (`teardown_fs`)."""
    mounts.apply(mounts.plan_rw(paths, tmpfs_mib))
    if upper_src is not None and upper_src.is_dir():
        trees.copy_tree(upper_src, paths.upper)
        # Before anything of the slot runs: a delta save links the files still as recorded.
        # Without a record (it failed) a save copies the upper whole, as before.
        with contextlib.suppress(OSError):
            upper_links.record_restored(paths.upper, upper_src, paths.dir / upper_links.RECORD_NAME)
    (paths.rw / "criu").mkdir()
    if uid_index is None:
        mounts.apply(mounts.plan_overlay(paths, lower))
        return
    ns = userns_of(uid_index)
    mapped: list[Path] = []
    for i, layer in enumerate(lower):
        target = paths.dir / f"lower{i}"
        target.mkdir()
        idmap.idmapped_bind(layer, target, ns, readonly=True)
        mapped.append(target)
    rwi = paths.dir / "rw-idmap"
    rwi.mkdir()
    idmap.idmapped_bind(paths.rw, rwi, ns, readonly=False)
    opts = mounts.overlay_options(mapped, rwi / "upper", rwi / "work")
    proc = subprocess.run(
        overlay_as_argv(helper, idmap.uid_base(uid_index), paths.root, opts),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise OSError(f"overlay for {paths.dir.name} failed: {proc.stderr.strip()}")


def teardown_fs(paths: mounts.SlotPaths) -> int | None:
    """Unmount and remove the instance dir; the uid range its owner.json named (to release)."""
    index = read_owner_record(paths.dir).get("uid_index")
    for m in mounts.mounts_under(paths.dir):
        mounts.apply([mounts.MountOp("umount", m)])
    shutil.rmtree(paths.dir, ignore_errors=True)
    return index if isinstance(index, int) else None


# ------------------------------------------------------------------ CRIU images on tmpfs


@dataclass(frozen=True)
class ImageProbe:
    """What a restore needs to know of a checkpoint's images before using them (one look, so a
    restore pays one worker-thread round trip for it)."""

    present: bool
    on_tmpfs: bool = False
    cache_key: str = ""  # names this version of the images (a rewritten checkpoint: a new key)
    uid_map: tuple[tuple[int, int, int], ...] | None = None  # None: no user namespace image
    delta: bool = False  # page images held as a delta (`save_delta`): assembled by the copy


def probe_images(checkpoint_id: str, images: Path) -> ImageProbe:
    try:
        st = (images / "inventory.img").stat()
    except FileNotFoundError:
        return ImageProbe(False)
    return ImageProbe(
        True,
        mounts.fs_type_of(images) == "tmpfs",
        f"{checkpoint_id}-{st.st_ino}-{st.st_mtime_ns}",
        userns_uid_map(images),
        save_delta.is_delta(images.parent),
    )


def cache_images(images: Path, cache: Path, key: str, tmpfs_mib: int) -> Path:
    """Copy `images` once into the runtime's tmpfs `cache` (mounted on first use) as `key`."""
    cache.mkdir(parents=True, exist_ok=True)
    if mounts.fs_type_of(cache) != "tmpfs":
        mounts.apply(
            [
                mounts.MountOp(
                    "mount",
                    str(cache),
                    source="drums-images",
                    fstype="tmpfs",
                    data=f"size={tmpfs_mib}m,mode=700",
                )
            ]
        )
    dest = cache / key
    if not dest.exists():
        tmp = cache / f"{key}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(images, tmp, copy_function=sparse.copy_path)  # holes stay holes
            save_delta.assemble(images.parent, tmp)  # a delta's page images, whole again
        except OSError:  # the checkpoint deleted while copied: no half copy left in RAM
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        os.replace(tmp, dest)
    return dest


def userns_uid_map(images: Path) -> tuple[tuple[int, int, int], ...] | None:
    """The uid map the images' userns image holds, or None when they have no user namespace."""
    userns_imgs = sorted(images.glob("userns-*.img"))
    if not userns_imgs:
        return None
    return tuple(idmap.decode_userns_image(userns_imgs[0].read_bytes()).uid_map)


def exists(path: Path) -> bool:
    """A stat on the runtime's own tmpfs (microseconds: called inline)."""
    return path.exists()


def is_dir(path: Path) -> bool:
    """A stat of a path on disk (an image's lower layer): call it in a worker thread."""
    return path.is_dir()


def ensure_map_variant(
    images: Path, variant: Path, extents: Sequence[tuple[int, int, int]]
) -> None:
    if not variant.exists():
        idmap.images_for_map(images, variant, extents)


def drop_image_cache(cache: Path) -> None:
    if cache.is_dir() and mounts.fs_type_of(cache) == "tmpfs":
        mounts.apply([mounts.MountOp("umount", str(cache))])
    shutil.rmtree(cache, ignore_errors=True)


def remove_image_copies(path: Path) -> None:
    """A cached copy of a checkpoint's images and its id-map variants."""
    for d in [path, *path.parent.glob(f".{path.name}-map-*")]:
        shutil.rmtree(d, True)
