"""The shared kernel limits: what the admitted slots need, and the CRIU lines that name a limit."""

from __future__ import annotations

import pytest
import trio
from drumsd.core import host_limits as hl
from drumsd.core.seams import RuntimeError_
from drumsd.linux import host_limits as linux_limits
from drumsd.runtime.linux.slots import one_failure

# Shaped like the lines issue 35 quotes from the osworld fork of 16 that failed (fd 9 follows).
OSWORLD_FORK_16 = [
    "(00.412345) Error (criu/fsnotify.c:893): fsnotify: Can't create inotify: Too many open files",
    "(00.412401) Error (criu/files.c:1201): Unable to open fd=9 id=0x2f",
]


def test_the_osworld_fork_of_16_names_the_inotify_instance_limit() -> None:
    hit = hl.limit_hit(OSWORLD_FORK_16)
    assert hit is not None and hit.name == "fs.inotify.max_user_instances"
    assert "Can't create inotify" in hit.line
    message = hl.limit_message(hit, 128, "restoring checkpoint c1")
    assert message.startswith("fs.inotify.max_user_instances=128 reached restoring checkpoint c1")
    assert "sysctl -w fs.inotify.max_user_instances" in message


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (
            "Error (criu/fsnotify.c:1): inotify_add_watch failed: No space left on device",
            "fs.inotify.max_user_watches",
        ),
        ("Error (criu/files.c:1): Can't dup fd: Too many open files", "RLIMIT_NOFILE"),
        ("Error (criu/files.c:1): open: Too many open files in system", "fs.file-max"),
    ],
)
def test_each_limit_is_told_from_its_errno(line: str, name: str) -> None:
    hit = hl.limit_hit([line])
    assert hit is not None and hit.name == name


def test_other_failures_name_no_limit() -> None:
    assert hl.limit_hit(["Error (criu/cr-restore.c:1): Can't restore sigaltstack: EINVAL"]) is None
    assert hl.limit_hit([]) is None


def test_needs_grow_with_the_admitted_slots() -> None:
    slots = hl.max_admitted_slots((100, 2000), 24 * 1024)
    assert slots == 24 * 1024 // hl.SLOT_MIB_FLOOR  # memory, not slot numbers, bounds it here
    assert hl.max_admitted_slots((100, 103), 24 * 1024) == 4
    assert hl.max_admitted_slots((100, 2000), None) == 1901  # MemTotal unreadable
    needs = {
        n.name: n
        for n in hl.needs(slots, inotify_instances=128, inotify_watches=10**6, nofile=10**6)
    }
    instances = needs[hl.INOTIFY_INSTANCES]
    assert instances.short  # the stock 128 is what a fork of 16 osworld desktops ran out of
    assert instances.needed == hl.HOST_INOTIFY_INSTANCES + slots * hl.SLOT_INOTIFY_INSTANCES
    assert not needs[hl.INOTIFY_WATCHES].short and not needs[hl.NOFILE].short


def test_raise_short_raises_only_what_is_short(tmp_path) -> None:
    (tmp_path / "fs" / "inotify").mkdir(parents=True)
    (tmp_path / "fs" / "inotify" / "max_user_instances").write_text("128\n")
    (tmp_path / "fs" / "inotify" / "max_user_watches").write_text("999999\n")
    needs = hl.needs(4, inotify_instances=128, inotify_watches=999999, nofile=10**6)
    raised = linux_limits.raise_short(needs, proc_sys=tmp_path)
    assert [(r.name, r.before, r.after) for r in raised] == [
        (hl.INOTIFY_INSTANCES, 128, 128 + 4 * hl.SLOT_INOTIFY_INSTANCES)
    ]
    assert (tmp_path / "fs" / "inotify" / "max_user_watches").read_text() == "999999\n"


def _limit_error() -> RuntimeError_:
    return RuntimeError_("restore_failed", "limit", limit=hl.INOTIFY_INSTANCES)


def test_a_fork_answers_one_runtime_error_of_its_children_the_limit_first() -> None:
    plain = RuntimeError_("restore_failed", "plain")
    limit = _limit_error()
    assert one_failure(ExceptionGroup("fork", [plain, ExceptionGroup("x", [limit])])) is limit
    assert one_failure(ExceptionGroup("fork", [plain])) is plain
    assert one_failure(plain) is plain


def test_a_group_with_anything_else_goes_up_unchanged() -> None:
    group = BaseExceptionGroup("fork", [_limit_error(), trio.Cancelled._create()])
    assert one_failure(group) is group
