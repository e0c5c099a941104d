"""Saves stored as what changed since their parent checkpoint (issue 35), the pure half: CRIU's
pagemap images read, the address ranges a new dump shares with its parent's found, and the
manifest saying where every byte of each page image lives.

This kernel has no soft-dirty tracking, so a plain dump holds every page; what is stored is then
reduced by content: a page equal to the parent's at the same address is not stored again but
referenced in a file the parent holds. drums' CRIU can instead track writes since the restore
(--track-mem-uffd-wp): the pages not written are marked as the parent's and left out of its pages
image, and the whole image is composed from the parent's without comparing (`compose_tracked`).
Every reference is flattened to the files holding the bytes (hard links in the checkpoint's own
`pages/`), so a checkpoint never reads its parent's directory at restore and deleting a parent
leaves its children whole. The depth bound keeps the number of files a page image is spread over,
and the dead pages they pin, bounded."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drumsd.core.criu_wire import (
    PAGEMAP_MAGIC,
    image_bytes,
    image_messages,
    read_varint,
    varint_message,
)

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


def _pagemap_entries(data: bytes, what: str) -> tuple[int, list[tuple[int, int, int]]]:
    """A CRIU pagemap image's pages_id and entries (vaddr, pages, flags): PagemapHead
    {1 pages_id}, then PagemapEntry {1 vaddr, 2 compat_nr_pages, 3 in_parent, 4 flags,
    5 nr_pages}. An old image's in_parent reads as PE_PARENT and no flags as PE_PRESENT, as
    CRIU reads them (its init_compat_pagemap_entry)."""
    messages = image_messages(data, what)
    head = next(messages, None)
    if head is None:
        raise ValueError(f"{what} has no head entry")
    pages_id = _varint_fields(head, what).get(1)
    if pages_id is None:
        raise ValueError(f"{what}: head without pages_id")
    entries = []
    for message in messages:
        f = _varint_fields(message, what)
        flags = (f.get(4, 0) | PE_PARENT) if f.get(3) else f.get(4, PE_PRESENT)
        entries.append((f.get(1, 0), f.get(5, f.get(2, 0)), flags))
    return pages_id, entries


def parse_pagemap(data: bytes, what: str = "pagemap") -> Pagemap:
    """A CRIU pagemap image (`_pagemap_entries`). Only present entries hold pages in the pages
    image, in order. An entry already in a parent image is refused (ValueError): such a dump is
    read with `parse_tracked_pagemap`, and made whole before it is compared."""
    pages_id, entries = _pagemap_entries(data, what)
    runs: list[Run] = []
    offset = 0
    for vaddr, pages, flags in entries:
        if flags & PE_PARENT:
            raise ValueError(f"{what}: an entry is in a parent image")
        if flags & PE_PRESENT and pages:
            runs.append(Run(vaddr, pages, offset))
            offset += pages * PAGE
    return Pagemap(pages_id, tuple(runs))


def encode_pagemap(pagemap: Pagemap) -> bytes:
    """`pagemap` as a CRIU pagemap image, every entry present: what `parse_pagemap` reads back
    as the same runs. The image holds no offsets, so each run must start where the one before
    it ends in the pages image (ValueError otherwise). compat_nr_pages is written too: protobuf
    requires it, and a reader that knows only it gets the count."""
    messages = [varint_message([(1, pagemap.pages_id)])]
    offset = 0
    for r in pagemap.runs:
        if r.offset != offset or r.pages <= 0:
            raise ValueError(f"run at {r.vaddr:#x}: not the next {r.pages} pages of the image")
        compat = r.pages if r.pages < 1 << 32 else 0
        messages.append(varint_message([(1, r.vaddr), (2, compat), (4, PE_PRESENT), (5, r.pages)]))
        offset += r.pages * PAGE
    return image_bytes(PAGEMAP_MAGIC, messages)


@dataclass(frozen=True)
class Entry:
    """One entry of a pagemap written with memory tracking."""

    vaddr: int
    pages: int
    in_parent: bool  # its pages are the parent's; else the next ones of the dump's pages image


@dataclass(frozen=True)
class TrackedPagemap:
    """A pagemap CRIU wrote tracking memory against the parent's images (--prev-images-dir): the
    pages not written since the restore are entries in the parent, left out of its pages image."""

    pages_id: int
    entries: tuple[Entry, ...]

    @property
    def pages_name(self) -> str:
        return f"pages-{self.pages_id}.img"

    @property
    def in_parent(self) -> bool:
        return any(e.in_parent for e in self.entries)

    @property
    def fresh_size(self) -> int:
        """Bytes of the pages image CRIU wrote: the entries not in the parent."""
        return sum(e.pages for e in self.entries if not e.in_parent) * PAGE


def parse_tracked_pagemap(data: bytes, what: str = "pagemap") -> TrackedPagemap:
    """A CRIU pagemap image (`_pagemap_entries`) whose entries may be in the parent (PE_PARENT,
    or an old image's in_parent). PE_LAZY beside PE_PRESENT is present. ValueError for an entry
    that is both in the parent and present, or neither (a lazy dump's, served by a page
    server): the whole image made from it could not say where those pages are."""
    pages_id, raw = _pagemap_entries(data, what)
    entries: list[Entry] = []
    for vaddr, pages, flags in raw:
        if not pages:
            continue
        in_parent, present = bool(flags & PE_PARENT), bool(flags & PE_PRESENT)
        if in_parent == present:
            how = "both present and in" if present else "neither present nor in"
            raise ValueError(f"{what}: the entry at {vaddr:#x} is {how} a parent image")
        entries.append(Entry(vaddr, pages, in_parent))
    return TrackedPagemap(pages_id, tuple(entries))


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


def slice_extents(
    extents: Sequence[Extent], offset: int, length: int, starts: Sequence[int] | None = None
) -> list[Extent]:
    """Bytes [offset, offset + length) of the file `extents` make, as extents of its sources.
    `starts`: where each extent starts in the file (`extent_starts`), when slicing it often."""
    starts = extent_starts(extents) if starts is None else starts
    at = starts[-1] + extents[-1].length if extents else 0
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


def extent_starts(extents: Sequence[Extent]) -> list[int]:
    starts, at = [], 0
    for e in extents:
        starts.append(at)
        at += e.length
    return starts


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


@dataclass(frozen=True)
class TrackedImage:
    """A tracked dump's page image made whole: what a full dump would have written, held as
    extents over the parent's files and the pack."""

    pagemap: Pagemap  # every entry present, over the whole image (`encode_pagemap` writes it)
    extents: tuple[Extent, ...]
    fresh: tuple[tuple[int, int], ...]  # (offset, length) of CRIU's pages image for the pack


def compose_tracked(
    tracked: TrackedPagemap,
    parent: Pagemap,
    parent_extents: Sequence[Extent],
    pack: str,
    pack_offset: int,
) -> TrackedImage:
    """The whole page image of `tracked`: its entries' pages in entry order, those in the
    parent sliced from the parent's image (its `parent` pagemap over its `parent_extents`),
    the others the next bytes of CRIU's pages image, appended whole to `pack` at `pack_offset`.
    ValueError when a page in the parent is not in the parent's pagemap, or the parent's
    extents are not its pagemap's size: the dump cannot be made whole from this parent."""
    held = sum(e.length for e in parent_extents)
    if held != parent.size:
        raise ValueError(
            f"{parent.pages_name} of the parent is {held} bytes, its pagemap says {parent.size}"
        )
    runs = sorted(parent.runs, key=lambda r: r.vaddr)
    starts = [r.vaddr for r in runs]
    held_at = extent_starts(parent_extents)
    full: list[Run] = []
    extents: list[Extent] = []
    offset = fresh = 0
    for e in tracked.entries:
        full.append(Run(e.vaddr, e.pages, offset))
        offset += e.pages * PAGE
        if not e.in_parent:
            extents.append(Extent(pack, pack_offset + fresh, e.pages * PAGE))
            fresh += e.pages * PAGE
            continue
        at, end = e.vaddr, e.vaddr + e.pages * PAGE
        k = bisect.bisect_right(starts, at) - 1
        while at < end:  # through the parent's runs covering it, one after another
            if (
                not 0 <= k < len(runs)
                or not runs[k].vaddr <= at < runs[k].vaddr + runs[k].pages * PAGE
            ):
                raise ValueError(
                    f"{tracked.pages_name}: the page at {at:#x} is marked in the parent, whose "
                    f"{parent.pages_name} does not hold it"
                )
            r = runs[k]
            take = min(end, r.vaddr + r.pages * PAGE) - at
            extents += slice_extents(parent_extents, r.offset + at - r.vaddr, take, held_at)
            at, k = at + take, k + 1
    return TrackedImage(
        Pagemap(tracked.pages_id, tuple(full)),
        tuple(merge(extents)),
        ((0, fresh),) if fresh else (),
    )


def delta_depth(parent_depth: int, max_depth: int) -> int | None:
    """The depth of a save stored against a parent at `parent_depth` (0: a full checkpoint), or
    None: store it full (max_depth 0 turns deltas off; a chain at its bound starts again)."""
    depth = parent_depth + 1
    return depth if depth <= max_depth else None


@dataclass(frozen=True)
class PageImage:
    size: int
    # Of the whole image as CRIU wrote it: the assembled copy is checked against it. None: not
    # taken (a tracked dump's whole image was never read: the parent's pages would have to be).
    crc32: int | None
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
            crc = img["crc32"]
            images[name] = PageImage(size, None if crc is None else int(crc), extents)
        return cls(str(data["parent"]), int(data["depth"]), images)


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name


def compressed(source: str) -> bool:
    """A source holding its bytes zstd-compressed (extents address them uncompressed)."""
    return source.endswith(".zst")


def full_source(checkpoint_id: str, image: str) -> str:
    """The name a full checkpoint's page image takes in a child's pages/ dir."""
    return f"{checkpoint_id}.{image}"
