"""The image cache: a checkpoint's CRIU images on tmpfs for its restores (a restore that reads
disk is 3x slower). Images already on tmpfs are used in place; others are copied once into the
runtime's own tmpfs, and a copy with a rewritten userns image is made once per uid range."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from drumsd.core.seams import CheckpointRef, RuntimeError_
from drumsd.linux import slot_fs
from drumsd.runtime.linux.uids import UidRanges

# (images, cache dir, key, tmpfs MiB) -> the copy: `slot_fs.cache_images` (mounts the tmpfs).
CopyImages = Callable[[Path, Path, str, int], Path]


class ImageCache:
    def __init__(
        self, cache_dir: Path, tmpfs_mib: int, copy: CopyImages = slot_fs.cache_images
    ) -> None:
        self.cache_dir = cache_dir
        self._tmpfs_mib = tmpfs_mib
        self._copy = copy
        self._copies: dict[str, Path] = {}  # cache key (checkpoint id, inode, mtime) -> copy
        self._lock = trio.Lock()  # one copy or map variant made at a time

    def copies(self) -> dict[str, Path]:
        return dict(self._copies)

    async def images_for(self, checkpoint: CheckpointRef, uid_index: int | None) -> Path:
        """The checkpoint's images with the userns map of uid range `uid_index` (a dir of hard
        links and a rewritten userns image next to the images, when the dump's map differs)."""
        images, probe = await self._images_of(checkpoint)
        extents = UidRanges.id_map(uid_index)
        if probe.uid_map is None or probe.uid_map == tuple(extents):
            return images
        tag = "identity" if uid_index is None else str(uid_index)
        variant = images.parent / f".{images.name}-map-{tag}"
        if not slot_fs.exists(variant):
            async with self._lock:
                await trio.to_thread.run_sync(slot_fs.ensure_map_variant, images, variant, extents)
        return variant

    async def _images_of(self, checkpoint: CheckpointRef) -> tuple[Path, slot_fs.ImageProbe]:
        images = checkpoint.dir / "images"
        probe = await trio.to_thread.run_sync(slot_fs.probe_images, checkpoint.id, images)
        if not probe.present:
            raise RuntimeError_(
                "restore_failed",
                f"checkpoint {checkpoint.id}: no CRIU images at {images}; re-create the "
                "checkpoint (make_template or capture)",
            )
        if probe.on_tmpfs and not probe.delta:  # a delta's pages are assembled in a copy
            return images, probe
        async with self._lock:
            if probe.cache_key not in self._copies:
                try:
                    self._copies[probe.cache_key] = await trio.to_thread.run_sync(
                        self._copy, images, self.cache_dir, probe.cache_key, self._tmpfs_mib
                    )
                except OSError as exc:  # shutil.Error too: a file vanished mid-copy
                    raise RuntimeError_(
                        "restore_failed",
                        f"checkpoint {checkpoint.id}: its CRIU images could not be copied to "
                        f"the image cache (was the checkpoint deleted meanwhile?): "
                        f"{_first_line(exc)}",
                        checkpoint=checkpoint.id,
                    ) from exc
            return self._copies[probe.cache_key], probe

    async def forget(self, checkpoint_id: str) -> None:
        """A checkpoint deleted or replaced: its copies go (they hold its memory in RAM)."""
        for key in [k for k in self._copies if k.rsplit("-", 2)[0] == checkpoint_id]:
            path = self._copies.pop(key)
            await trio.to_thread.run_sync(slot_fs.remove_image_copies, path)

    def drop(self) -> None:
        """Blocking: the whole cache and its tmpfs (when no slot is left to restore)."""
        slot_fs.drop_image_cache(self.cache_dir)
        self._copies.clear()


def _first_line(exc: OSError) -> str:
    """One line of a copy's error (shutil.Error carries one tuple per file that failed)."""
    if exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        first = exc.args[0][0]
        return f"{first[2]} (and {len(exc.args[0]) - 1} more)"
    return str(exc)
