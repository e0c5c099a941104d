"""Unit tests of the pure parts of drumsd.linux: cgroup plans and drivers on temp dirs, mount plans,
/proc parsing and the exec helper. No root needed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from drumsd.core.seams import SlotLimits
from drumsd.linux import cgroups, criu, mounts, procfs
from drumsd.linux.exec_helper import ensure_exec_helper, helper_argv

LIMITS = SlotLimits(vcpus=1.5, memory_mib=512, pids_max=300, tmpfs_mib=64)


def test_limit_writes_v1_and_v2() -> None:
    v1 = {(w.controller, w.file): w.value for w in cgroups.limit_writes_v1(LIMITS)}
    assert v1[("memory", "memory.limit_in_bytes")] == str(512 * 1024 * 1024)
    assert v1[("cpu", "cpu.cfs_quota_us")] == "150000"
    assert v1[("pids", "pids.max")] == "300"
    v2 = {(w.controller, w.file): w.value for w in cgroups.limit_writes_v2(LIMITS)}
    assert v2[("cpu", "cpu.max")] == "150000 100000"
    assert v2[("memory", "memory.max")] == str(512 * 1024 * 1024)
    assert v2[("memory", "memory.oom.group")] == "1"


def test_parse_proc_cgroup_and_mounts() -> None:
    text = "9:name=systemd:/\n8:pids:/\n4:memory:/a/b\n1:cpu,cpuacct:/c\n0::/d\n"
    parsed = cgroups.parse_proc_cgroup(text)
    assert parsed["memory"] == "/a/b" and parsed["cpu"] == "/c" and parsed[""] == "/d"
    mi = (
        "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    v1, v2 = cgroups.parse_cgroup_mounts(mi)
    assert v1["memory"] == Path("/sys/fs/cgroup/memory")
    assert v1["cpu"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert v2 == Path("/sys/fs/cgroup/unified")


def _fake_v1(tmp: Path) -> cgroups.CgroupV1:
    mounts_ = {c: tmp / c for c in cgroups.V1_CONTROLLERS}
    for m in mounts_.values():
        m.mkdir()
    return cgroups.CgroupV1(mounts_, {"memory": "/daemon/x", "cpu": "/"})


def test_v1_driver_writes_limits_under_daemon_path(tmp_path: Path) -> None:
    drv = _fake_v1(tmp_path)
    dirs = drv.create("s1", LIMITS)
    assert dirs["memory"] == str(tmp_path / "memory/daemon/x/drums/s1")
    assert dirs["cpu"] == str(tmp_path / "cpu/drums/s1")
    assert Path(dirs["memory"], "memory.limit_in_bytes").read_text() == str(512 << 20)
    assert Path(dirs["pids"], "pids.max").read_text() == "300"
    Path(dirs["memory"], "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
    )
    assert drv.oom_kills(dirs) == 3
    Path(dirs["pids"], "pids.events").write_text("max 7\n")
    assert drv.pids_max_hits(dirs) == 7
    drv.set_cpu(dirs, None)
    assert Path(dirs["cpu"], "cpu.cfs_quota_us").read_text() == "-1"
    drv.set_group_weight(16384)
    assert (tmp_path / "cpu/drums/cpu.shares").read_text() == "16384"
    drv.set_group_memory(20_000)
    group_limit = tmp_path / "memory/daemon/x/drums/memory.limit_in_bytes"
    assert group_limit.read_text() == str(20_000 << 20)
    drv.set_group_memory(None)
    assert group_limit.read_text() == "-1"
    assert drv.slot_names() == ["s1"]
    Path(dirs["pids"], "cgroup.procs").write_text("")
    assert drv.pids(dirs) == []


def test_v1_driver_requires_all_controllers(tmp_path: Path) -> None:
    with pytest.raises(cgroups.CgroupError, match="freezer"):
        cgroups.CgroupV1({"memory": tmp_path, "cpu": tmp_path, "pids": tmp_path}, {})


def test_v2_driver_prepare_and_create(tmp_path: Path) -> None:
    base = tmp_path / "svc"
    base.mkdir()
    (base / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (base / "cgroup.procs").write_text("4242\n")
    drv = cgroups.CgroupV2(tmp_path, "/svc")
    drv.prepare()
    assert (base / "daemon" / "cgroup.procs").read_text() == "4242"
    assert (base / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    dirs = drv.create("s2", LIMITS)
    d = Path(dirs["unified"])
    assert (d / "cpu.max").read_text() == "150000 100000"
    assert (d / "pids.max").read_text() == "300"
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n")
    assert drv.oom_kills(dirs) == 1
    (d / "pids.events").write_text("max 4\n")
    assert drv.pids_max_hits(dirs) == 4
    assert drv.procs_files(dirs) == [d / "cgroup.procs"]
    drv.set_group_weight(16384)
    assert (base / "drums" / "cpu.weight").read_text() == "1600"
    drv.set_group_memory(20_000)
    assert (base / "drums" / "memory.max").read_text() == str(20_000 << 20)
    drv.set_group_memory(None)
    assert (base / "drums" / "memory.max").read_text() == "max"
    assert drv.slot_names() == ["s2"]


def test_v2_base_under_systemd_delegate_subgroup(tmp_path: Path) -> None:
    """The NixOS unit: Delegate=yes with DelegateSubgroup=daemon starts drumsd in
    drumsd.service/daemon, a leaf without controllers; the unit's cgroup has them. The slots'
    group goes beside the daemon's leaf, which stays a leaf a restarted daemon can join."""
    unit = tmp_path / "system.slice" / "drumsd.service"
    leaf = unit / "daemon"
    leaf.mkdir(parents=True)
    (unit / "cgroup.controllers").write_text("cpu io memory pids\n")
    (unit / "cgroup.procs").write_text("")
    (leaf / "cgroup.controllers").write_text("")
    (leaf / "cgroup.procs").write_text("4242\n")
    base = cgroups.managed_base("/system.slice/drumsd.service/daemon")
    assert base == "/system.slice/drumsd.service"
    drv = cgroups.CgroupV2(tmp_path, base)
    drv.create("s1", LIMITS)
    assert (unit / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (unit / "drums" / "s1").is_dir()
    assert sorted(p.name for p in leaf.iterdir()) == ["cgroup.controllers", "cgroup.procs"]
    assert cgroups.managed_base("/system.slice/other.service") == "/system.slice/other.service"
    assert cgroups.managed_base("/daemon") == "/"


def test_v2_prepare_refuses_without_controllers(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    with pytest.raises(cgroups.CgroupError, match="Delegate=yes"):
        cgroups.CgroupV2(tmp_path, "/").prepare()


def test_slot_mount_plan_is_an_overlay_on_a_tmpfs() -> None:
    paths = mounts.SlotPaths.of(Path("/st"), "s1")
    plan = mounts.plan_rw(paths, 256) + mounts.plan_overlay(paths, [Path("/img/root")])
    text = mounts.render(plan)
    assert "mount -t tmpfs drums-rw /st/slots/s1/rw -o size=256m,mode=755" in text
    assert (
        "lowerdir=/img/root,upperdir=/st/slots/s1/rw/upper,workdir=/st/slots/s1/rw/work,"
        "index=on,nfs_export=on" in text
    )
    kinds = [op.kind for op in mounts.plan_teardown(paths)]
    assert kinds == ["umount", "umount"]


def test_stage1_plan_without_userns_makes_a_minimal_dev_and_pivots_last() -> None:
    plan = mounts.plan_stage1("/r", 64, userns=False)
    assert plan[0].kind == "make_rprivate"
    assert plan[-1].kind == "pivot_root" and plan[-1].target == "/r"
    nodes = {op.target: op.dev for op in plan if op.kind == "mknod"}
    assert nodes["/r/dev/null"] == (1, 3) and len(nodes) == 6
    pts = next(op for op in plan if op.fstype == "devpts")
    assert "newinstance" in (pts.data or "") and "ptmxmode=0666" in (pts.data or "")
    assert any(op.target == "/r/tmp" and op.fstype == "tmpfs" for op in plan)


def test_stage1_plan_in_userns_rebinds_cwd_and_makes_no_nodes() -> None:
    plan = mounts.plan_stage1(".", 64, userns=True)
    assert plan[1].kind == "rebind_cwd"
    assert all(op.target.startswith(".") for op in plan[1:])  # nothing resolved from /
    assert not [op for op in plan if op.kind == "mknod"]
    assert not [op for op in plan if op.target == "/r/dev" and op.kind == "mount"]
    assert any(op.fstype == "devpts" for op in plan)
    assert plan[-1].kind == "pivot_root"


def test_mountinfo_helpers() -> None:
    mi = (
        "1 0 8:1 / / rw - ext4 /dev/vda rw\n"
        "2 1 0:5 / /st/slots/a/rw rw - tmpfs drums-rw rw\n"
        "3 1 0:6 / /st/slots/a/root rw - overlay drums-root rw\n"
        "4 1 0:7 / /st/slots/ab rw - tmpfs x rw\n"
    )
    assert mounts.mounts_under(Path("/st/slots/a"), mi) == ["/st/slots/a/root", "/st/slots/a/rw"]
    assert mounts.fs_type_of(Path("/st/slots/a/rw/upper"), mi) == "tmpfs"


def test_parse_stat_with_spaces_in_comm() -> None:
    line = "123 (a b) c) S 1 123 123 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 9999 1000 50"
    st = procfs.parse_stat(line)
    assert (st.pid, st.comm, st.state, st.ppid, st.ticks, st.starttime) == (
        123,
        "a b) c",
        "S",
        1,
        12,
        9999,
    )
    me = procfs.read_stat(os.getpid())
    assert me is not None and procfs.is_same_process(os.getpid(), me.starttime)
    assert not procfs.is_same_process(os.getpid(), me.starttime + 1)


def test_criu_argv() -> None:
    dump = criu.dump_argv(Path("/c"), 42, Path("/ck/images"), Path("/ck/s.sh"), leave_running=True)
    assert dump[:4] == ["/c", "dump", "-t", "42"]
    assert "--leave-running" in dump and "--network-lock" in dump and "--file-locks" in dump
    rest = criu.restore_argv(
        Path("/c"), Path("/ck/images"), Path("/w"), Path("/root"), Path("/w/pid")
    )
    for flag in ("--restore-detached", "--restore-sibling", "--manage-cgroups=ignore"):
        assert flag in rest
    script = criu.action_script(Path("/up per"), Path("/dest"))
    assert "post-dump" in script and "'/up per'/." in script


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this host")
def test_exec_helper_joins_files_then_execs(tmp_path: Path) -> None:
    helper = ensure_exec_helper(tmp_path)
    assert helper is not None and ensure_exec_helper(tmp_path) == helper
    a, b = tmp_path / "a.procs", tmp_path / "b.procs"
    a.touch()
    b.touch()
    argv = helper_argv(helper, [a, b], False, ["/bin/sh", "-c", "echo $$"])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    assert a.read_text().strip() == out == b.read_text().strip()
    bad = helper_argv(helper, [tmp_path / "missing/x"], False, ["/bin/true"])
    assert subprocess.run(bad, capture_output=True).returncode == 126


def test_python_exec_helper_fallback(tmp_path: Path) -> None:
    a = tmp_path / "a.procs"
    a.touch()
    argv = helper_argv(None, [a], False, ["/bin/sh", "-c", "echo $$"])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    assert a.read_text().strip() == out


def test_moving_names_what_started_exited_or_is_stuck() -> None:
    before = {(10, 1): ("xterm", ""), (11, 5): ("sh", "")}
    after = {(10, 1): ("xterm", ""), (12, 9): ("true", ""), (13, 9): ("gimp", "Z")}
    assert procfs.moving(before, after) == [
        "true(12) started",
        "gimp(13) started",
        "sh(11) exited",
        "gimp(13) is a zombie (Z)",
    ]
    assert procfs.moving(before, before) == []


def test_tree_shape_of_real_processes_ignores_cpu_and_sees_a_new_one() -> None:
    me = os.getpid()
    first = procfs.tree_shape([me])
    sum(range(2_000_000))  # CPU ticks move; the shape does not
    assert procfs.tree_shape([me]) == first
    child = subprocess.Popen(["sleep", "5"])
    try:
        shape = procfs.tree_shape([me, child.pid])
        assert procfs.moving(first, shape) == [f"sleep({child.pid}) started"]
        child.kill()
        child.wait()
        # reaped: gone from /proc, so the shape is the first one again
        assert procfs.tree_shape([me, child.pid]) == first
    finally:
        child.kill()


# A template's pstree.img as CRIU 4.2.1 wrote it here (init, X, wm, agent, a shell and its child).
PSTREE = bytes.fromhex(
    "19435654303027500a000000080110001801200128010a000000080210011802200228020a000000"
    "080310011803200328030a000000080410011804200428040a000000080510011805200528050a00"
    "0000081e1005181e201e281e0a000000080610011806200628060a00000008071006180620062807"
)


def test_parse_pstree_reads_crius_process_tree() -> None:
    tasks = criu.parse_pstree(PSTREE)
    assert [(t.pid, t.ppid) for t in tasks] == [
        (1, 0), (2, 1), (3, 1), (4, 1), (5, 1), (30, 5), (6, 1), (7, 6)
    ]  # fmt: skip
    assert all(t.threads == (t.pid,) for t in tasks)
    # threads packed (wire type 2) as newer encoders write them
    packed = b"\x00" * 8 + (10).to_bytes(4, "little") + bytes.fromhex("0809100118092a020910")
    assert criu.parse_pstree(packed) == [criu.DumpedTask(9, 1, (9, 16))]
    with pytest.raises(ValueError, match="truncated"):
        criu.parse_pstree(PSTREE[:-3])


def test_a_process_seen_around_the_dump_but_not_in_it_is_missing() -> None:
    dumped = [criu.DumpedTask(1, 0, (1,)), criu.DumpedTask(2, 1, (2,))]
    before = {1: "init", 2: "Xvfb", 40: "sleep", 41: "true"}
    after = {1: "init", 2: "Xvfb", 40: "sleep", 42: "sh"}
    # 41 exited and 42 started around the freeze (churn); 40 was there throughout
    assert criu.missing_from_dump(before, after, dumped) == ["sleep(40)"]
    assert criu.missing_from_dump({1: "init"}, {1: "init"}, dumped) == []


def test_a_thread_that_ran_throughout_the_dump_but_is_not_in_it_is_missing() -> None:
    dumped = [criu.DumpedTask(1, 0, (1,)), criu.DumpedTask(7, 1, (7, 8, 9))]
    # tid -> starttime: 8 and 9 ran throughout; 10 ended and 11 began around the freeze; 12 is a
    # tid reused by a new thread (another start time), so it is churn too
    before = {1: {1: 100}, 7: {7: 200, 8: 201, 9: 202, 10: 203, 12: 204}}
    after = {1: {1: 100}, 7: {7: 200, 8: 201, 9: 202, 11: 205, 12: 300}}
    assert criu.missing_threads(before, after, dumped) == []
    short = [criu.DumpedTask(1, 0, (1,)), criu.DumpedTask(7, 1, (7, 9))]
    assert criu.missing_threads(before, after, short) == ["thread 8 of process 7"]
    # a process missing as a whole is the process check's report, not one line per thread
    assert criu.missing_threads(before, after, [criu.DumpedTask(1, 0, (1,))]) == []


def test_a_thread_without_its_core_image_is_named() -> None:
    dumped = [criu.DumpedTask(1, 0, (1,)), criu.DumpedTask(7, 1, (7, 8))]
    names = ["pstree.img", "core-1.img", "core-7.img", "mm-7.img"]
    assert criu.threads_without_core(dumped, names) == [8]
    assert criu.threads_without_core(dumped, [*names, "core-8.img"]) == []


def test_a_zombie_listed_with_thread_0_is_whole_with_its_pids_core() -> None:
    """CRIU 4.2.1 lists a zombie (a shell's child that exited, not yet waited for) with the one
    thread 0 and writes its core under the pid: CI's prefork of a slot running a fork loop was
    refused as "threads [0] ... without their core-<tid>.img" on the code before."""
    dumped = [criu.DumpedTask(1, 0, (1,)), criu.DumpedTask(9, 1, (0,))]
    names = ["pstree.img", "core-1.img", "core-9.img"]
    assert criu.threads_without_core(dumped, names) == []
    assert criu.threads_without_core(dumped, names[:2]) == [9]
    # sampled before and after with its own tid, the zombie's one thread is held
    before, after = {1: {1: 100}, 9: {9: 300}}, {1: {1: 100}, 9: {9: 300}}
    assert criu.missing_threads(before, after, dumped) == []


def test_sampled_threads_of_a_live_process_tell_churn_from_a_miss() -> None:
    """The sampler on a real process whose thread pool churns between the two samples: threads
    that ran throughout are checked, the ones that came and went are not."""
    code = (
        "import sys, threading, time\n"
        "stop = threading.Event()\n"
        "keep = [threading.Thread(target=stop.wait) for _ in range(3)]\n"
        "[t.start() for t in keep]\n"
        "print('up', flush=True)\n"
        "while not stop.is_set():\n"
        "    t = threading.Thread(target=time.sleep, args=(0.002,)); t.start(); t.join()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        pidns = procfs.namespaces(child.pid)["pid"]
        before = procfs.in_pid_namespace([child.pid], pidns)
        after = procfs.in_pid_namespace([child.pid], pidns)
    finally:
        child.kill()
        child.wait()
    assert before[child.pid].comm.startswith("python")
    was, now = before[child.pid].threads, after[child.pid].threads
    stable = sorted(t for t in was.keys() & now.keys() if was[t] == now[t])
    assert len(stable) >= 4  # the main thread and the three kept ones
    every = tuple(sorted(was.keys() | now.keys()))
    full = [criu.DumpedTask(child.pid, 1, every)]
    thr_before = {p: s.threads for p, s in before.items()}
    thr_after = {p: s.threads for p, s in after.items()}
    assert criu.missing_threads(thr_before, thr_after, full) == []
    dropped = stable[-1]
    short = [criu.DumpedTask(child.pid, 1, tuple(t for t in every if t != dropped))]
    assert criu.missing_threads(thr_before, thr_after, short) == [
        f"thread {dropped} of process {child.pid}"
    ]


def test_a_checkpoint_dir_to_adopt_needs_its_criu_images(tmp_path: Path) -> None:
    from drumsd.linux import checkpoint_files

    dest = tmp_path / "cp"
    images = dest / "images"
    images.mkdir(parents=True)
    (dest / "upper").mkdir()
    (images / "pstree.img").write_bytes(PSTREE)
    (images / "inventory.img").write_bytes(bytes.fromhex("1943565458594960") + b"\x08\x02")
    for t in criu.parse_pstree(PSTREE):
        (images / f"core-{t.pid}.img").write_bytes(b"\x00" * 16)
    (images / "pages-1.img").write_bytes(b"")  # raw page data may be empty
    meta = {"processes": 8, "threads": 8}
    assert checkpoint_files.dump_problems(dest, meta) == []

    assert checkpoint_files.dump_problems(dest, {"processes": 9}) == [
        "meta.json says processes 9, pstree.img holds 8"
    ]
    (images / "core-30.img").unlink()
    assert checkpoint_files.dump_problems(dest, meta) == [
        "images/ lacks the core-<tid>.img of threads [30] that pstree.img lists"
    ]
    (images / "pstree.img").write_bytes(PSTREE[:-3])
    (images / "inventory.img").write_bytes(b"\x19C")
    (dest / "upper").rmdir()
    problems = checkpoint_files.dump_problems(dest, meta)
    assert problems[0] == "images/inventory.img is 2 bytes: not a CRIU image"
    assert "images/pstree.img cannot be read as CRIU's process tree (" in problems[1]
    assert problems[2] == f"{dest / 'upper'} is missing: a checkpoint holds its upper layer there"
    (images / "pstree.img").unlink()
    (images / "inventory.img").unlink()
    assert checkpoint_files.dump_problems(dest, meta)[:2] == [
        "images/pstree.img is missing",
        "images/inventory.img is missing",
    ]
    if os.geteuid() != 0:  # root reads a mode-0 file anyway
        (images / "core-1.img").chmod(0)
        assert "images/core-1.img is not readable (Permission denied)" in (
            checkpoint_files.dump_problems(dest, meta)
        )
    assert checkpoint_files.dump_problems(tmp_path / "nothing", meta) == [
        f"{tmp_path / 'nothing' / 'images'} is missing: a checkpoint holds CRIU's images there"
    ]


def test_the_dump_check_refuses_a_dump_missing_a_thread_and_names_it() -> None:
    """What `_dump` raises (and discards the dump for) when a thread that ran throughout is not
    in pstree.img; a template's dump (not left running) does not judge threads by a sample."""
    from types import SimpleNamespace

    from drumsd.runtime.linux.dumps import Dumper

    inst = SimpleNamespace(iid="i-7")
    live = {1: procfs.NsProcess("init", {1: 10}), 7: procfs.NsProcess("chromium", {7: 20, 8: 21})}
    dumped = [criu.DumpedTask(1, 0, (1,)), criu.DumpedTask(7, 1, (7,))]
    names = ["core-1.img", "core-7.img"]
    err = Dumper.mismatch(inst, live, live, True, dumped, names)
    assert err is not None and err.code == "runtime_error"
    assert "thread 8 of process 7 ran before and after it but are not in the dump" in err.message
    assert err.detail["missing"] == ["thread 8 of process 7"]
    assert Dumper.mismatch(inst, live, {}, False, dumped, names) is None
    whole = [criu.DumpedTask(1, 0, (1,)), criu.DumpedTask(7, 1, (7, 8))]
    assert Dumper.mismatch(inst, live, live, True, whole, [*names, "core-8.img"]) is None
    err = Dumper.mismatch(inst, live, live, True, whole, names)
    assert err is not None and err.detail["missing"] == ["core-8.img"]
