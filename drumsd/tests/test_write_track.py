"""Write tracking's pure parts (issue 35): which mappings are armed, the dump's flags, which
saves a dump may refer to their parent, and the fds an arming holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

from drumsd.core.criu_wire import image_bytes, varint_bytes, varint_message
from drumsd.core.seams import SaveParent
from drumsd.linux import checkpoint_files, criu, write_track
from drumsd.runtime.linux.base import Instance
from drumsd.runtime.linux.dumps import Dumper

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 26723                      /usr/bin/python3.11
55d0c0a01000-55d0c0a02000 rw-p 00003000 fe:00 26723                      /usr/bin/python3.11
55d0c2000000-55d0c2100000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000021000 rw-p 00000000 00:00 0
7f0000021000-7f0004000000 ---p 00000000 00:00 0
7f0004000000-7f0004800000 rw-s 00000000 00:01 1234                       /SYSV00000000 (deleted)
7f0005000000-7f0005001000 rw-s 00000000 00:01 77                         /dev/zero (deleted)
7f0006000000-7f0006100000 r-xp 00000000 00:00 0
7f0006100000-7f0006200000 r-xp 00000000 fe:00 4242                       /usr/lib/libjit.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd00100000-7ffd00104000 r--p 00000000 00:00 0                          [vvar]
7ffd00104000-7ffd00106000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
"""


def test_accessible_private_mappings_are_armed_neighbours_at_once() -> None:
    # shared memory, PROT_NONE, a file's read-only text and data (whose read faults would lose
    # their fault-around) and the kernel's own are left out (a write there counts as written);
    # a RELRO (read-only, right before its file's data) and anonymous code (a JIT's) are armed
    assert write_track.armed_ranges(MAPS) == [
        (0x55D0C0A00000, 0x55D0C0A02000),
        (0x55D0C2000000, 0x55D0C2100000),
        (0x7F0000000000, 0x7F0000021000),
        (0x7F0006000000, 0x7F0006100000),
        (0x7FFD00000000, 0x7FFD00021000),
    ]


def test_of_a_librarys_read_only_mappings_only_its_relro_is_armed() -> None:
    lib = "/usr/lib/x86_64-linux-gnu/libsoffice.so"
    maps = f"""\
7f1000000000-7f1000100000 r--p 00000000 fe:00 99 {lib}
7f1000100000-7f1000400000 r-xp 00100000 fe:00 99 {lib}
7f1000400000-7f1000500000 r--p 00400000 fe:00 99 {lib}
7f1000500000-7f1000600000 r--p 00500000 fe:00 99 {lib}
7f1000600000-7f1000610000 rw-p 00600000 fe:00 99 {lib}
7f1000610000-7f1000620000 rw-p 00000000 00:00 0
7f2000000000-7f2000001000 r--p 00000000 fe:00 7 /usr/lib/other.so
7f2000001000-7f2000002000 rw-p 00000000 fe:00 8 /usr/lib/third.so
"""
    # the headers, text and read-only data are not; the RELRO joins its data and .bss; a
    # read-only mapping followed by another file's data is not a RELRO
    assert write_track.armed_ranges(maps) == [
        (0x7F1000500000, 0x7F1000620000),
        (0x7F2000001000, 0x7F2000002000),
    ]


def test_a_dump_tracks_only_when_given_the_parent_images() -> None:
    plain = criu.dump_argv(Path("/c"), 42, Path("/ck/images"), Path("/s"), leave_running=True)
    assert "--track-mem-uffd-wp" not in plain and "--prev-images-dir" not in plain
    tracked = criu.dump_argv(
        Path("/c"),
        42,
        Path("/ck/images"),
        Path("/s"),
        leave_running=True,
        track_parent=Path("/p/images"),
    )
    at = tracked.index("--prev-images-dir")
    assert "--track-mem-uffd-wp" in tracked and tracked[at + 1] == "/p/images"


def _checkpoint(root: Path, checkpoint_id: str) -> Path:
    d = root / checkpoint_id
    (d / "images").mkdir(parents=True)
    (d / "images" / "pagemap-1.img").write_bytes(b"")  # what tracked_parent_ok looks for
    (d / "meta.json").write_text(json.dumps({"id": checkpoint_id}))
    return d


def _instance(armed_from: str | None, fds: int = 1) -> Instance:
    inst = Instance("i-1", None, {}, "c1", ())  # type: ignore[arg-type]
    if armed_from is not None:
        inst.write_track = write_track.Armed(armed_from, {100 + k: -1 for k in range(fds)})
    return inst


def test_a_save_refers_to_the_checkpoint_its_armed_tree_came_from(tmp_path: Path) -> None:
    parent = _checkpoint(tmp_path, "c1")
    other = _checkpoint(tmp_path, "c2")
    against = SaveParent(parent, 8)
    assert Dumper.track_parent(_instance("c1"), against) == parent / "images"
    # not armed, armed from another checkpoint, nothing armed, stored whole: a plain dump
    assert Dumper.track_parent(_instance(None), against) is None
    assert Dumper.track_parent(_instance("c1"), SaveParent(other, 8)) is None
    assert Dumper.track_parent(_instance("c1", fds=0), against) is None
    assert Dumper.track_parent(_instance("c1"), None) is None


def test_closing_an_arming_closes_its_fds_once() -> None:
    r, w = os.pipe()
    armed = write_track.Armed("c1", {1: r, 2: w}, {3: "gone"})
    assert armed.as_meta()["armed"] == 2 and armed.as_meta()["failed"] == {"3": "gone"}
    armed.close()
    armed.close()
    assert armed.fds == {}
    for fd in (r, w):
        try:
            os.fstat(fd)
        except OSError:
            continue
        raise AssertionError(f"fd {fd} left open")


def _core(state: int | None) -> bytes:
    """A core-<pid>.img: mtype, a thread_info blob, then TaskCoreEntry (unless a thread's)."""
    blob = b"\x0a\x03abc"
    entry = varint_bytes(1 << 3) + varint_bytes(1)  # mtype X86_64
    entry += varint_bytes(2 << 3 | 2) + varint_bytes(len(blob)) + blob
    if state is not None:
        tc = varint_message([(1, state), (2, 0)])
        entry += varint_bytes(3 << 3 | 2) + varint_bytes(len(tc)) + tc
    return image_bytes(0x55105940, [entry])


def test_a_task_dumped_stopped_keeps_its_tree_from_being_left_stopped(tmp_path: Path) -> None:
    assert criu.task_state(_core(criu.TASK_STOPPED)) == criu.TASK_STOPPED
    assert criu.task_state(_core(1)) == 1 and criu.task_state(_core(None)) is None
    pstree = image_bytes(0x50273030, [varint_message([(1, 1), (2, 0)])])
    (tmp_path / "pstree.img").write_bytes(pstree)
    (tmp_path / "core-1.img").write_bytes(_core(1))
    assert not checkpoint_files.holds_stopped_task(tmp_path)
    (tmp_path / "core-1.img").write_bytes(_core(criu.TASK_STOPPED))
    assert checkpoint_files.holds_stopped_task(tmp_path)
    (tmp_path / "core-1.img").unlink()  # unreadable: the careful answer
    assert checkpoint_files.holds_stopped_task(tmp_path)
