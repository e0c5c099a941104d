"""Saves stored as what changed since their parent checkpoint (issue 35), the pure half: CRIU's
pagemap images read, the address ranges a new dump shares with its parent's found, and the
manifest saying where every byte of each page image lives.

This kernel has no soft-dirty tracking, so CRIU writes every page at each dump; what is stored is
then reduced by content: a page equal to the parent's at the same address is not stored again but
referenced in a file the parent holds. Every reference is flattened to the files holding the
bytes (hard links in the checkpoint's own `pages/`), so a checkpoint never reads its parent's
directory at restore and deleting a parent leaves its children whole. The depth bound keeps the
number of files a page image is spread over, and the dead pages they pin, bounded."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drumsd.core.criu_wire import image_messages, read_varint

PAGE = 4096
MANIFEST = "pages.json"  # in the checkpoint dir, beside images/ (absent: a full checkpoint)
SOURCES = "pages"  # the checkpoint's dir of the files its extents name
PACK_SUFFIX = ".pack.zst"  # the pages a delta save stores itself, one zstd stream
MANIFEST_VERSION = 1

# pagemap_entry flags (CRIU's images/pagemap.proto, criu/include/pagemap.h)
PE_PARENT = 1 << 0
PE_PRESENT = 1 << 2


@dataclass(frozen=True)
class Run:
    """Present pages of one pagemap entry and where they start in its pages image."""

    vaddr: int
    pages: int
    offset: int


@dataclass(frozen=True)
class Pagemap:
    pages_id: int  # the pages image is pages-<pages_id>.img
    runs: tuple[Run, ...]

    @property
    def pages_name(self) -> str:
        return f"pages-{self.pages_id}.img"

    @property
    def size(self) -> int:
        return sum(r.pages for r in self.runs) * PAGE


def _varint_fields(message: bytes, what: str) -> dict[int, int]:
    fields: dict[int, int] = {}
    i = 0
    while i < len(message):
        key, i = read_varint(message, i)
        if key & 7 != 0:
            raise ValueError(f"{what}: unexpected wire type {key & 7}")
        fields[key >> 3], i = read_varint(message, i)
    return fields


def parse_pagemap(data: bytes, what: str = "pagemap") -> Pagemap:
    """A CRIU pagemap image: PagemapHead {1 pages_id}, then PagemapEntry {1 vaddr,
    2 compat_nr_pages, 3 in_parent, 4 flags, 5 nr_pages}. Only present entries hold pages in
    the pages image, in order. An entry already in a parent image is refused (ValueError): such
    a dump was made against CRIU's own parent images, which this store does not keep."""
    messages = image_messages(data, what)
    head = next(messages, None)
    if head is None:
        raise ValueError(f"{what} has no head entry")
    pages_id = _varint_fields(head, what).get(1)
    if pages_id is None:
        raise ValueError(f"{what}: head without pages_id")
    runs: list[Run] = []
    offset = 0
    for message in messages:
        f = _varint_fields(message, what)
        flags = f.get(4, PE_PRESENT)
        if f.get(3) or flags & PE_PARENT:
            raise ValueError(f"{what}: an entry is in a parent image")
        pages = f.get(5, f.get(2, 0))
        if flags & PE_PRESENT and pages:
            runs.append(Run(f.get(1, 0), pages, offset))
            offset += pages * PAGE
    return Pagemap(pages_id, tuple(runs))


def shared_ranges(new: Sequence[Run], parent: Sequence[Run]) -> list[tuple[int, int, int]]:
    """(offset in the new pages image, offset in the parent's, bytes) of every address range both
    hold: the pages that may be reused, to be compared by content."""
    out: list[tuple[int, int, int]] = []
    a, b = sorted(new, key=lambda r: r.vaddr), sorted(parent, key=lambda r: r.vaddr)
    i = j = 0
    while i < len(a) and j < len(b):
        x, y = a[i], b[j]
        x_end, y_end = x.vaddr + x.pages * PAGE, y.vaddr + y.pages * PAGE
        lo, hi = max(x.vaddr, y.vaddr), min(x_end, y_end)
        if lo < hi:
            out.append((x.offset + lo - x.vaddr, y.offset + lo - y.vaddr, hi - lo))
        if x_end <= y_end:
            i += 1
        else:
            j += 1
    return out


@dataclass(frozen=True)
class Extent:
    source: str  # a file in the checkpoint's pages/ dir
    offset: int
    length: int


def merge(extents: Sequence[Extent]) -> list[Extent]:
    """Neighbours that continue each other in the same source joined."""
    out: list[Extent] = []
    for e in extents:
        if e.length <= 0:
            continue
        last = out[-1] if out else None
        if last and last.source == e.source and last.offset + last.length == e.offset:
            out[-1] = Extent(e.source, last.offset, last.length + e.length)
        else:
            out.append(e)
    return out


def slice_extents(extents: Sequence[Extent], offset: int, length: int) -> list[Extent]:
    """Bytes [offset, offset + length) of the file `extents` make, as extents of its sources."""
    starts, at = [], 0
    for e in extents:
        starts.append(at)
        at += e.length
    if offset < 0 or offset + length > at:
        raise ValueError(f"range {offset}+{length} is outside a file of {at} bytes")
    out: list[Extent] = []
    k = bisect.bisect_right(starts, offset) - 1
    while length > 0:
        e, into = extents[k], offset - starts[k]
        take = min(length, e.length - into)
        out.append(Extent(e.source, e.offset + into, take))
        offset, length, k = offset + take, length - take, k + 1
    return out


def compose(
    size: int,
    reused: Sequence[tuple[int, int, int]],
    parent: Sequence[Extent],
    pack: str,
    pack_offset: int,
) -> tuple[list[Extent], list[tuple[int, int]]]:
    """The extents of a new page image of `size` bytes whose `reused` ranges (new offset, parent
    offset, bytes; not overlapping) are the parent's (file `parent`), the rest appended to
    `pack` from `pack_offset` on; and the (offset, length) ranges of the new image to append."""
    extents: list[Extent] = []
    fresh: list[tuple[int, int]] = []
    at = 0

    def store(upto: int) -> None:
        nonlocal at, pack_offset
        if upto > at:
            extents.append(Extent(pack, pack_offset, upto - at))
            fresh.append((at, upto - at))
            pack_offset += upto - at
            at = upto

    for new_off, parent_off, length in sorted(reused):
        if new_off < at:
            raise ValueError(f"reused ranges overlap at offset {new_off}")
        store(new_off)
        extents += slice_extents(parent, parent_off, length)
        at = new_off + length
    store(size)
    return merge(extents), merge_ranges(fresh)


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, length in ranges:
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + length)
        elif length:
            out.append((off, length))
    return out


def delta_depth(parent_depth: int, max_depth: int) -> int | None:
    """The depth of a save stored against a parent at `parent_depth` (0: a full checkpoint), or
    None: store it full (max_depth 0 turns deltas off; a chain at its bound starts again)."""
    depth = parent_depth + 1
    return depth if depth <= max_depth else None


@dataclass(frozen=True)
class PageImage:
    size: int
    crc32: int  # of the whole image as CRIU wrote it: the assembled copy is checked against it
    extents: tuple[Extent, ...]


@dataclass(frozen=True)
class Manifest:
    parent: str  # the checkpoint it was stored against
    depth: int  # 1 for a save stored against a full checkpoint
    images: Mapping[str, PageImage]

    def sources(self) -> set[str]:
        return {e.source for img in self.images.values() for e in img.extents}

    def stored_bytes(self, own: str) -> int:
        """Bytes of the page images held in this save's own pack `own` (uncompressed)."""
        return sum(e.length for i in self.images.values() for e in i.extents if e.source == own)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "parent": self.parent,
            "depth": self.depth,
            "images": {
                name: {
                    "size": img.size,
                    "crc32": img.crc32,
                    "extents": [[e.source, e.offset, e.length] for e in img.extents],
                }
                for name, img in sorted(self.images.items())
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """The manifest, or ValueError saying what is wrong with it."""
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise ValueError(f"{MANIFEST} is not a version {MANIFEST_VERSION} manifest")
        images: dict[str, PageImage] = {}
        for name, img in dict(data.get("images") or {}).items():
            if not _plain_name(name):
                raise ValueError(f"{MANIFEST}: image name {name!r} is not a file name")
            extents = tuple(Extent(str(s), int(o), int(n)) for s, o, n in img["extents"])
            bad = [e.source for e in extents if not _plain_name(e.source)]
            if bad or any(e.offset < 0 or e.length <= 0 for e in extents):
                raise ValueError(f"{MANIFEST}: {name} has a bad extent ({bad or 'range'})")
            size = int(img["size"])
            if sum(e.length for e in extents) != size:
                raise ValueError(f"{MANIFEST}: the extents of {name} do not add up to {size}")
            images[name] = PageImage(size, int(img["crc32"]), extents)
        return cls(str(data["parent"]), int(data["depth"]), images)


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name


def compressed(source: str) -> bool:
    """A source holding its bytes zstd-compressed (extents address them uncompressed)."""
    return source.endswith(".zst")


def full_source(checkpoint_id: str, image: str) -> str:
    """The name a full checkpoint's page image takes in a child's pages/ dir."""
    return f"{checkpoint_id}.{image}"
