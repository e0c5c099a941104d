"""Saves stored as what changed since their parent (issue 35), the OS half: a fresh dump's page
images reduced to the pages its parent does not hold (compared byte for byte, or as CRIU's memory
tracking marked them), its upper layer's unchanged files hard-linked to the parent's, and a delta
checkpoint's page images assembled for a restore (checked against what CRIU wrote: its size, and
its CRC where one was taken). Layout and rules: `drumsd.core.save_delta`."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import mmap
import os
import stat
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import zstandard

from drumsd.core.save_delta import (
    MANIFEST,
    PACK_SUFFIX,
    PAGE,
    SOURCES,
    Extent,
    Manifest,
    PageImage,
    TrackedPagemap,
    compose,
    compose_tracked,
    compressed,
    delta_depth,
    encode_pagemap,
    full_source,
    parse_pagemap,
    parse_tracked_pagemap,
    shared_ranges,
    slice_extents,
)

Buffer = bytes | bytearray | mmap.mmap
# A page image stored: its name, its extents, the ranges of CRIU's file of it for the pack
Stored = tuple[str, PageImage, list[tuple[int, int]]]

_CHUNK = 1 << 20
_BIG = 256 * PAGE  # compared at once: most of an image is equal
_BLOCK = 16 * PAGE  # within a big block that differs
# The pack: 20 MB of an office desktop's changed pages took 0.085 CPU-s at level 3 (3.9 MB)
# inside the comparison's thread; level 1 in zstd's own worker threads runs beside it.
_ZSTD_LEVEL = 1
_ZSTD_THREADS = 2
_CRC_ASIDE = True  # each image's CRC32 (2.7 GB/s, GIL released) beside its comparison


@dataclass(frozen=True)
class DeltaStats:
    """What a delta save stored, beside what a full one would have."""

    parent: str
    depth: int
    pages_bytes: int  # the page images as CRIU wrote them
    pages_fresh: int  # of which are not the parent's (in this save's pack)
    pages_stored: int  # the pack's bytes on disk (compressed)
    upper_bytes: int  # the upper layer's regular files
    upper_linked: int  # of which are hard links to the parent's
    diff_s: float
    diff_cpu_s: float  # of the thread that did it: what the comparison costs on an idle host

    def as_meta(self) -> dict[str, object]:
        return {
            "parent": self.parent,
            "depth": self.depth,
            "pages_bytes": self.pages_bytes,
            "pages_fresh": self.pages_fresh,
            "pages_stored": self.pages_stored,
            "upper_bytes": self.upper_bytes,
            "upper_linked": self.upper_linked,
            "diff_s": round(self.diff_s, 3),
            "diff_cpu_s": round(self.diff_cpu_s, 3),
        }


def is_delta(checkpoint: Path) -> bool:
    """Whether a checkpoint's page images are held as a delta (assembled for a restore)."""
    return (checkpoint / MANIFEST).exists()


def read_manifest(checkpoint: Path) -> Manifest | None:
    """A checkpoint's manifest; None for a full checkpoint. OSError or ValueError when broken."""
    try:
        text = (checkpoint / MANIFEST).read_text()
    except FileNotFoundError:
        return None
    return Manifest.from_json(json.loads(text))


class _Parent:
    """A parent checkpoint's page images, as extents and the files they name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.id = str(json.loads((root / "meta.json").read_text())["id"])
        self.manifest = read_manifest(root)
        self.depth = self.manifest.depth if self.manifest else 0

    def extents(self, image: str) -> list[Extent]:
        if self.manifest and image in self.manifest.images:
            return list(self.manifest.images[image].extents)
        size = (self.root / "images" / image).stat().st_size
        return [Extent(full_source(self.id, image), 0, size)] if size else []

    def path(self, source: str) -> Path:
        held = self.root / SOURCES / source
        if self.manifest and source in self.manifest.sources():
            return held
        return self.root / "images" / source.removeprefix(f"{self.id}.")


def store_delta(
    dest: Path, parent: Path, checkpoint_id: str, max_depth: int, *, upper: bool = True
) -> DeltaStats | None:
    """Store the fresh dump in `dest` as what changed since the checkpoint in `parent`: page
    images become extents over this save's own pack (its new pages, zstd-compressed) and the
    parent's files (hard-linked into `dest/pages/`), identical upper files hard links (with
    `upper` False the caller does that later with `link_upper`, after hashing the upper while
    the pages were compared). None (the dump left full) when the parent cannot serve as one or
    its chain is at `max_depth`."""
    t0, cpu0 = time.monotonic(), time.thread_time()
    try:
        par = _Parent(parent)
    except (OSError, ValueError, KeyError):
        return None
    depth = delta_depth(par.depth, max_depth)
    if depth is None:
        return None
    pack_name = f"{checkpoint_id}{PACK_SUFFIX}"
    try:
        manifest = _store_pages(dest, par, parent, pack_name, depth)
        pack = dest / SOURCES / pack_name
        stored = pack.stat().st_size if pack.exists() else 0
    except (OSError, zstandard.ZstdError):
        _discard_delta(dest)  # the dump is still whole: it stays a full checkpoint
        return None
    linked = link_unchanged(dest / "upper", parent / "upper") if upper else (0, 0)
    return _stats(par, depth, manifest, pack_name, stored, linked, t0, cpu0)


def _stats(
    par: _Parent,
    depth: int,
    manifest: Manifest,
    pack_name: str,
    stored: int,
    upper: tuple[int, int],
    t0: float,
    cpu0: float,
) -> DeltaStats:
    return DeltaStats(
        par.id,
        depth,
        sum(i.size for i in manifest.images.values()),
        manifest.stored_bytes(pack_name),
        stored,
        *upper,
        time.monotonic() - t0,
        time.thread_time() - cpu0,
    )


def link_upper(stats: DeltaStats, dest: Path, parent: Path) -> DeltaStats:
    """`store_delta(upper=False)`'s upper step: identical upper files hard-linked to the
    parent's, counted into `stats` (bytes and the comparison's time)."""
    t0, cpu0 = time.monotonic(), time.thread_time()
    upper_bytes, linked = link_unchanged(dest / "upper", parent / "upper")
    return dataclasses.replace(
        stats,
        upper_bytes=upper_bytes,
        upper_linked=linked,
        diff_s=stats.diff_s + time.monotonic() - t0,
        diff_cpu_s=stats.diff_cpu_s + time.thread_time() - cpu0,
    )


PARENT_LINK = "parent"  # what CRIU leaves in images/ given --prev-images-dir (CR_PARENT_LINK)


def tracked_parent_ok(parent: Path, max_depth: int, *, restored_from: str) -> bool:
    """Whether a dump of a tree armed when restored from checkpoint `restored_from` may track
    memory against the checkpoint in `parent` (CRIU given `parent/images` as --prev-images-dir)
    and `store_tracked` store it: it is that checkpoint and reads, its chain is below
    `max_depth`, its images/ holds pagemaps. A delta parent's images/ holds its whole pagemaps
    but not its pages images: CRIU reads only the pagemaps of a parent while dumping (a
    missing image opens as an empty one), so a chain of tracked saves writes only what each
    generation wrote (`tests/live/test_write_track_live.py`)."""
    try:
        par = _Parent(parent)
        pagemaps = any((parent / "images").glob("pagemap*.img"))
    except (OSError, ValueError, KeyError):
        return False
    if par.id != restored_from or not pagemaps:
        return False
    return delta_depth(par.depth, max_depth) is not None


def store_tracked(
    dest: Path, parent: Path, checkpoint_id: str, max_depth: int, *, upper: bool = True
) -> DeltaStats | None:
    """`store_delta` for a dump CRIU made tracking memory against `parent/images`: a page image
    with pages marked as the parent's is made whole without comparing (`compose_tracked`): its
    extents are the parent's files and this save's pack (all of CRIU's pages image of it), its
    pagemap rewritten as the whole image's, CRIU's partial pages image deleted; every other
    image is compared as `store_delta` does, and a dump marking no page as the parent's is
    stored exactly as `store_delta` stores it (None: left full). The `images/parent` link CRIU
    leaves goes. A dump with pages marked as the parent's restores only beside that parent's
    images as CRIU wrote it: when it cannot be stored against `parent` (unreadable, its chain
    at `max_depth`, a page the parent's pagemap lacks, a short file) ValueError or OSError
    names the dump and why; the caller discards it and dumps again without tracking."""
    t0, cpu0 = time.monotonic(), time.thread_time()
    tracked = _tracked_pagemaps(dest / "images")
    if not tracked:
        stats = store_delta(dest, parent, checkpoint_id, max_depth, upper=upper)
        (dest / "images" / PARENT_LINK).unlink(missing_ok=True)
        return stats
    why = (
        f"{dest}: the dump marks pages of {', '.join(sorted(tracked))} as the parent's, "
        f"but it cannot be stored against {parent}"
    )
    again = "as CRIU wrote it, it restores only beside that parent's images: dump again"
    link = dest / "images" / PARENT_LINK
    if link.is_symlink() and os.path.realpath(link) != os.path.realpath(parent / "images"):
        raise ValueError(f"{why}: CRIU tracked against {os.readlink(link)}; {again}")
    try:
        par = _Parent(parent)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{why}: it does not read ({exc!r}); {again}") from exc
    depth = delta_depth(par.depth, max_depth)
    if depth is None:
        raise ValueError(
            f"{why}: its chain is at depth {par.depth}, the bound is {max_depth} (track only "
            f"against a parent tracked_parent_ok accepts); {again}"
        )
    pack_name = f"{checkpoint_id}{PACK_SUFFIX}"
    try:
        manifest = _store_pages(dest, par, parent, pack_name, depth, tracked)
        pack = dest / SOURCES / pack_name
        stored = pack.stat().st_size if pack.exists() else 0
    except ValueError as exc:
        _discard_delta(dest)
        raise ValueError(f"{why}: {exc}; {again}") from exc
    except (OSError, zstandard.ZstdError) as exc:
        _discard_delta(dest)
        raise OSError(getattr(exc, "errno", None) or errno.EIO, f"{why}: {exc}; {again}") from exc
    link.unlink(missing_ok=True)
    linked = link_unchanged(dest / "upper", parent / "upper") if upper else (0, 0)
    return _stats(par, depth, manifest, pack_name, stored, linked, t0, cpu0)


def _tracked_pagemaps(images: Path) -> dict[str, TrackedPagemap]:
    """The pagemaps of a dump marking pages as the parent's, by file name. ValueError for one
    neither reader takes: it may mark some, and left as it is it would not restore."""
    out: dict[str, TrackedPagemap] = {}
    for path in sorted(images.glob("pagemap*.img")):
        data = path.read_bytes()
        try:
            pagemap = parse_tracked_pagemap(data, str(path))
        except ValueError as exc:
            try:  # one whose entries are all present or none's is store_delta's to leave
                parse_pagemap(data, str(path))
            except ValueError:
                raise exc from None
            continue
        if pagemap.in_parent:
            out[path.name] = pagemap
    return out


def _store_pages(
    dest: Path,
    par: _Parent,
    parent: Path,
    pack_name: str,
    depth: int,
    tracked: Mapping[str, TrackedPagemap] | None = None,
) -> Manifest:
    sources = dest / SOURCES
    sources.mkdir()
    images: dict[str, PageImage] = {}
    whole: dict[str, bytes] = {}  # a tracked image's pagemap rewritten, by file name
    zstd = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, threads=_ZSTD_THREADS)
    with (
        _Sources(par.path) as old,
        open(sources / pack_name, "wb") as raw,
        zstd.stream_writer(raw, closefd=False) as pack,
        ThreadPoolExecutor(1, thread_name_prefix="save-delta-crc") as aside,
    ):
        fresh = 0  # bytes written to the pack so far, uncompressed: the extents' offsets
        for pagemap in sorted((dest / "images").glob("pagemap*.img")):
            with _Sources(lambda name: dest / "images" / name) as new:
                stored: Stored | None
                if tracked and pagemap.name in tracked:
                    stored, whole[pagemap.name] = _store_tracked_image(
                        new, tracked[pagemap.name], pagemap.name, par, parent, pack_name, fresh
                    )
                else:
                    stored = _store_image(new, pagemap, par, parent, old, pack_name, fresh, aside)
                if stored is not None:
                    name, image, ranges = stored
                    for off, length in ranges:
                        pack.write(new[name][off : off + length])
                        fresh += length
                    images[name] = image
    manifest = Manifest(par.id, depth, images)
    for source in sorted(manifest.sources() - {pack_name}):
        os.link(par.path(source), sources / source)
    if pack_name not in manifest.sources():
        (sources / pack_name).unlink()
    for name, data in whole.items():
        (dest / "images" / f".{name}.tmp").write_bytes(data)
    tmp = dest / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest.to_json()))
    os.replace(tmp, dest / MANIFEST)
    for name in whole:  # the manifest holds the whole images they describe now
        os.replace(dest / "images" / f".{name}.tmp", dest / "images" / name)
    for name in images:  # the manifest holds them now
        (dest / "images" / name).unlink(missing_ok=True)  # a tracked one may be all the parent's
    return manifest


def _discard_delta(dest: Path) -> None:
    (dest / MANIFEST).unlink(missing_ok=True)
    (dest / f".{MANIFEST}.tmp").unlink(missing_ok=True)
    for tmp in (dest / "images").glob(".pagemap*.img.tmp"):
        tmp.unlink()
    if (dest / SOURCES).is_dir():
        for f in (dest / SOURCES).iterdir():
            f.unlink()
        (dest / SOURCES).rmdir()


def _store_image(
    images: _Sources,
    pagemap: Path,
    par: _Parent,
    parent: Path,
    old: _Sources,
    pack_name: str,
    pack_at: int,
    aside: Executor | None = None,
) -> Stored | None:
    """One page image (mapped from `images`) as extents, with the ranges of it to append to the
    pack (at `pack_at`, uncompressed); None: left as CRIU wrote it. Its CRC is taken in
    `aside` while the pages are compared here."""
    try:
        new = parse_pagemap(pagemap.read_bytes(), pagemap.name)
        data = images[new.pages_name]
    except (OSError, ValueError):
        return None
    if len(data) != new.size:
        return None  # not the layout parse_pagemap reads: keep CRIU's file
    crc = aside.submit(zlib.crc32, data) if aside is not None and _CRC_ASIDE else None
    try:
        reused: list[tuple[int, int, int]] = []
        parent_extents: list[Extent] = []
        try:
            before = parse_pagemap((parent / "images" / pagemap.name).read_bytes(), pagemap.name)
            parent_extents = par.extents(before.pages_name)
            if sum(e.length for e in parent_extents) == before.size:
                pairs = shared_ranges(new.runs, before.runs)
                reused = equal_pages(data, old, parent_extents, pairs)
        except (OSError, ValueError, zstandard.ZstdError):
            reused = []  # no such image in the parent, or unreadable: all pages are new
        extents, fresh = compose(new.size, reused, parent_extents, pack_name, pack_at)
        image = PageImage(new.size, crc.result() if crc else zlib.crc32(data), tuple(extents))
        return new.pages_name, image, fresh
    finally:  # the mapping stays open until its CRC is done, whatever happened here
        if crc is not None:
            crc.exception()


def _store_tracked_image(
    images: _Sources,
    tracked: TrackedPagemap,
    pagemap: str,
    par: _Parent,
    parent: Path,
    pack_name: str,
    pack_at: int,
) -> tuple[Stored, bytes]:
    """One page image CRIU wrote tracking memory, made whole over the parent's image (its
    pagemap of the same name): (its name, the image, the ranges of CRIU's pages image for the
    pack at `pack_at`) and its whole pagemap, encoded. ValueError or OSError when the parent
    cannot give the pages marked as its own, or CRIU's pages image is not what its pagemap says.
    No CRC: the whole image's would read every page of the parent's the tracking spared."""
    if tracked.fresh_size:
        held = len(images[tracked.pages_name])
        if held != tracked.fresh_size:
            raise ValueError(
                f"{tracked.pages_name} is {held} bytes, {pagemap} says {tracked.fresh_size}"
            )
    before = parse_pagemap(
        (parent / "images" / pagemap).read_bytes(), f"{parent / 'images' / pagemap}"
    )
    made = compose_tracked(tracked, before, par.extents(before.pages_name), pack_name, pack_at)
    image = PageImage(made.pagemap.size, None, made.extents)
    return (tracked.pages_name, image, list(made.fresh)), encode_pagemap(made.pagemap)


class _Sources:
    """The files extents name, each opened once: a raw file mapped, a pack decompressed."""

    def __init__(self, path_of: Callable[[str], Path]) -> None:
        self._path_of = path_of
        self._open: dict[str, mmap.mmap | bytes] = {}

    def __enter__(self) -> _Sources:
        return self

    def __exit__(self, *exc: object) -> None:
        for m in self._open.values():
            if isinstance(m, mmap.mmap):
                m.close()

    def __getitem__(self, source: str) -> mmap.mmap | bytes:
        if source not in self._open:
            path = self._path_of(source)
            with open(path, "rb") as f:
                if compressed(source):
                    self._open[source] = (
                        zstandard.ZstdDecompressor().decompressobj().decompress(f.read())
                    )
                else:
                    size = os.fstat(f.fileno()).st_size
                    self._open[source] = (
                        mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) if size else b""
                    )
        return self._open[source]


def equal_pages(
    new: Buffer,
    sources: Mapping[str, Buffer] | _Sources,
    parent: list[Extent],
    candidates: list[tuple[int, int, int]],
) -> list[tuple[int, int, int]]:
    """The pages of `candidates` (new offset, parent offset, bytes) equal in `new` and in the
    parent's image (its `parent` extents over `sources`), joined into runs: 256 pages at a time
    (a memcmp of two mapped ranges), then 16, then page by page within a block that differs."""
    out: list[tuple[int, int, int]] = []

    def same(a: int, b: int, n: int) -> None:
        if out and out[-1][0] + out[-1][2] == a and out[-1][1] + out[-1][2] == b:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + n)
        else:
            out.append((a, b, n))

    for new_off, old_off, length in candidates:
        a, b = new_off, old_off
        for piece in slice_extents(parent, old_off, length):
            src = sources[piece.source]
            for k in range(0, piece.length, _BIG):  # a big block, then blocks, then pages
                s, n = piece.offset + k, min(_BIG, piece.length - k)
                if new[a : a + n] == src[s : s + n]:
                    same(a, b, n)
                else:
                    _equal_blocks(new, src, a, b, s, n, same)
                a, b = a + n, b + n
    return out


def _equal_blocks(
    new: Buffer, src: Buffer, a: int, b: int, s: int, n: int, same: Callable[[int, int, int], None]
) -> None:
    for k in range(0, n, _BLOCK):
        m = min(_BLOCK, n - k)
        if new[a + k : a + k + m] == src[s + k : s + k + m]:
            same(a + k, b + k, m)
            continue
        for j in range(k, k + m, PAGE):
            if new[a + j : a + j + PAGE] == src[s + j : s + j + PAGE]:
                same(a + j, b + j, PAGE)


def assemble(checkpoint: Path, out: Path) -> int:
    """Write a delta checkpoint's page images into `out` (a copy of its images/), each checked
    against the size of the image CRIU wrote and its CRC where the manifest has one; the number
    written (0 for a full checkpoint).
    OSError naming the file when a source is missing or short, or an image does not check."""
    try:
        manifest = read_manifest(checkpoint)
    except ValueError as exc:
        raise OSError(errno.EINVAL, f"{checkpoint / MANIFEST}: {exc}") from None
    if manifest is None:
        return 0
    held = checkpoint / SOURCES
    fds: dict[str, int] = {}
    try:
        with _Sources(lambda s: held / s) as packs:
            for name, image in manifest.images.items():
                with open(out / name, "wb") as f:
                    for e in image.extents:
                        if compressed(e.source):
                            f.write(packs[e.source][e.offset : e.offset + e.length])
                        else:  # a page image: copied by the kernel
                            if e.source not in fds:
                                fds[e.source] = os.open(held / e.source, os.O_RDONLY)
                            f.flush()
                            _send(fds[e.source], f.fileno(), e, held)
                    f.flush()
                    size = f.tell()
                if size != image.size:
                    raise OSError(
                        errno.EIO,
                        f"{checkpoint}: page image {name} assembled from {MANIFEST} is {size} "
                        f"bytes, the dump's was {image.size}: a file under pages/ was changed",
                    )
                if image.crc32 is not None and _crc32(out / name, size) != image.crc32:
                    raise OSError(
                        errno.EIO,
                        f"{checkpoint}: page image {name} assembled from {MANIFEST} does not "
                        "match the dump's (CRC differs): a file under pages/ was changed",
                    )
    except zstandard.ZstdError as exc:
        raise OSError(errno.EIO, f"{held}: a pack does not decompress ({exc})") from None
    finally:
        for fd in fds.values():
            os.close(fd)
    return len(manifest.images)


def _crc32(path: Path, size: int) -> int:
    if not size:
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        return zlib.crc32(m)


def _send(src: int, dst: int, e: Extent, held: Path) -> None:
    done = 0
    while done < e.length:
        n = os.sendfile(dst, src, e.offset + done, e.length - done)
        if n == 0:
            raise OSError(errno.EIO, f"{held / e.source} ends before {e.offset + e.length}")
        done += n


def delta_problems(checkpoint: Path) -> list[str]:
    """What keeps a delta checkpoint's page images from being assembled ([] for a full one)."""
    try:
        manifest = read_manifest(checkpoint)
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST} cannot be read ({exc})"]
    if manifest is None:
        return []
    held = checkpoint / SOURCES
    ends: dict[str, int] = {}
    for image in manifest.images.values():
        for e in image.extents:
            ends[e.source] = max(ends.get(e.source, 0), e.offset + e.length)
    problems = []
    for source, end in sorted(ends.items()):
        try:
            size = (held / source).stat().st_size
        except OSError:
            problems.append(f"{SOURCES}/{source} is missing: {MANIFEST} names it")
            continue
        if not compressed(source) and size < end:  # a pack's length shows once decompressed
            problems.append(f"{SOURCES}/{source} is shorter than {MANIFEST} says ({end} bytes)")
    return problems


def link_unchanged(upper: Path, parent_upper: Path) -> tuple[int, int]:
    """Regular files of `upper` equal to the parent's at the same path (contents, mode, owner,
    mtime, xattrs) become hard links to the parent's: (bytes of upper's files, bytes linked).
    Files with holes are left (their copy is already cheap, reading one could be 8 TiB), and so
    are files linked within `upper`, and two files are never linked to one parent inode: the
    tree restores exactly as it was copied."""
    total = linked = 0
    used: set[int] = set()
    if not parent_upper.is_dir():
        return _regular_bytes(upper), 0
    # The parent's upper is an earlier desktop's tree: a directory of it may be a symlink the
    # agent made (to /etc, say); its path is followed to nothing outside that tree.
    beneath = os.path.realpath(parent_upper) + os.sep
    for dirpath, _, files in os.walk(upper):
        for name in files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode):
                continue
            total += st.st_size
            q = os.path.join(parent_upper, os.path.relpath(p, upper))
            if not os.path.realpath(q).startswith(beneath):
                continue
            try:
                pst = os.lstat(q)
            except OSError:
                continue
            try:
                if pst.st_ino in used or not _same_file(p, st, q, pst):
                    continue
            except OSError:  # the parent's file went meanwhile: keep the copy
                continue
            tmp = os.path.join(dirpath, f".{name}.drums-link")
            try:
                os.link(q, tmp)
                os.replace(tmp, p)
            except OSError:  # the copy stays: a link saves space, it is never needed
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                continue
            used.add(pst.st_ino)
            linked += st.st_size
    return total, linked


def _same_file(p: str, st: os.stat_result, q: str, pst: os.stat_result) -> bool:
    if not stat.S_ISREG(pst.st_mode) or st.st_nlink != 1:
        return False
    if st.st_blocks * 512 < st.st_size:  # holes: leave to cp's sparse copy
        return False
    head = ("st_size", "st_mode", "st_uid", "st_gid", "st_mtime_ns")
    if any(getattr(st, k) != getattr(pst, k) for k in head):
        return False
    mine = _xattrs(p)
    if mine is None or mine != _xattrs(q):
        return False
    with open(p, "rb") as a, open(q, "rb") as b:
        while True:
            x, y = a.read(_CHUNK), b.read(_CHUNK)
            if x != y:
                return False
            if not x:
                return True


def _xattrs(path: str) -> dict[str, bytes] | None:
    try:
        names = os.listxattr(path, follow_symlinks=False)
        return {n: os.getxattr(path, n, follow_symlinks=False) for n in names}
    except OSError:
        return None


def _regular_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total
