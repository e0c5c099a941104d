"""The supervisor's file work on state_dir, images_dir and adopted checkpoints, synchronous (the
runtime calls these through trio.to_thread): sizes, free space, removal, metadata reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from drumsd.core.records import KnownImage
from drumsd.core.results import SpaceReport
from drumsd.linux import trees
from drumsd.linux.host_sampler import read_space
from drumsd.linux.sparse import NEVER, CancelFlag, Usage


def dir_usage(path: Path, cancel: CancelFlag = NEVER) -> Usage:
    """Allocated and apparent bytes of the regular files under `path` (a checkpoint dir) that
    it alone holds: a sparse file counts what it holds (see `drumsd.linux.sparse`), and a file
    hard-linked from another checkpoint (a delta save's share of its parent) nothing."""
    return trees.own_usage(path, cancel)


def upper_usage(upper: Path, cancel: CancelFlag = NEVER) -> Usage:
    """What a slot's upper layer holds (nothing when it has none on this host)."""
    return trees.tree_usage(upper, cancel) if upper.is_dir() else Usage()


def space(path: Path) -> SpaceReport | None:
    """Free and total MiB of the filesystem holding `path`, or None when it cannot be read."""
    free, total = read_space(path)
    if free is None or total is None:
        return None
    return SpaceReport(
        path=str(path),
        free_mib=free,
        total_mib=total,
        free_pct=100.0 * free / total if total else 0.0,
    )


def remove_tree(path: Path) -> None:
    """Remove a checkpoint directory; what cannot be removed is left for the next sweep."""
    shutil.rmtree(path, ignore_errors=True)


def file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def read_checkpoint_meta(path: Path) -> dict[str, Any]:
    """`<path>/meta.json` of a checkpoint dir to adopt. Raises OSError or ValueError (bad JSON)."""
    return json.loads((path / "meta.json").read_text())


def known_images(images_dir: Path) -> dict[str, KnownImage]:
    """Every image the builder left under `images_dir`, by sha256."""
    out: dict[str, KnownImage] = {}
    for meta_path in images_dir.glob("*/image.json"):
        try:
            meta = json.loads(meta_path.read_text())
            sha = meta.get("sha256") or meta.get("image_sha256")
            root = Path(meta.get("root") or meta_path.parent / "root")
            guest = meta.get("guest_sha256")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(sha, str) and sha and root.is_dir():
            out[sha] = KnownImage(str(root), guest if isinstance(guest, str) else None)
    return out


def find_image(images_dir: Path, name: str) -> tuple[Path, str] | None:
    """(root, sha256) of image `name`: the builder points `<images_dir>/<name>` at the current
    build; else the newest `<name>-*` build."""
    current = images_dir / name / "image.json"
    paths = [current] if current.exists() else []
    paths = paths or list(images_dir.glob(f"{name}-*/image.json"))
    candidates = []
    for meta_path in paths:
        try:
            meta = json.loads(meta_path.read_text())
            sha = str(meta.get("sha256") or meta.get("image_sha256"))
            root = Path(meta.get("root") or meta_path.parent / "root")
            candidates.append((meta_path.stat().st_mtime, root, sha))
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
    if not candidates:
        return None
    _, root, sha = max(candidates, key=lambda c: c[0])
    return root, sha


def sweep_unowned_dirs(root: Path, keep: set[Path], spare_prefixes: tuple[str, ...]) -> list[str]:
    """Remove the directories under `root` that no record names (a capture killed with the
    daemon before its record was written leaves one); names starting with `spare_prefixes`
    belong to other tools (`drumsd bench`) and stay. Returns the names removed."""
    if not root.is_dir():
        return []
    kept = {p.resolve() for p in keep}
    removed: list[str] = []
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.is_symlink() or child.name.startswith(spare_prefixes):
            continue
        if child.resolve() in kept:
            continue
        remove_tree(child)
        removed.append(child.name)
    return removed
