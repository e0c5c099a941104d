"""Host-side reads beneath a root (linux/beneath.py): what the checker's file getters use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from drumsd.linux import beneath


def test_links_resolve_inside_the_root_and_only_regular_files_are_read(tmp_path: Path) -> None:
    outside = tmp_path / "host-secret"
    outside.write_text("host")
    root = tmp_path / "slot"
    (root / "home" / "user").mkdir(parents=True)
    (root / "host-secret").write_text("the slot's own file")
    (root / "home" / "user" / "a.txt").write_text("a")
    # A link the desktop user planted: absolute, and climbing with ..: both stay in the slot.
    (root / "home" / "user" / "abs").symlink_to("/host-secret")
    (root / "home" / "user" / "up").symlink_to("../../../../host-secret")
    assert beneath.read_regular(root, "/home/user/a.txt", 10) == b"a"
    assert beneath.read_regular(root, "/home/user/abs", 100) == b"the slot's own file"
    assert beneath.read_regular(root, "/home/user/up", 100) == b"the slot's own file"
    assert beneath.read_regular(root, "/../../host-secret", 100) == b"the slot's own file"
    os.mkfifo(root / "home" / "user" / "fifo")
    with pytest.raises(beneath.NotRegularFile):
        beneath.read_regular(root, "/home/user/fifo", 10)  # must not block
    with pytest.raises(beneath.NotRegularFile):
        beneath.read_regular(root, "/home/user", 10)
    with pytest.raises(beneath.TooLarge):
        beneath.read_regular(root, "/home/user/a.txt", 0)
    with pytest.raises(FileNotFoundError):
        beneath.read_regular(root, "/home/user/missing", 10)
    (root / "home" / "user" / "magic").symlink_to("/proc/self/root/etc/hostname")
    with pytest.raises(OSError):
        beneath.read_regular(tmp_path / "slot", "/home/user/magic", 100)
