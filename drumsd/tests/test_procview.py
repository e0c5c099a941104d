"""Unit tests of the per-slot /proc view's plan (config procview_dir): stage 1's binds, the CRIU
external mounts that carry them through dumps and restores, the mount table the gate expects, the
v1 cgroups LXCFS reads, and the start's refusals. The view itself is tested live
(tests/live/test_runtime_linux.py::test_procview_shows_each_slot_its_own_limits_across_forks)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from drumsd.core.seams import SlotLimits
from drumsd.linux import cgroups, criu, evidence, mounts, procview, stage1, sysinfo_preload
from drumsd.linux import syscalls as sc

VIEW = Path("/var/lib/drums-procview")
LIMITS = SlotLimits(vcpus=1.0, memory_mib=1024, pids_max=300, tmpfs_mib=64)


def test_stage1_binds_the_view_over_the_fresh_proc_before_pivot_root() -> None:
    plan = procview.with_binds(mounts.plan_stage1(".", 64, userns=True), VIEW, ".")
    kinds = [(op.kind, op.target) for op in plan]
    at_proc = kinds.index(("mount", "./proc"))
    binds = plan[at_proc + 1 : at_proc + 1 + len(procview.FILES)]
    assert [(b.target, b.source, b.flags) for b in binds] == [
        (f"./proc/{n}", f"{VIEW}/proc/{n}", sc.MS_BIND) for n in procview.FILES
    ]
    assert plan[-1].kind == "pivot_root"
    assert procview.FILES == ("meminfo", "cpuinfo", "stat", "uptime", "loadavg")


def _mountinfo_line(point: str, fstype: str) -> str:
    return f"40 30 0:42 /x {point} rw,relatime - {fstype} src rw"


def test_a_dump_declares_the_binds_a_slot_holds_and_a_restore_maps_them_all_back() -> None:
    info = "\n".join(
        [
            _mountinfo_line("/", "overlay"),
            _mountinfo_line("/proc", "proc"),
            _mountinfo_line("/proc/meminfo", "fuse.lxcfs"),
            _mountinfo_line("/proc/uptime", "fuse.lxcfs"),
            _mountinfo_line("/tmp/meminfo", "fuse.lxcfs"),  # not the view's place
        ]
    )
    held = procview.held_in(info)
    assert held == ["meminfo", "uptime"]
    dump = criu.dump_argv(
        Path("/criu"),
        1,
        Path("/i"),
        Path("/s"),
        leave_running=True,
        externals=procview.dump_externals(held),
    )
    assert "mnt[/proc/meminfo]:drums-procview-meminfo" in dump
    assert "mnt[/proc/uptime]:drums-procview-uptime" in dump
    assert sum(a == "--external" for a in dump) == 2
    restore = criu.restore_argv(
        Path("/criu"),
        Path("/i"),
        Path("/w"),
        Path("/r"),
        Path("/p"),
        externals=procview.restore_externals(VIEW),
    )
    for n in procview.FILES:
        assert f"mnt[drums-procview-{n}]:{VIEW}/proc/{n}" in restore
    assert procview.held_in(_mountinfo_line("/proc", "proc")) == []


def test_the_mount_table_gate_expects_the_binds_only_with_the_view_on() -> None:
    off = evidence.expected_slot_mounts()
    on = evidence.expected_slot_mounts(procview=True)
    added = sorted(set(on) - set(off))
    assert added == sorted(f"/proc/{n} fuse.lxcfs" for n in procview.FILES)
    assert not any("lxcfs" in e for e in off)


def _fake_v1(tmp: Path, extra: tuple[str, ...]) -> cgroups.CgroupV1:
    mounts_ = {c: tmp / c for c in cgroups.V1_CONTROLLERS + cgroups.V1_VIEW_CONTROLLERS}
    for m in mounts_.values():
        m.mkdir()
    (tmp / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (tmp / "cpuset" / "cpuset.mems").write_text("0\n")
    for d in (tmp / "cpuset" / "drums", tmp / "cpuset" / "drums" / "s1"):
        d.mkdir(parents=True)  # a real cpuset dir comes with these files, empty
        (d / "cpuset.cpus").write_text("")
        (d / "cpuset.mems").write_text("")
    return cgroups.CgroupV1(mounts_, {}, extra=extra)


def test_with_the_view_v1_slots_join_cpuacct_and_a_cpuset_given_its_parents_cpus(
    tmp_path: Path,
) -> None:
    drv = _fake_v1(tmp_path, cgroups.V1_VIEW_CONTROLLERS)
    dirs = drv.create("s1", LIMITS)
    assert set(dirs) == {"memory", "cpu", "pids", "freezer", "cpuacct", "cpuset"}
    assert Path(dirs["cpuset"], "cpuset.cpus").read_text() == "0-1"
    assert Path(dirs["cpuset"], "cpuset.mems").read_text() == "0"
    assert Path(dirs["cpuacct"], "cgroup.procs") in drv.procs_files(dirs)
    assert Path(dirs["cpuset"], "cgroup.procs") in drv.procs_files(dirs)


def test_without_the_view_v1_slots_keep_their_four_controllers(tmp_path: Path) -> None:
    drv = _fake_v1(tmp_path, ())
    dirs = drv.create("s2", LIMITS)
    assert set(dirs) == set(cgroups.V1_CONTROLLERS)
    v1, _ = cgroups.parse_cgroup_mounts(
        "30 20 0:30 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
        "31 20 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    assert v1 == {"cpuset": Path("/sys/fs/cgroup/cpuset"), "memory": Path("/sys/fs/cgroup/memory")}


def test_served_reads_an_lxcfs_mount_at_the_directory() -> None:
    info = _mountinfo_line(str(VIEW), "fuse.lxcfs")
    assert procview.served(VIEW, info)
    assert not procview.served(VIEW, _mountinfo_line(str(VIEW), "tmpfs"))
    assert not procview.served(Path("/elsewhere"), info)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user can search, as a procview_dir's path must be (pytest's tmp dirs
    are root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="drums-procview-test-", dir="/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def test_the_start_refuses_a_busy_directory_a_hidden_path_or_no_lxcfs(
    open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = open_dir / "busy"
    busy.mkdir()
    (busy / "file").write_text("x")
    with pytest.raises(procview.ProcViewError, match="not empty and not an LXCFS mount"):
        procview.ensure(busy)
    hidden = open_dir / "hidden"
    hidden.mkdir(mode=0o700)
    with pytest.raises(procview.ProcViewError, match="cannot be searched by other users"):
        procview.ensure(hidden / "view")
    assert not (hidden / "view").exists()
    monkeypatch.setattr(procview, "LXCFS", "drums-no-such-lxcfs")
    with pytest.raises(procview.ProcViewError, match="apt-get install lxcfs"):
        procview.ensure(open_dir / "view")


# ---------------------------------------------------------------- sysinfo(2): the preloaded library

SYSINFO_PY = (
    "import ctypes,os;b=ctypes.create_string_buffer(128);l=ctypes.CDLL(None);"
    "assert l.sysinfo(b)==0;t=ctypes.c_ulong.from_buffer(b,32).value;"
    "u=ctypes.c_uint.from_buffer(b,104).value;print(t*u, os.sysconf('SC_PHYS_PAGES'))"
)


def test_the_preload_file_lists_the_library_once_and_keeps_other_entries() -> None:
    lib = sysinfo_preload.LIB_PATH
    assert sysinfo_preload.preload_text("") == f"{lib}\n"
    once = sysinfo_preload.preload_text("/usr/lib/other.so\n")
    assert once == f"/usr/lib/other.so\n{lib}\n"
    assert sysinfo_preload.preload_text(once) == once


def test_stage1_installs_the_library_in_the_slots_root(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.preload").write_text("/usr/lib/other.so\n")
    sysinfo_preload.install(str(tmp_path), b"\x7fELF...")
    assert (tmp_path / sysinfo_preload.LIB_PATH.lstrip("/")).read_bytes() == b"\x7fELF..."
    preload = (tmp_path / "etc/ld.so.preload").read_text()
    assert preload == f"/usr/lib/other.so\n{sysinfo_preload.LIB_PATH}\n"


def test_stage1_reads_the_library_with_the_view_only() -> None:
    argv = ["--root", "/r", "--procview", str(VIEW), "--sysinfo-lib", "/c/lib.so", "--dry-run"]
    assert stage1.parse_args(argv).sysinfo_lib == "/c/lib.so"
    assert stage1.parse_args(["--root", "/r"]).sysinfo_lib is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (apt-get install gcc)")
def test_the_library_is_built_once_per_source_and_leaves_a_host_without_the_view_alone(
    tmp_path: Path,
) -> None:
    """Built into the cache keyed by its source's hash; where /proc/meminfo is not the view (a
    FUSE file) it answers what the kernel does. The view's figures are tested live."""
    import subprocess
    import sys

    lib = sysinfo_preload.ensure_lib(tmp_path)
    assert lib.name == f"libdrums-sysinfo-{sysinfo_preload.DIGEST}.so"
    mtime = lib.stat().st_mtime_ns
    assert sysinfo_preload.ensure_lib(tmp_path) == lib and lib.stat().st_mtime_ns == mtime
    run = [sys.executable, "-c", SYSINFO_PY]
    plain = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    env = {"LD_PRELOAD": str(lib), "PATH": "/usr/bin:/bin"}
    preloaded = subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout
    assert preloaded == plain


def test_no_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysinfo_preload.shutil, "which", lambda _name: None)
    with pytest.raises(sysinfo_preload.SysinfoLibError, match="apt-get install gcc"):
        sysinfo_preload.ensure_lib(tmp_path)


def test_stop_ends_its_child_at_once_and_reaps_it(tmp_path: Path) -> None:
    """An LXCFS this process started is a zombie once it exits: stop took its whole 10 s start
    timeout waiting for /proc/<pid> to go (and left the zombie)."""
    view = tmp_path / "view"
    child = subprocess.Popen(["sleep", "60"])
    Path(f"{view}.pid").write_text(f"{child.pid}\n")
    t0 = time.monotonic()
    procview.stop(view)
    assert time.monotonic() - t0 < 5.0
    assert not Path(f"/proc/{child.pid}").exists()


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path, monkeypatch) -> None:
    view = tmp_path / "view"
    ignore = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    child = subprocess.Popen(
        [sys.executable, "-c", ignore + "print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE
    )
    assert child.stdout is not None and child.stdout.readline()  # SIGTERM ignored from here
    Path(f"{view}.pid").write_text(f"{child.pid}\n")
    monkeypatch.setattr(procview, "START_TIMEOUT_S", 0.3)
    procview.stop(view)
    assert not Path(f"/proc/{child.pid}").exists()
