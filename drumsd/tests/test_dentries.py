"""The dump's second try after an inotify watch without a file handle: which inodes CRIU named,
and the walk that looks their names up again."""

from __future__ import annotations

from pathlib import Path

from drumsd.linux import criu, dentries

REFUSED = [
    "(00.258154) Error (criu/proc_parse.c:2272): parse_fdinfo_pid_s: error parsing "
    "[inotify wd:2 ino:2a sdev:86 mask:2c8 ignored_mask:0 ] for 8: Success",
    "(00.258162) Error (criu/cr-dump.c:1545): Dump files (pid: 27005) failed with -1",
    "(00.260813) Error (criu/cr-dump.c:1975): Dumping FAILED.",
]


def test_the_inodes_of_watches_criu_could_not_parse() -> None:
    assert criu.unhandled_inotify_inodes(REFUSED) == {0x2A}
    assert criu.unhandled_inotify_inodes(REFUSED[1:]) == set()
    # A watch whose fdinfo has its handle is not one of them.
    assert not criu.unhandled_inotify_inodes(
        ["inotify wd:1 ino:29 sdev:14c mask:fce ignored_mask:0 fhandle-bytes:8 fhandle-type:1"]
    )


def test_the_walk_finds_a_deep_directory_and_a_file_and_stops_when_all_are_found(
    tmp_path: Path,
) -> None:
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    watched_file = tmp_path / "a" / "f.txt"
    watched_file.write_text("x")
    wanted = {deep.stat().st_ino, watched_file.stat().st_ino}
    assert dentries.look_up_again(tmp_path, wanted, budget_s=5.0) == wanted
    one = deep.stat().st_ino
    assert dentries.look_up_again(tmp_path, {one, 1 << 60}, budget_s=5.0) == {one}


def test_the_walk_keeps_to_its_time_and_a_missing_root(tmp_path: Path) -> None:
    assert dentries.look_up_again(tmp_path / "gone", {1}, budget_s=5.0) == set()
    assert dentries.look_up_again(tmp_path, {1 << 60}, budget_s=0.0) == set()
