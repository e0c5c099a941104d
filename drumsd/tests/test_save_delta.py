"""Saves that store what changed (issue 35): the pure half (CRIU pagemap images read and written,
shared address ranges, extents, a tracked dump made whole, the manifest, the depth bound) and the
file work on synthetic checkpoint dirs (a chain of deltas, compared or tracked, assembled byte for
byte after its parents are deleted, the upper's unchanged files hard-linked, what a checkpoint
alone holds)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path

import pytest
from drumsd.core.criu_wire import varint_bytes
from drumsd.core.save_delta import (
    MANIFEST,
    PAGE,
    PE_PARENT,
    PE_PRESENT,
    SOURCES,
    Entry,
    Extent,
    Manifest,
    PageImage,
    Pagemap,
    Run,
    TrackedPagemap,
    compose,
    compose_tracked,
    delta_depth,
    encode_pagemap,
    merge,
    parse_pagemap,
    parse_tracked_pagemap,
    shared_ranges,
    slice_extents,
)
from drumsd.core.seams import SaveParent
from drumsd.linux import checkpoint_files, save_delta, trees
from harness import create, open_api

MAGICS = bytes.fromhex("1943565425400856")  # CRIU's two magics, as a real pagemap image starts


def message(**fields: int) -> bytes:
    numbers = {"pages_id": 1, "vaddr": 1, "compat": 2, "in_parent": 3, "flags": 4, "nr": 5}
    body = b"".join(varint_bytes(numbers[k] << 3) + varint_bytes(v) for k, v in fields.items())
    return len(body).to_bytes(4, "little") + body


def pagemap(pages_id: int, entries: list[tuple[int, int, int]]) -> bytes:
    """A pagemap image: (vaddr, pages, flags) entries, nr_pages in compat field 2 as CRIU does."""
    return (
        MAGICS
        + message(pages_id=pages_id)
        + b"".join(message(vaddr=v, compat=n, flags=f) for v, n, f in entries)
    )


# ---------------------------------------------------------------- pure


def test_pagemap_runs_are_the_present_entries_in_file_order() -> None:
    data = pagemap(7, [(0x1000, 2, PE_PRESENT), (0x8000, 3, 0), (0x20000, 1, PE_PRESENT)])
    pm = parse_pagemap(data)
    assert pm.pages_name == "pages-7.img"
    assert pm.runs == (Run(0x1000, 2, 0), Run(0x20000, 1, 2 * PAGE))
    assert pm.size == 3 * PAGE
    # nr_pages (field 5) wins over the compat count; no flags means present (old images)
    old = MAGICS + message(pages_id=1) + message(vaddr=0x4000, compat=1, nr=4)
    assert parse_pagemap(old).runs == (Run(0x4000, 4, 0),)


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\x00" * 4, "not a CRIU image"),
        (MAGICS, "no head"),
        (pagemap(1, [(0x1000, 1, PE_PARENT | PE_PRESENT)]), "in a parent image"),
        (MAGICS + message(pages_id=1) + b"\x09\x00\x00\x00\x08", "truncated"),
    ],
)
def test_a_pagemap_this_store_cannot_read_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_pagemap(data)


def test_shared_ranges_are_the_addresses_both_images_hold() -> None:
    new = [Run(0x1000, 4, 0), Run(0x10000, 2, 4 * PAGE)]
    old = [Run(0x3000, 4, 0), Run(0x11000, 1, 4 * PAGE)]
    assert shared_ranges(new, old) == [
        (2 * PAGE, 0, 2 * PAGE),  # 0x3000-0x5000
        (5 * PAGE, 4 * PAGE, PAGE),  # 0x11000
    ]
    assert shared_ranges(new, []) == []


def test_extents_slice_and_merge() -> None:
    file = [Extent("a", 0, 8), Extent("b", 100, 4), Extent("a", 8, 8)]
    assert slice_extents(file, 6, 8) == [Extent("a", 6, 2), Extent("b", 100, 4), Extent("a", 8, 2)]
    assert merge([Extent("a", 0, 4), Extent("a", 4, 4), Extent("b", 0, 1)]) == [
        Extent("a", 0, 8),
        Extent("b", 0, 1),
    ]
    with pytest.raises(ValueError, match="outside"):
        slice_extents(file, 10, 30)


def _materialize(extents: list[Extent], sources: dict[str, bytes]) -> bytes:
    return b"".join(sources[e.source][e.offset : e.offset + e.length] for e in extents)


def test_compose_rebuilds_the_new_image_from_the_parent_and_the_pack() -> None:
    rnd = random.Random(5)
    pages = [rnd.randbytes(PAGE) for _ in range(40)]
    sources = {"p.pack": b"".join(pages[:20]), "root.img": b"".join(pages[20:])}
    parent = [Extent("root.img", 10 * PAGE, 10 * PAGE), Extent("p.pack", 0, 20 * PAGE)]
    parent_bytes = _materialize(parent, sources)
    new = bytearray(parent_bytes[: 24 * PAGE])
    new[3 * PAGE : 4 * PAGE] = rnd.randbytes(PAGE)  # one page changed
    new += rnd.randbytes(2 * PAGE)  # two pages the parent never had
    reused = [(0, 0, 3 * PAGE), (4 * PAGE, 4 * PAGE, 20 * PAGE)]
    extents, fresh = compose(len(new), reused, parent, "c.pack", 0)
    sources["c.pack"] = b"".join(bytes(new[o : o + n]) for o, n in fresh)
    assert fresh == [(3 * PAGE, PAGE), (24 * PAGE, 2 * PAGE)]
    assert _materialize(extents, sources) == bytes(new)
    assert sum(e.length for e in extents if e.source == "c.pack") == 3 * PAGE


def test_a_whole_pagemap_written_reads_back_as_the_same_runs() -> None:
    pm = Pagemap(
        3, (Run(0x1000, 2, 0), Run(0x3000, 1, 2 * PAGE), Run(0x7F0000000000, 300, 3 * PAGE))
    )
    data = encode_pagemap(pm)
    # CRIU's framing; compat_nr_pages too: protobuf-c refuses an entry without it (required)
    assert data == MAGICS + message(pages_id=3) + b"".join(
        message(vaddr=r.vaddr, compat=r.pages, flags=PE_PRESENT, nr=r.pages) for r in pm.runs
    )
    assert parse_pagemap(data) == pm
    assert parse_tracked_pagemap(data).entries == tuple(
        Entry(r.vaddr, r.pages, False) for r in pm.runs
    )
    with pytest.raises(ValueError, match="not the next"):  # an image holds no offsets
        encode_pagemap(Pagemap(1, (Run(0x1000, 1, PAGE),)))


def test_a_tracked_pagemap_keeps_the_entries_in_the_parent() -> None:
    lazy = 1 << 1
    data = pagemap(
        4, [(0x1000, 2, PE_PARENT), (0x3000, 1, PE_PRESENT | lazy), (0x9000, 0, PE_PRESENT)]
    ) + message(vaddr=0x5000, compat=3, in_parent=1)  # an old image's in_parent, no flags
    tracked = parse_tracked_pagemap(data)
    assert tracked.pages_name == "pages-4.img"
    assert tracked.entries == (
        Entry(0x1000, 2, True),
        Entry(0x3000, 1, False),
        Entry(0x5000, 3, True),
    )
    assert tracked.in_parent and tracked.fresh_size == PAGE
    with pytest.raises(ValueError, match="in a parent image"):
        parse_pagemap(data)  # the comparison still refuses it
    for flags, why in ((PE_PARENT | PE_PRESENT, "both"), (lazy, "neither")):
        with pytest.raises(ValueError, match=why):
            parse_tracked_pagemap(pagemap(1, [(0x1000, 1, flags)]))


# The parent of the tracked-pagemap tests: two runs adjacent in memory, one apart
_PARENT = Pagemap(1, (Run(0x10000, 4, 0), Run(0x14000, 2, 4 * PAGE), Run(0x40000, 3, 6 * PAGE)))


def _tracked() -> tuple[TrackedPagemap, bytes]:
    """Pages over both adjacent parent runs and over the third are the parent's; one page among
    them and two the parent never had are in CRIU's pages image."""
    entries = (
        Entry(0x11000, 4, True),
        Entry(0x15000, 1, False),
        Entry(0x40000, 3, True),
        Entry(0x80000, 2, False),
    )
    return TrackedPagemap(2, entries), random.Random(8).randbytes(3 * PAGE)


@pytest.mark.parametrize(
    "parent_extents",
    [
        [Extent("c0.pages-1.img", 0, 9 * PAGE)],  # a full parent
        [Extent("c0.pages-1.img", 0, 3 * PAGE), Extent("b.pack.zst", 0, 6 * PAGE)],  # a delta
    ],
)
def test_a_tracked_image_is_made_whole_from_its_parents_image(
    parent_extents: list[Extent],
) -> None:
    rnd = random.Random(9)
    sources = {e.source: rnd.randbytes(e.offset + e.length) for e in parent_extents}
    parent = _materialize(parent_extents, sources)
    tracked, fresh = _tracked()
    made = compose_tracked(tracked, _PARENT, parent_extents, "c1.pack.zst", 5 * PAGE)
    sources["c1.pack.zst"] = b"\0" * 5 * PAGE + fresh  # the pack already held 5 pages
    whole = parent[PAGE : 5 * PAGE] + fresh[:PAGE] + parent[6 * PAGE :] + fresh[PAGE:]
    assert _materialize(list(made.extents), sources) == whole
    assert made.fresh == ((0, 3 * PAGE),)
    assert made.pagemap == Pagemap(
        2,
        (
            Run(0x11000, 4, 0),
            Run(0x15000, 1, 4 * PAGE),
            Run(0x40000, 3, 5 * PAGE),
            Run(0x80000, 2, 8 * PAGE),
        ),
    )
    if len(parent_extents) == 2:  # the parent's first run is sliced across its two files
        assert made.extents[:2] == (
            Extent("c0.pages-1.img", PAGE, 2 * PAGE),
            Extent("b.pack.zst", 0, 2 * PAGE),
        )


def test_a_page_marked_in_the_parent_that_the_parent_lacks_is_refused() -> None:
    whole = [Extent("c0.pages-1.img", 0, 9 * PAGE)]
    for entry in (Entry(0x16000, 1, True), Entry(0x15000, 2, True), Entry(0xF000, 2, True)):
        gap = TrackedPagemap(2, (entry,))
        with pytest.raises(ValueError, match=r"0x(16|f)000 .* does not hold it"):
            compose_tracked(gap, _PARENT, whole, "c1.pack.zst", 0)
    holed = Pagemap(1, (Run(0x10000, 1, 0), Run(0x12000, 1, PAGE)))  # a page apart
    two = [Extent("c0.pages-1.img", 0, 2 * PAGE)]
    with pytest.raises(ValueError, match=r"0x11000 .* does not hold it"):
        compose_tracked(TrackedPagemap(2, (Entry(0x10000, 3, True),)), holed, two, "p", 0)
    with pytest.raises(ValueError, match="its pagemap says"):  # a parent's short image
        compose_tracked(_tracked()[0], _PARENT, [Extent("c0.pages-1.img", 0, PAGE)], "p", 0)


def test_manifest_round_trips_and_refuses_what_would_read_outside_its_dir() -> None:
    m = Manifest("st-1", 2, {"pages-1.img": PageImage(8192, 42, (Extent("a.pack.zst", 0, 8192),))})
    assert Manifest.from_json(json.loads(json.dumps(m.to_json()))) == m
    assert m.sources() == {"a.pack.zst"} and m.stored_bytes("a.pack.zst") == 8192
    bad = m.to_json()
    bad["images"]["pages-1.img"]["extents"] = [["../../etc/passwd", 0, 8192]]
    with pytest.raises(ValueError, match="bad extent"):
        Manifest.from_json(bad)
    short = m.to_json()
    short["images"]["pages-1.img"]["size"] = 4096
    with pytest.raises(ValueError, match="do not add up"):
        Manifest.from_json(short)
    with pytest.raises(ValueError, match="version"):
        Manifest.from_json({"version": 99})
    untaken = Manifest("st-1", 1, {"pages-1.img": PageImage(4096, None, (Extent("a", 0, 4096),))})
    assert untaken.to_json()["images"]["pages-1.img"]["crc32"] is None  # a tracked image's
    assert Manifest.from_json(json.loads(json.dumps(untaken.to_json()))) == untaken


def test_the_chain_is_bounded() -> None:
    assert delta_depth(0, 8) == 1
    assert delta_depth(7, 8) == 8
    assert delta_depth(8, 8) is None  # the next save is full
    assert delta_depth(0, 0) is None  # deltas off


# ---------------------------------------------------------------- files


def _dump(dest: Path, cp_id: str, procs: dict[str, dict[int, bytes]], upper: dict[str, bytes]):
    """A checkpoint dir as a dump leaves it: per process a pagemap and its pages image
    (address -> page), meta.json, the upper layer."""
    images = dest / "images"
    images.mkdir(parents=True)
    for n, (proc, pages) in enumerate(sorted(procs.items()), start=1):
        entries, data = [], b""
        for vaddr in sorted(pages):
            entries.append((vaddr, 1, PE_PRESENT))
            data += pages[vaddr]
        (images / f"pagemap-{proc}.img").write_bytes(pagemap(n, entries))
        (images / f"pages-{n}.img").write_bytes(data)
    (images / "inventory.img").write_bytes(MAGICS)
    (dest / "meta.json").write_text(json.dumps({"id": cp_id}))
    for rel, body in upper.items():
        (dest / "upper" / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / "upper" / rel).write_bytes(body)
        os.utime(dest / "upper" / rel, ns=(1, 1))
    (dest / "upper").mkdir(exist_ok=True)


def _page_images(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (dest / "images").glob("pages-*.img")}


def test_a_chain_of_deltas_assembles_byte_identical_after_its_parents_are_deleted(
    tmp_path: Path,
) -> None:
    rnd = random.Random(1)
    procs = {
        "1": {0x1000 * i: rnd.randbytes(PAGE) for i in range(1, 200)},
        "52": {0x400000 + 0x1000 * i: rnd.randbytes(PAGE) for i in range(300)},
    }
    upper = {"home/user/doc.txt": b"draft 1", "home/user/.cache/big": rnd.randbytes(100_000)}
    _dump(tmp_path / "c0", "c0", procs, upper)
    expected: dict[str, dict[str, bytes]] = {}
    for gen in range(1, 4):
        for _ in range(5):  # a few pages written, one new page, one page unmapped
            procs["52"][rnd.choice(sorted(procs["52"]))] = rnd.randbytes(PAGE)
        procs["1"][0x900000 + gen * 0x1000] = rnd.randbytes(PAGE)
        procs["1"].pop(rnd.choice(sorted(procs["1"])))
        upper["home/user/doc.txt"] = f"draft {gen + 1}".encode()
        dest = tmp_path / f"c{gen}"
        _dump(dest, f"c{gen}", procs, upper)
        expected[f"c{gen}"] = _page_images(dest)
        full = trees.own_usage(dest).apparent_bytes
        stats = save_delta.store_delta(dest, tmp_path / f"c{gen - 1}", f"c{gen}", max_depth=8)
        assert stats is not None and stats.depth == gen and stats.parent == f"c{gen - 1}"
        assert stats.pages_fresh <= 6 * PAGE  # up to 5 pages written (some twice) and 1 new
        assert stats.upper_linked == 100_000  # the cache file; the document changed
        assert not list((dest / "images").glob("pages-*.img"))
        assert save_delta.delta_problems(dest) == []
        # what it alone holds is a fraction of the dump
        assert trees.own_usage(dest).apparent_bytes < full / 10
    for gen in range(3):
        shutil.rmtree(tmp_path / f"c{gen}")
    out = tmp_path / "copy"
    shutil.copytree(tmp_path / "c3" / "images", out)
    assert save_delta.assemble(tmp_path / "c3", out) == 2
    assert {p.name: p.read_bytes() for p in out.glob("pages-*.img")} == expected["c3"]
    assert (tmp_path / "c3" / "upper" / "home/user/doc.txt").read_bytes() == b"draft 4"


def test_past_the_depth_bound_a_save_is_full(tmp_path: Path) -> None:
    procs = {"1": {0x1000: b"a" * PAGE}}
    _dump(tmp_path / "c0", "c0", procs, {})
    _dump(tmp_path / "c1", "c1", procs, {})
    assert save_delta.store_delta(tmp_path / "c1", tmp_path / "c0", "c1", max_depth=1)
    _dump(tmp_path / "c2", "c2", procs, {})
    assert save_delta.store_delta(tmp_path / "c2", tmp_path / "c1", "c2", max_depth=1) is None
    assert not (tmp_path / "c2" / MANIFEST).exists()
    assert _page_images(tmp_path / "c2") == {"pages-1.img": b"a" * PAGE}


def test_a_parent_that_cannot_serve_leaves_the_dump_full(tmp_path: Path) -> None:
    _dump(tmp_path / "c1", "c1", {"1": {0x1000: b"a" * PAGE}}, {})
    assert save_delta.store_delta(tmp_path / "c1", tmp_path / "gone", "c1", 8) is None
    assert _page_images(tmp_path / "c1") == {"pages-1.img": b"a" * PAGE}
    assert not (tmp_path / "c1" / SOURCES).exists()


def test_a_changed_source_fails_assembly_with_the_file_named(tmp_path: Path) -> None:
    procs = {"1": {0x1000 * i: bytes([i]) * PAGE for i in range(1, 9)}}
    _dump(tmp_path / "c0", "c0", procs, {})
    procs["1"][0x1000] = b"z" * PAGE
    _dump(tmp_path / "c1", "c1", procs, {})
    assert save_delta.store_delta(tmp_path / "c1", tmp_path / "c0", "c1", 8)
    held = tmp_path / "c1" / SOURCES / "c0.pages-1.img"
    with open(held, "r+b") as f:  # the parent's file, shared by the link, written in place
        f.seek(3 * PAGE)
        f.write(b"?")
    out = tmp_path / "copy"
    shutil.copytree(tmp_path / "c1" / "images", out)
    with pytest.raises(OSError, match=r"pages-1\.img .*CRC differs"):
        save_delta.assemble(tmp_path / "c1", out)
    held.unlink()
    missing = "pages/c0.pages-1.img is missing: pages.json names it"
    assert save_delta.delta_problems(tmp_path / "c1") == [missing]
    assert missing in checkpoint_files.dump_problems(tmp_path / "c1", {})  # adoption checks it


def _memory(images: Path) -> dict[str, dict[int, bytes]]:
    """What each pagemap of a dump's images/ restores: address -> page."""
    out: dict[str, dict[int, bytes]] = {}
    for path in sorted(images.glob("pagemap-*.img")):
        pm = parse_pagemap(path.read_bytes(), path.name)
        data = (images / pm.pages_name).read_bytes()
        out[path.name] = {
            r.vaddr + k * PAGE: data[r.offset + k * PAGE : r.offset + (k + 1) * PAGE]
            for r in pm.runs
            for k in range(r.pages)
        }
    return out


def _tracked_dump(
    dest: Path,
    cp_id: str,
    procs: dict[str, dict[int, bytes]],
    parent_procs: dict[str, dict[int, bytes]],
    parent: Path,
) -> None:
    """A dump as drums' CRIU writes it tracking memory against `parent`: per process the pages
    equal to the parent's at their address are entries in the parent (neighbours joined), the
    others present, their bytes alone in a pages image (of another id than the parent's)."""
    _dump(dest, cp_id, procs, {})
    images = dest / "images"
    for full in images.glob("pages-*.img"):
        full.unlink()
    for n, (proc, pages) in enumerate(sorted(procs.items()), start=11):
        entries: list[tuple[int, int, int]] = []
        data = b""
        for vaddr in sorted(pages):
            same = parent_procs.get(proc, {}).get(vaddr) == pages[vaddr]
            flags = PE_PARENT if same else PE_PRESENT
            last = entries[-1] if entries else None
            if last and last[2] == flags and last[0] + last[1] * PAGE == vaddr:
                entries[-1] = (last[0], last[1] + 1, flags)
            else:
                entries.append((vaddr, 1, flags))
            data += b"" if same else pages[vaddr]
        (images / f"pagemap-{proc}.img").write_bytes(pagemap(n, entries))
        (images / f"pages-{n}.img").write_bytes(data)
    (images / save_delta.PARENT_LINK).symlink_to(parent / "images")


def test_a_chain_of_tracked_dumps_assembles_to_what_full_dumps_hold(tmp_path: Path) -> None:
    rnd = random.Random(3)
    procs = {
        "1": {0x1000 * i: rnd.randbytes(PAGE) for i in range(1, 120)},
        "52": {0x400000 + 0x1000 * i: rnd.randbytes(PAGE) for i in range(200)},
    }
    _dump(tmp_path / "c0", "c0", procs, {})
    for gen in (1, 2):  # the second against a delta: its image is the parent's extents
        before = {proc: dict(pages) for proc, pages in procs.items()}
        for _ in range(6):
            procs["52"][rnd.choice(sorted(procs["52"]))] = rnd.randbytes(PAGE)
        procs["1"][0x900000 + gen * 0x1000] = rnd.randbytes(PAGE)  # the parent never had it
        procs["1"].pop(rnd.choice(sorted(procs["1"])))
        _dump(tmp_path / f"full{gen}", f"full{gen}", procs, {})  # what CRIU would write untracked
        dest, parent = tmp_path / f"c{gen}", tmp_path / f"c{gen - 1}"
        _tracked_dump(dest, f"c{gen}", procs, before, parent)
        written = sum(len(b) for b in _page_images(dest).values())
        stats = save_delta.store_tracked(dest, parent, f"c{gen}", max_depth=8)
        assert stats is not None and (stats.parent, stats.depth) == (f"c{gen - 1}", gen)
        assert stats.pages_fresh == written <= 7 * PAGE
        assert stats.pages_bytes == sum(map(len, _page_images(tmp_path / f"full{gen}").values()))
        assert _page_images(dest) == {}  # CRIU's partial images are gone
        assert not (dest / "images" / save_delta.PARENT_LINK).is_symlink()
        assert save_delta.delta_problems(dest) == []
        crcs = [i["crc32"] for i in json.loads((dest / MANIFEST).read_text())["images"].values()]
        assert crcs == [None, None]
    shutil.rmtree(tmp_path / "c0")
    shutil.rmtree(tmp_path / "c1")
    out = tmp_path / "copy"
    shutil.copytree(tmp_path / "c2" / "images", out)
    assert save_delta.assemble(tmp_path / "c2", out) == 2
    expected = {f"pagemap-{proc}.img": pages for proc, pages in procs.items()}
    assert _memory(out) == _memory(tmp_path / "full2" / "images") == expected


def test_a_tracked_image_has_no_crc_for_assembly_to_check(tmp_path: Path) -> None:
    """The price of not reading the parent's pages: a parent's file changed in place goes
    unnoticed by a tracked image, where a compared one's CRC catches it."""
    procs = {"1": {0x1000 * i: bytes([i]) * PAGE for i in range(1, 9)}}
    _dump(tmp_path / "c0", "c0", procs, {})
    changed = {"1": {**procs["1"], 0x3000: b"z" * PAGE}}
    _tracked_dump(tmp_path / "c1", "c1", changed, procs, tmp_path / "c0")
    assert save_delta.store_tracked(tmp_path / "c1", tmp_path / "c0", "c1", 8)
    with open(tmp_path / "c1" / SOURCES / "c0.pages-1.img", "r+b") as f:
        f.write(b"?")  # the page at 0x1000
    out = tmp_path / "copy"
    shutil.copytree(tmp_path / "c1" / "images", out)
    assert save_delta.assemble(tmp_path / "c1", out) == 1
    assert _memory(out)["pagemap-1.img"][0x1000] == b"?" + b"\x01" * (PAGE - 1)


def test_a_tracked_dump_with_nothing_in_the_parent_is_stored_as_store_delta_stores_it(
    tmp_path: Path,
) -> None:
    procs = {"1": {0x1000 * i: bytes([i]) * PAGE for i in range(1, 9)}}
    _dump(tmp_path / "c0", "c0", procs, {"big": b"b" * 5000})
    procs["1"][0x3000] = b"z" * PAGE
    compared, tracked = tmp_path / "compared" / "c1", tmp_path / "tracked" / "c1"
    for dest in (compared, tracked):
        _dump(dest, "c1", procs, {"big": b"b" * 5000})
    # CRIU found no parent pages to mark (a delta parent's images/ holds none) but left its link
    (tracked / "images" / save_delta.PARENT_LINK).symlink_to(tmp_path / "c0" / "images")
    a = save_delta.store_delta(compared, tmp_path / "c0", "c1", 8)
    b = save_delta.store_tracked(tracked, tmp_path / "c0", "c1", 8)
    assert a is not None and b is not None and a.pages_fresh == PAGE
    assert dataclasses.replace(a, diff_s=0, diff_cpu_s=0) == dataclasses.replace(
        b, diff_s=0, diff_cpu_s=0
    )

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    assert files(compared) == files(tracked)
    assert not (tracked / "images" / save_delta.PARENT_LINK).is_symlink()
    _dump(tmp_path / "c2", "c2", procs, {})  # a parent that cannot serve: left full, as there
    assert save_delta.store_tracked(tmp_path / "c2", tmp_path / "gone", "c2", 8) is None
    assert _page_images(tmp_path / "c2") == {"pages-1.img": b"".join(procs["1"].values())}
    assert not (tmp_path / "c2" / SOURCES).exists()


def test_a_tracked_dump_that_cannot_be_stored_against_its_parent_is_refused(
    tmp_path: Path,
) -> None:
    procs = {"1": {0x1000 * i: bytes([i]) * PAGE for i in range(1, 9)}}
    _dump(tmp_path / "c0", "c0", procs, {})
    _dump(tmp_path / "other", "other", {"1": {0x1000: b"o" * PAGE}}, {})
    changed = {"1": {**procs["1"], 0x3000: b"z" * PAGE}}

    def tracked(name: str) -> Path:
        _tracked_dump(tmp_path / name, name, changed, procs, tmp_path / "c0")
        return tmp_path / name

    with pytest.raises(ValueError, match=r"depth 0, the bound is 0.*dump again"):
        save_delta.store_tracked(tracked("a"), tmp_path / "c0", "a", 0)
    with pytest.raises(ValueError, match=r"CRIU tracked against .*c0/images"):
        save_delta.store_tracked(tracked("b"), tmp_path / "other", "b", 8)
    dest = tracked("c")
    (dest / "images" / save_delta.PARENT_LINK).unlink()
    with pytest.raises(ValueError, match="it does not read"):
        save_delta.store_tracked(dest, tmp_path / "gone", "c", 8)
    with pytest.raises(ValueError, match=r"0x2000 .* does not hold it"):
        save_delta.store_tracked(dest, tmp_path / "other", "c", 8)
    # left as CRIU wrote it, for the caller to discard
    assert not (dest / SOURCES).exists() and not (dest / MANIFEST).exists()
    assert sorted(p.name for p in (dest / "images").iterdir()) == [
        "inventory.img",
        "pagemap-1.img",
        "pages-11.img",
    ]


def test_a_parent_is_tracked_against_only_where_the_dump_can_be_stored(tmp_path: Path) -> None:
    procs = {"1": {0x1000: b"a" * PAGE}}
    _dump(tmp_path / "c0", "c0", procs, {})
    _dump(tmp_path / "c1", "c1", procs, {})
    assert save_delta.store_delta(tmp_path / "c1", tmp_path / "c0", "c1", 8)
    assert save_delta.tracked_parent_ok(tmp_path / "c0", 8, restored_from="c0")
    assert not save_delta.tracked_parent_ok(tmp_path / "c0", 0, restored_from="c0")  # deltas off
    assert save_delta.tracked_parent_ok(tmp_path / "c1", 2, restored_from="c1")
    assert not save_delta.tracked_parent_ok(
        tmp_path / "c1", 1, restored_from="c1"
    )  # its chain at the bound
    assert not save_delta.tracked_parent_ok(tmp_path / "gone", 8, restored_from="gone")
    (tmp_path / "c0" / "images" / "pagemap-1.img").unlink()
    assert not save_delta.tracked_parent_ok(tmp_path / "c0", 8, restored_from="c0")


def test_upper_files_are_linked_only_when_equal_in_everything(tmp_path: Path) -> None:
    parent, child = tmp_path / "p", tmp_path / "c"
    files = {"same": b"x" * 5000, "edited": b"old", "chmod": b"m", "twin1": b"t", "twin2": b"t"}
    for root in (parent, child):
        root.mkdir()
        for name, body in files.items():
            (root / name).write_bytes(body)
            os.utime(root / name, ns=(1, 1))
    os.link(parent / "twin1", parent / "twin_link")  # a hard link within the parent's upper
    (child / "twin_link").write_bytes(b"t")
    os.utime(child / "twin_link", ns=(1, 1))
    (child / "edited").write_bytes(b"new")
    os.utime(child / "edited", ns=(1, 1))
    (child / "chmod").chmod(0o600)
    (child / "sparse").write_bytes(b"")
    os.truncate(child / "sparse", 1 << 30)  # a hole: never read
    total, linked = save_delta.link_unchanged(child, parent)
    names = [*files, "twin_link"]
    inode = {n: (child / n).stat().st_ino == (parent / n).stat().st_ino for n in names}
    assert inode["same"] and inode["twin2"]
    assert not inode["edited"] and not inode["chmod"]
    # twin1 and twin_link are distinct files in the child, one inode in the parent: only one of
    # them is linked to it, or the restored tree would have them joined
    assert inode["twin1"] != inode["twin_link"]
    assert (child / "twin_link").stat().st_ino != (child / "twin1").stat().st_ino
    assert linked == 5002 and total == 5000 + 3 + 1 + 1 + 1 + 1 + (1 << 30)
    assert (child / "edited").read_bytes() == b"new"


def test_no_upper_file_is_linked_through_a_symlink_out_of_the_parents_upper(
    tmp_path: Path,
) -> None:
    """A directory of the parent's upper that is a symlink (the agent made it) leads nowhere:
    the child's equal file is not linked to the file outside the parent's tree."""
    parent, child, outside = tmp_path / "p", tmp_path / "c", tmp_path / "host-etc"
    for d in (parent, child / "etc", outside):
        d.mkdir(parents=True)
    for f in (outside / "passwd", child / "etc" / "passwd"):
        f.write_bytes(b"root:x:0:0")
        os.utime(f, ns=(1, 1))
    (parent / "etc").symlink_to(outside)
    total, linked = save_delta.link_unchanged(child, parent)
    assert (total, linked) == (10, 0)
    assert (child / "etc" / "passwd").stat().st_ino != (outside / "passwd").stat().st_ino


def test_own_usage_counts_what_removing_the_dir_would_free(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "shared").write_bytes(b"s" * 8192)
    os.link(a / "shared", b / "shared")
    (b / "own").write_bytes(b"o" * 4096)
    (b / "own2").write_bytes(b"p" * 4096)
    os.link(b / "own2", b / "own2-link")  # linked within b only: b's
    assert trees.own_usage(b).apparent_bytes == 8192
    shutil.rmtree(a)
    assert (
        trees.own_usage(b).apparent_bytes == 8192 + 8192
    )  # the parent gone: the file is b's alone


# ---------------------------------------------------------------- what the supervisor asks


async def test_a_saved_state_is_stored_against_its_slots_checkpoint_and_a_prefork_never(
    tmp_path: Path,
) -> None:
    async with open_api(tmp_path, quiesce={"window_s": 0.05}) as api:
        slot = await create(api)
        r = await api.client.post(f"/v1/slots/{slot['id']}/capture", json={})
        assert r.status_code == 201, r.text
        template = api.sup.checkpoints[slot["checkpoint"]]
        assert api.runtime.save_parents == [SaveParent(Path(template.dir), 8)]
        child = await create(api, from_state=r.json()["id"])
        r = await api.client.post(f"/v1/slots/{child['id']}/capture", json={})
        assert r.status_code == 201, r.text
        saved = api.sup.checkpoints[child["checkpoint"]]
        assert api.runtime.save_parents[-1] == SaveParent(Path(saved.dir), 8)
        r = await api.client.post(f"/v1/slots/{child['id']}/prefork", json={})
        assert r.status_code in (200, 201), r.text
        assert api.runtime.save_parents[-1] is None  # a fork waits on its prefork's dump


async def test_save_delta_depth_zero_stores_every_save_full(tmp_path: Path) -> None:
    async with open_api(tmp_path, quiesce={"window_s": 0.05}, save_delta_depth=0) as api:
        slot = await create(api)
        r = await api.client.post(f"/v1/slots/{slot['id']}/capture", json={})
        assert r.status_code == 201, r.text
        assert api.runtime.save_parents == [None]


def test_the_upper_can_be_linked_after_the_pages_with_the_same_result(tmp_path: Path) -> None:
    """The Dumper hashes the upper while the pages are compared (store_delta(upper=False)),
    then links it (link_upper): the stats are those of one store_delta."""
    procs = {"1": {0x1000 * i: bytes([i]) * PAGE for i in range(1, 9)}}
    upper = {"home/user/big": b"b" * 50_000, "home/user/doc.txt": b"draft 1"}
    _dump(tmp_path / "c0", "c0", procs, upper)
    upper["home/user/doc.txt"] = b"draft 2"
    _dump(tmp_path / "c1", "c1", procs, upper)
    first = save_delta.store_delta(tmp_path / "c1", tmp_path / "c0", "c1", 8, upper=False)
    assert first is not None and (first.upper_bytes, first.upper_linked) == (0, 0)
    child_big = tmp_path / "c1" / "upper" / "home/user/big"
    assert child_big.stat().st_nlink == 1  # not linked yet
    stats = save_delta.link_upper(first, tmp_path / "c1", tmp_path / "c0")
    assert (stats.upper_bytes, stats.upper_linked) == (50_007, 50_000)
    assert stats.diff_s >= first.diff_s and stats.pages_fresh == first.pages_fresh
    assert child_big.stat().st_ino == (tmp_path / "c0" / "upper" / "home/user/big").stat().st_ino
