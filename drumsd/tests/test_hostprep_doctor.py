"""doctor's pure assessment and parsers, hostprep's cache layout and its no-op second run."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from pathlib import Path

import pytest
from drumsd.linux import doctor, hostprep
from drumsd.linux.doctor import HostFacts

GOOD = HostFacts(
    kernel="6.18.44-fc-v657",
    is_root=True,
    criu_path="/usr/local/sbin/criu",
    criu_version="4.2.1",
    criu_check_ok=True,
    criu_check_output="Looks good.",
    cgroup_v1={
        "memory": "/sys/fs/cgroup/memory",
        "cpu": "/sys/fs/cgroup/cpu",
        "pids": "/sys/fs/cgroup/pids",
    },
    cgroup_v2_mount="/sys/fs/cgroup/unified",
    cgroup_v2_controllers=["hugetlb"],
    filesystems=["ext4", "tmpfs", "overlay"],
    ksm_run=0,
    psi=True,
    mem_total=24 << 30,
    mem_available=20 << 30,
    state_dir="/run/drums",
    state_dir_free=8 << 30,
    state_dir_fs="tmpfs",
    tools={"unshare": True, "debootstrap": True},
    images={"base": "ab" * 32, "office": "cd" * 32},
)


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


def test_a_good_host_is_ready() -> None:
    checks = doctor.assess(GOOD)
    assert all(c.status == "ok" for c in checks), doctor.render(checks)
    assert doctor.exit_code(checks) == 0
    assert doctor.render(checks).endswith("host is ready")


@pytest.mark.parametrize(
    ("change", "name", "status", "advice"),
    [
        ({"kernel": "5.10.0-28-amd64"}, "kernel", "fail", "newer kernel"),
        ({"is_root": False}, "root", "fail", "as root"),
        ({"criu_path": None}, "criu", "fail", "host prepare"),
        (
            {
                "criu_version": "3.17.1",
                "criu_check_ok": False,
                "criu_check_output": "Error: vdso: Unexpected rt vDSO area bounds",
            },
            "criu",
            "fail",
            "host prepare",
        ),
        ({"criu_version": "4.1.1"}, "criu", "warn", "4.2.1"),
        ({"cgroup_v1": {"memory": "/m"}}, "cgroups", "fail", "subtree_control"),
        ({"filesystems": ["ext4"]}, "overlayfs", "fail", "modprobe overlay"),
        ({"ksm_run": None}, "ksm", "warn", "CONFIG_KSM"),
        ({"psi": False}, "psi", "warn", "psi=1"),
        ({"mem_available": 1 << 30}, "memory", "warn", "free memory"),
        ({"state_dir_fs": "ext4"}, "state_dir", "warn", "tmpfs"),
        ({"state_dir_free": None}, "state_dir", "warn", "drumsd creates it"),
        ({"tools": {"unshare": False, "debootstrap": True}}, "tools", "fail", "prepare-host"),
        ({"images": {"base": None}}, "image base", "warn", "image build --profile base"),
        ({"max_user_namespaces": 0}, "userns", "warn", "max_user_namespaces"),
        ({"procview_tools": {"lxcfs": True, "cc": False}}, "procview", "warn", "lxcfs gcc"),
    ],
)
def test_each_gap_is_reported_with_what_to_do(
    change: dict, name: str, status: str, advice: str
) -> None:
    checks = by_name(doctor.assess(dataclasses.replace(GOOD, **change)))
    assert checks[name].status == status
    assert advice in checks[name].fix
    rendered = doctor.render(list(checks.values()))
    assert advice in rendered
    assert doctor.exit_code(list(checks.values())) == (1 if status == "fail" else 0)


def test_cgroup_v2_host_is_fine() -> None:
    facts = dataclasses.replace(
        GOOD,
        cgroup_v1={},
        cgroup_v2_mount="/sys/fs/cgroup",
        cgroup_v2_controllers=["cpuset", "cpu", "io", "memory", "pids"],
    )
    assert by_name(doctor.assess(facts))["cgroups"].status == "ok"


MOUNTINFO = """\
30 1 254:0 / / rw,relatime - ext4 /dev/vda rw
35 30 0:28 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
36 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
37 30 0:30 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
38 30 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
"""


def test_parse_mountinfo() -> None:
    v1, v2 = doctor.parse_mountinfo(MOUNTINFO)
    assert v1 == {
        "memory": "/sys/fs/cgroup/memory",
        "cpu": "/sys/fs/cgroup/cpu,cpuacct",
        "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
        "pids": "/sys/fs/cgroup/pids",
    }
    assert v2 == "/sys/fs/cgroup/unified"


def test_parse_meminfo() -> None:
    info = doctor.parse_meminfo("MemTotal:       24576000 kB\nHugePages_Total:       0\n")
    assert info == {"MemTotal": 24576000 * 1024, "HugePages_Total": 0}


def test_criu_cache_layout_is_keyed_by_the_tarball_and_patch_hashes(tmp_path: Path) -> None:
    paths = hostprep.CriuPaths.for_patch(tmp_path)
    built_with = hostprep.CRIU_PATCH.read_bytes() + b"\0RUNDIR=/dev/shm/drums-criu"
    key = f"4.2.1-{hostprep.CRIU_SHA256[:12]}-{hashlib.sha256(built_with).hexdigest()[:8]}"
    assert paths.binary == tmp_path / "criu" / key / "criu"


def test_ensure_criu_is_a_fast_noop_when_built(tmp_path: Path) -> None:
    """A cached binary is linked and returned without apt, downloads or make."""
    binary = hostprep.CriuPaths.for_patch(tmp_path).binary
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho Version: 4.2.1\n")
    binary.chmod(0o755)
    link = tmp_path / "sbin" / "criu"
    messages: list[str] = []
    assert hostprep.ensure_criu(tmp_path, progress=messages.append, link=link) == binary
    assert os.readlink(link) == str(binary)
    started = time.monotonic()
    assert hostprep.ensure_criu(tmp_path, progress=messages.append, link=link) == binary
    assert time.monotonic() - started < 1.0
    assert messages == [f"criu: linked {link} -> {binary}"]  # the second run said nothing


def test_sid_source_entry_is_source_only() -> None:
    lines = hostprep.SID_SRC_ENTRY.splitlines()
    assert "Types: deb-src" in lines and not any(line == "Types: deb" for line in lines)


def test_kernel_limits_short_of_the_admitted_slots_warn_with_the_command() -> None:
    from drumsd.core import host_limits

    needs = host_limits.needs(200, inotify_instances=128, inotify_watches=10**7, nofile=10**6)
    checks = by_name(
        doctor.assess(dataclasses.replace(GOOD, limit_needs=needs, admitted_slots=200))
    )
    check = checks["kernel limits"]
    assert check.status == "warn"
    need = 128 + 200 * host_limits.SLOT_INOTIFY_INSTANCES
    assert f"fs.inotify.max_user_instances=128 < {need}" in check.detail
    assert f"sysctl -w fs.inotify.max_user_instances={need}" in check.fix
    enough = host_limits.needs(200, inotify_instances=need, inotify_watches=10**7, nofile=10**6)
    ok = by_name(doctor.assess(dataclasses.replace(GOOD, limit_needs=enough, admitted_slots=200)))
    assert ok["kernel limits"].status == "ok"
