"""A delta save's upper copy links the files the restore copied that nothing changed since (issue
35): the pure decision (`core/upper_since.py`: the record, inode and ctime, the parent's file,
which cp can skip) and the post-dump copy run as CRIU runs it, on real trees a slot changed in
every way that must make a file be copied (a write with its mtime set back, a first write through
a shared mapping, chmod, a replaced file, swapped directories, a link added)."""

from __future__ import annotations

import mmap
import os
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from drumsd.core.upper_since import (
    decode_record,
    encode_record,
    skip_existing_flag,
    unchanged_since_restore,
)
from drumsd.linux import checkpoint_files, criu, trees, upper_links


def st(**kw: int) -> Any:
    base = {
        "st_mode": stat.S_IFREG | 0o644,
        "st_ino": 7,
        "st_nlink": 1,
        "st_uid": 1000,
        "st_gid": 1000,
        "st_size": 5,
        "st_mtime_ns": 100,
        "st_ctime_ns": 200,
    }
    return SimpleNamespace(**(base | kw))


def test_the_record_round_trips_any_path_and_refuses_a_broken_one() -> None:
    stamps = [(b"home/u/a b.txt", 7, 200), (b"home/u/\xff\nodd", 8, 300)]
    source, got = decode_record(encode_record(b"/ck/upper", stamps))
    assert source == b"/ck/upper" and got == {s[0]: (s[1], s[2]) for s in stamps}
    data = encode_record(b"/ck/upper", stamps)
    for bad in (data[:-1], data[:-5], b"junk\0" + data, encode_record(b"/u", [(b"../x", 1, 2)])):
        with pytest.raises(ValueError):
            decode_record(bad)


def test_a_file_is_linked_only_when_it_is_the_recorded_inode_unchanged_and_the_parents() -> None:
    slot, parent = st(), st(st_ino=99, st_ctime_ns=5, st_nlink=3)  # the parent's inode: its own
    assert unchanged_since_restore((7, 200), slot, parent)
    assert not unchanged_since_restore(None, slot, parent)  # not recorded: new since the restore
    assert not unchanged_since_restore((7, 200), slot, None)  # the parent has no such file
    assert not unchanged_since_restore((7, 199), slot, parent)  # changed since (ctime moved)
    assert not unchanged_since_restore((8, 200), slot, parent)  # another file at that path
    assert not unchanged_since_restore((7, 200), st(st_nlink=2), parent)  # linked in the tree
    assert not unchanged_since_restore((7, 200), st(st_mode=stat.S_IFLNK | 0o777), parent)
    dir_mode = stat.S_IFDIR | 0o755
    assert not unchanged_since_restore((7, 200), slot, st(st_mode=dir_mode))
    for field, value in (
        ("st_size", 6),
        ("st_mode", stat.S_IFREG | 0o600),
        ("st_uid", 0),
        ("st_gid", 0),
        ("st_mtime_ns", 101),
    ):  # not what the copy of the parent's file kept: some other parent
        assert not unchanged_since_restore((7, 200), slot, st(**{field: value})), field


@pytest.mark.parametrize(
    ("line", "flag"),
    [
        ("cp (GNU coreutils) 8.32", "-n"),
        ("cp (GNU coreutils) 9.1", "-n"),
        ("cp (GNU coreutils) 9.2", None),  # -n fails when it skips, no --update=none yet
        ("cp (GNU coreutils) 9.3", "--update=none"),
        ("cp (GNU coreutils) 9.5", "--update=none"),
        ("cp (GNU coreutils) 10.0", "--update=none"),
        ("cp (uutils coreutils) 0.0.27", None),
        ("BusyBox v1.36.1 (2023-07-27) multi-call binary.", None),
        ("cp (GNU coreutils) nine", None),
        ("", None),
    ],
)
def test_links_are_made_only_with_a_cp_known_to_skip_them_and_succeed(
    line: str, flag: str | None
) -> None:
    assert skip_existing_flag(line) == flag


# ---- the post-dump copy on real trees -------------------------------------------------------


def _parent_upper(root: Path) -> Path:
    home = root / "home" / "u"
    for d in ("docs", "x", "y", "cache"):
        (home / d).mkdir(parents=True)
    files = {
        "docs/keep.txt": b"kept as restored\n",
        "docs/notes.txt": b"draft 1\n",
        "docs/mmapped": b"a" * 8192,
        "docs/chmod": b"m",
        "docs/replaced": b"same bytes",
        "docs/linked_later": b"l",
        "x/f": b"I am x's\n",
        "y/f": b"I am y's\n",
        "cache/big": os.urandom(1 << 20),
    }
    for rel, body in files.items():
        (home / rel).write_bytes(body)
        os.utime(home / rel, ns=(10**18, 10**18))
    (home / "docs" / "holes").write_bytes(b"")
    os.truncate(home / "docs" / "holes", 1 << 30)
    os.link(home / "docs" / "keep.txt", home / "docs" / "keep-twin")  # a link within the tree
    (home / "link").symlink_to("docs/keep.txt")
    os.setxattr(home / "docs", "user.drums-test", b"opaque")
    return root


def _restore(parent: Path, slot: Path, record: Path) -> None:
    slot.mkdir()
    trees.copy_tree(parent, slot)
    upper_links.record_restored(slot, parent, record)


def _post_dump(slot: Path, dest: Path, record: Path, parent: Path) -> dict[str, Any] | None:
    """What CRIU's post-dump action does, through the script prepare_dump writes."""
    script = checkpoint_files.prepare_dump(dest, slot, (record, parent))
    env = {**os.environ, "CRTOOLS_SCRIPT_ACTION": "post-dump"}
    subprocess.run([str(script)], env=env, check=True, capture_output=True)
    return upper_links.read_stats(dest)


def _tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    out: dict[str, tuple[int, int, bytes]] = {}
    for p in sorted(root.rglob("*")):
        s = p.lstat()
        body = p.read_bytes()[:64] if stat.S_ISREG(s.st_mode) and s.st_size < 1 << 21 else b""
        link = os.readlink(p).encode() if p.is_symlink() else b""
        out[str(p.relative_to(root))] = (s.st_mode, s.st_mtime_ns, body + link)
    return out


def _same_inode(a: Path, b: Path) -> bool:
    return a.lstat().st_ino == b.lstat().st_ino


def test_the_post_dump_copy_links_only_what_no_one_changed_since_the_restore(
    tmp_path: Path,
) -> None:
    if upper_links.cp_skip_flag() is None:
        pytest.skip("this host's cp cannot copy over links and succeed (coreutils 9.2, not GNU)")
    parent = _parent_upper(tmp_path / "parent")
    slot, record = tmp_path / "slot", tmp_path / "upper-restored.rec"
    _restore(parent, slot, record)
    home = slot / "home" / "u"
    # the slot, after its restore: the same bytes' length written, mtime set back (touch -d)
    notes = home / "docs" / "notes.txt"
    was = notes.stat()
    notes.write_bytes(b"draft 2\n")
    os.utime(notes, ns=(was.st_atime_ns, was.st_mtime_ns))
    with open(home / "docs" / "mmapped", "r+b") as f:  # a first write through a shared mapping
        m = mmap.mmap(f.fileno(), 8192)
        m[4096:4100] = b"mmap"
        m.close()
    (home / "docs" / "chmod").chmod(0o600)
    fresh = home / "docs" / "replaced.new"  # a new file with the same bytes and times
    fresh.write_bytes(b"same bytes")
    os.utime(fresh, ns=(10**18, 10**18))
    os.replace(fresh, home / "docs" / "replaced")
    os.rename(home / "x", home / "z")  # x and y swapped: each f unchanged, at the other's path
    os.rename(home / "y", home / "x")
    os.rename(home / "z", home / "y")
    os.link(home / "docs" / "linked_later", home / "linked_elsewhere")

    dest = tmp_path / "ck"
    stats = _post_dump(slot, dest, record, parent)
    assert stats is not None and not (dest / upper_links.STATS_NAME).exists()
    upper, p_home, d_home = dest / "upper", parent / "home" / "u", dest / "upper" / "home" / "u"
    assert _tree(upper) == _tree(slot)  # the tree the dump holds, whatever was linked
    assert trees.tree_sha256(upper) == trees.tree_sha256(slot)
    assert os.getxattr(d_home / "docs", "user.drums-test") == b"opaque"
    assert (d_home / "docs" / "notes.txt").read_bytes() == b"draft 2\n"
    assert (d_home / "x" / "f").read_bytes() == b"I am y's\n"
    for rel in ("cache/big", "docs/holes"):  # untouched since the restore: the parent's files
        assert _same_inode(d_home / rel, p_home / rel), rel
    for rel in ("docs/notes.txt", "docs/mmapped", "docs/chmod", "docs/replaced", "x/f", "y/f"):
        assert not _same_inode(d_home / rel, p_home / rel), rel  # changed: stored, not linked
    # files linked within the tree are copied (the copy joins them again), and so is a file
    # the slot gave a second name
    assert _same_inode(d_home / "docs" / "keep.txt", d_home / "docs" / "keep-twin")
    assert not _same_inode(d_home / "docs" / "keep.txt", p_home / "docs" / "keep.txt")
    assert _same_inode(d_home / "docs" / "linked_later", d_home / "linked_elsewhere")
    assert stats["files"] == 2 and stats["bytes"] == (1 << 20) + (1 << 30)
    assert stats["recorded"] == 9  # keep.txt and its twin have two names: not recorded


def test_a_record_of_another_upper_or_a_broken_one_copies_the_upper_whole(
    tmp_path: Path,
) -> None:
    if upper_links.cp_skip_flag() is None:
        pytest.skip("this host's cp cannot copy over links and succeed (coreutils 9.2, not GNU)")
    parent = _parent_upper(tmp_path / "parent")
    other = tmp_path / "other"
    other.mkdir()
    trees.copy_tree(parent, other)
    slot, record = tmp_path / "slot", tmp_path / "rec"
    _restore(other, slot, record)  # restored from `other`, saved against `parent`
    stats = _post_dump(slot, tmp_path / "ck1", record, parent)
    assert stats is not None and stats["files"] == 0 and stats["recorded"] == 9
    assert _tree(tmp_path / "ck1" / "upper") == _tree(slot)

    record.write_bytes(record.read_bytes()[:-3])  # truncated
    stats = _post_dump(slot, tmp_path / "ck2", record, other)
    assert stats == {"files": 0, "bytes": 0, "recorded": 0, "took_s": stats["took_s"]}
    assert _tree(tmp_path / "ck2" / "upper") == _tree(slot)


def test_without_a_record_the_post_dump_action_is_the_plain_copy(tmp_path: Path) -> None:
    slot = tmp_path / "slot"
    slot.mkdir()
    script = checkpoint_files.prepare_dump(tmp_path / "ck", slot, (tmp_path / "none", slot))
    assert script.read_text() == criu.action_script(slot, tmp_path / "ck" / "upper")
    assert "exec cp -a " in script.read_text()
    assert checkpoint_files.prepare_dump(tmp_path / "ck2", slot).read_text() == (
        criu.action_script(slot, tmp_path / "ck2" / "upper")
    )


def test_a_parent_on_another_filesystem_is_copied_from_not_linked(tmp_path: Path) -> None:
    """Links fail across filesystems (and past an inode's link limit): each such file is left to
    cp, and the copy is still the slot's tree."""
    if upper_links.cp_skip_flag() is None:
        pytest.skip("this host's cp cannot copy over links and succeed (coreutils 9.2, not GNU)")
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp dir")
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as elsewhere:
        parent = _parent_upper(Path(elsewhere) / "parent")
        slot, record = tmp_path / "slot", tmp_path / "rec"
        _restore(parent, slot, record)
        stats = _post_dump(slot, tmp_path / "ck", record, parent)
        assert stats is not None and stats["files"] == 0 and stats["recorded"] == 9
        assert _tree(tmp_path / "ck" / "upper") == _tree(slot)
