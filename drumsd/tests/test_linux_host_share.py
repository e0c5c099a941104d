"""Host-wide claims of daemons side by side (issue 14 findings 4, 5 and 12's KSM part): uid
ranges never overlap, KSM knobs come back only when the last daemon leaves, dirs lock once;
CRIU's kerndat cache dir is the daemon user's alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from drumsd.linux.host_share import (
    ClaimError,
    KsmShare,
    UidRanges,
    bind_listener,
    ensure_criu_cache_dir,
    hold_dir,
    lock_holder,
)


def test_two_daemons_never_share_a_uid_range(tmp_path: Path) -> None:
    root = tmp_path / "claims"
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir(), b_dir.mkdir()
    a, b = UidRanges(a_dir, root), UidRanges(b_dir, root)
    a_held: set[int] = set()
    b_held: set[int] = set()
    for _ in range(3):
        a_held.add(a.claim_lowest(a_held))
        b_held.add(b.claim_lowest(b_held))
    assert a_held.isdisjoint(b_held)
    assert a_held | b_held == set(range(6))
    # A release frees the range for anyone; b cannot release a's claim.
    b.release(0)
    assert root.joinpath("0").exists()
    a.release(0)
    assert b.claim_lowest(b_held) == 0


def test_recover_keeps_live_claims_and_prunes_stale_ones(tmp_path: Path) -> None:
    root = tmp_path / "claims"
    a_dir, gone_dir = tmp_path / "a", tmp_path / "gone"
    a_dir.mkdir(), gone_dir.mkdir()
    a, gone = UidRanges(a_dir, root), UidRanges(gone_dir, root)
    held = {a.claim_lowest(set()), a.claim_lowest({0})}  # 0, 1
    assert gone.claim_lowest(set()) == 2
    gone_dir.rmdir()  # that daemon's state dir was removed: its claims are stale
    # Restarted with only range 1 still held by a live slot (range 0's slot died with it).
    assert a.recover({1}) == []
    assert a.claims() == {1: str(a_dir)}
    assert held == {0, 1}


def test_recover_reports_a_range_another_daemon_owns(tmp_path: Path) -> None:
    root = tmp_path / "claims"
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir(), b_dir.mkdir()
    UidRanges(b_dir, root).claim_lowest(set())
    assert UidRanges(a_dir, root).recover({0}) == [0]


def knobs(d: Path) -> dict[str, str]:
    return {p.name: p.read_text().strip() for p in d.iterdir()}


def test_ksm_knobs_come_back_when_the_last_daemon_leaves(tmp_path: Path) -> None:
    ksm = tmp_path / "ksm"
    ksm.mkdir()
    host = {"run": "0", "pages_to_scan": "100", "sleep_millisecs": "200"}
    for name, value in host.items():
        (ksm / name).write_text(value + "\n")
    wanted = {"run": "1", "pages_to_scan": "1000", "sleep_millisecs": "20"}
    first = KsmShare(ksm, tmp_path / "share")
    # A second daemon: another live process's pid, as its holder file.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        second = KsmShare(ksm, tmp_path / "share")
        second.pid = other.pid
        assert first.join(wanted) == []
        assert second.join(wanted) == []
        assert first.leave() is False  # the other still uses KSM: nothing restored
        assert knobs(ksm) == wanted
    finally:
        other.kill()
        other.wait()
    # The other daemon died without leaving (kill -9): the next leave or join restores.
    rejoin = KsmShare(ksm, tmp_path / "share")
    assert rejoin.join(wanted) == []
    assert rejoin.leave() is True
    assert knobs(ksm) == host


def test_ksm_without_the_sysfs_files_says_which_failed(tmp_path: Path) -> None:
    share = KsmShare(tmp_path / "no-ksm", tmp_path / "share")
    assert share.join({"run": "1"}) == ["run"]
    assert share.leave() is True


def test_a_dir_is_held_once(tmp_path: Path) -> None:
    fd = hold_dir(tmp_path, "state_dir")
    try:
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from drumsd.linux.host_share import "
                "hold_dir; hold_dir(Path(sys.argv[1]), 'state_dir')",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
        )
        assert probe.returncode != 0
        assert f"in use by another drumsd (pid {os.getpid()}: " in probe.stderr
    finally:
        os.close(fd)
    os.close(hold_dir(tmp_path, "state_dir"))  # released with the fd


def test_a_locks_holder_is_named_by_its_command_or_as_exited(tmp_path: Path) -> None:
    lock = tmp_path / ".drumsd.lock"
    alive = lock_holder(str(os.getpid()), lock)
    assert alive == f"pid {os.getpid()}: {' '.join(sys.orig_argv)}", alive
    gone = lock_holder("4194305", lock, proc=tmp_path)  # no such pid under this "proc"
    assert gone.startswith("pid 4194305, which has exited: a process it started holds the lock")
    assert f"`fuser -v {lock}`" in gone
    assert lock_holder("", lock) == "pid ?"


def test_a_bound_port_refuses_a_second_bind() -> None:
    sock = bind_listener("127.0.0.1", 0)
    try:
        sock.listen()
        with pytest.raises(ClaimError, match="another drumsd"):
            bind_listener("127.0.0.1", sock.getsockname()[1])
    finally:
        sock.close()


def test_the_criu_cache_dir_is_made_ours_alone(tmp_path: Path) -> None:
    """Made 0700; anything else in its place (a file, a link, an open dir) replaced, since CRIU
    trusts what it reads there; a half-written cache left by a dead CRIU removed, a fresh one
    (a CRIU writing it now) kept."""
    d = tmp_path / "drums-criu"
    assert ensure_criu_cache_dir(d) is None
    assert d.is_dir() and d.stat().st_mode & 0o777 == 0o700
    (d / "criu.kdat").write_bytes(b"k")
    assert ensure_criu_cache_dir(d) is None
    assert (d / "criu.kdat").read_bytes() == b"k"  # ours: the cache stays
    d.chmod(0o777)
    assert ensure_criu_cache_dir(d) is None
    assert d.stat().st_mode & 0o777 == 0o700 and not (d / "criu.kdat").exists()
    for planted in ("file", "link"):
        os.rmdir(d)
        if planted == "file":
            d.write_text("not a dir")
        else:
            (tmp_path / "elsewhere").mkdir(mode=0o700)
            d.symlink_to(tmp_path / "elsewhere")
        assert ensure_criu_cache_dir(d) is None
        assert d.is_dir() and not d.is_symlink(), planted
    assert (tmp_path / "elsewhere").is_dir()  # a link's target is not touched
    tmp = d / "criu.kdat.tmp"
    tmp.write_bytes(b"")
    assert ensure_criu_cache_dir(d, now=tmp.stat().st_mtime + 1) is None
    assert tmp.exists()
    assert ensure_criu_cache_dir(d, now=tmp.stat().st_mtime + 120) is None
    assert not tmp.exists()
    blocked = tmp_path / "ro"
    blocked.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anyway
        assert "ro/drums-criu" in (ensure_criu_cache_dir(blocked / "drums-criu") or "")
