"""Sparse files in a slot's upper layer: hashing, copying and measuring them costs what they hold,
not what they say (issue 39, D3: `truncate -s 16G` made a save take 19 s, 8 TiB never ended).
The tree tests run on a temp dir; the big files are holes, so they take no space."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest
from drumsd.linux import evidence, sparse, trees
from drumsd.linux.sparse import CancelFlag, Cancelled

TIB = 1 << 40


def _holes_supported(d: Path) -> bool:
    probe = d / ".probe"
    with probe.open("wb") as f:
        f.truncate(1 << 20)
        f.seek(512 << 10)
        f.write(b"x")
    fd = os.open(probe, os.O_RDONLY)
    try:
        return next(iter(sparse.data_extents(fd, 1 << 20)))[0] > 0
    finally:
        os.close(fd)
        probe.unlink()


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    if not _holes_supported(tmp_path):
        pytest.skip(f"{tmp_path}'s filesystem reports no holes (SEEK_DATA)")
    return tmp_path


def _sparse_file(path: Path, size: int, pieces: dict[int, bytes]) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
        for offset, data in pieces.items():
            f.seek(offset)
            f.write(data)
    return path


def _digest(path: Path, cancel: CancelFlag = sparse.NEVER) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        sparse.hash_file(fd, path.stat().st_size, h, cancel)
    finally:
        os.close(fd)
    return h.hexdigest()


def test_data_extents_name_the_data_and_skip_the_holes(tmp: Path):
    f = _sparse_file(tmp / "f", 10 << 20, {0: b"a" * 10, 5 << 20: b"b" * 5000})
    fd = os.open(f, os.O_RDONLY)
    try:
        extents = list(sparse.data_extents(fd, 10 << 20))
    finally:
        os.close(fd)
    assert len(extents) == 2, extents
    (a0, a1), (b0, b1) = extents
    assert a0 == 0 and 10 <= a1 < 5 << 20
    assert b0 <= 5 << 20 < (5 << 20) + 5000 <= b1 <= 10 << 20


def test_a_file_of_holes_only_has_no_extents(tmp: Path):
    f = _sparse_file(tmp / "f", 1 << 30, {})
    fd = os.open(f, os.O_RDONLY)
    try:
        assert list(sparse.data_extents(fd, 1 << 30)) == []
        assert not sparse.is_dense(fd, 1 << 30)
    finally:
        os.close(fd)


def test_a_dense_file_hashes_as_its_plain_bytes(tmp: Path):
    """Checkpoints made before holes were honoured keep their upper_sha256."""
    data = os.urandom(3 << 20) + bytes(1 << 20)
    (tmp / "d").write_bytes(data)
    assert _digest(tmp / "d") == hashlib.sha256(data).hexdigest()


def test_the_sparse_digest_depends_on_the_bytes_not_the_hole_layout(tmp: Path):
    size = 8 << 20
    pieces = {100: b"hello", 6 << 20: b"world"}
    holed = _sparse_file(tmp / "holed", size, pieces)
    # The same bytes with a written (allocated) zero block where `holed` has a hole.
    other = _sparse_file(tmp / "other", size, {**pieces, 3 << 20: bytes(1 << 16)})
    assert other.stat().st_blocks > holed.stat().st_blocks
    assert _digest(holed) == _digest(other)
    changed = _sparse_file(tmp / "changed", size, {100: b"hellO", 6 << 20: b"world"})
    assert _digest(changed) != _digest(holed)
    longer = _sparse_file(tmp / "longer", size + 1, pieces)
    assert _digest(longer) != _digest(holed)


def test_an_8_tib_sparse_file_hashes_copies_and_measures_in_well_under_a_second(tmp: Path):
    src, dst = tmp / "src", tmp / "dst"
    (src / "home").mkdir(parents=True)
    dst.mkdir()
    payload = os.urandom(70_000)
    big = _sparse_file(src / "home" / "big", 8 * TIB, {4 * TIB: payload, 8 * TIB - 3: b"end"})
    (src / "home" / "small").write_text("small")
    t0 = time.monotonic()
    sha = trees.tree_sha256(src)
    trees.copy_tree(src, dst)
    copy_sha = trees.tree_sha256(dst)
    usage = trees.tree_usage(dst)
    manifest = evidence.upper_manifest(src)
    elapsed = time.monotonic() - t0
    assert elapsed < 5.0, f"hash + copy + hash + measure of an 8 TiB hole took {elapsed:.1f} s"
    assert copy_sha == sha
    assert evidence.upper_manifest(dst) == manifest
    copied = dst / "home" / "big"
    assert copied.stat().st_size == big.stat().st_size == 8 * TIB
    assert usage.apparent_bytes == 8 * TIB + len("small")
    assert usage.real_mib < 16, usage
    with copied.open("rb") as f:
        f.seek(4 * TIB)
        assert f.read(len(payload)) == payload
        f.seek(8 * TIB - 3)
        assert f.read() == b"end"


def test_copy_file_keeps_holes_and_data(tmp: Path):
    src = _sparse_file(tmp / "src", 64 << 20, {1: b"x" * 3, 40 << 20: os.urandom(300_000)})
    sparse.copy_path(str(src), str(tmp / "dst"))
    dst = tmp / "dst"
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_blocks <= src.stat().st_blocks + 8


def test_usage_counts_allocated_blocks_of_regular_files_only(tmp: Path):
    _sparse_file(tmp / "s", 1 << 30, {0: b"a"})
    (tmp / "l").symlink_to("s")
    usage = trees.tree_usage(tmp)
    assert usage.apparent_bytes == 1 << 30
    assert 0 < usage.real_bytes <= 1 << 20


def test_a_set_cancel_flag_stops_a_hash_of_real_data_between_chunks(tmp: Path):
    f = tmp / "dense"
    f.write_bytes(os.urandom(8 << 20))
    cancel = CancelFlag()
    cancel.set()
    with pytest.raises(Cancelled):
        _digest(f, cancel)
    with pytest.raises(Cancelled):
        trees.tree_sha256(tmp, cancel)
    with pytest.raises(Cancelled):
        sparse.copy_path(str(f), str(tmp / "copy"), cancel)


def test_a_cancel_flag_kills_a_copy_in_progress(tmp: Path, monkeypatch: pytest.MonkeyPatch):
    """copy_tree's cp is killed when the flag is set (a `cp` that never ends stands in)."""
    (tmp / "src").mkdir()
    (tmp / "dst").mkdir()
    real_popen = trees.subprocess.Popen
    monkeypatch.setattr(
        trees.subprocess, "Popen", lambda argv, **kw: real_popen(["sleep", "60"], **kw)
    )
    cancel = CancelFlag()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        trees.copy_tree(tmp / "src", tmp / "dst", cancel)
    assert time.monotonic() - t0 < 5.0
