"""`drumsd doctor`: what this host has and lacks for drums, and what to do about each gap.

`gather_facts()` reads the OS; `assess()` is pure (facts in, checks out) so every verdict and
piece of advice is unit-tested without the host it describes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from drumsd.core.config import Config
from drumsd.core.host_limits import LimitNeed, max_admitted_slots
from drumsd.linux import host_limits, hostprep

MIN_KERNEL = (5, 15)  # idmapped mounts on tmpfs/overlay, pidfd, clone3: what the runtime uses
CONTROLLERS = ("memory", "cpu", "pids")
OFFICE_SLOT_MIB = 110  # ~105 MiB per restored idle Calc copy (criu-desktop.md)


@dataclass(frozen=True)
class HostFacts:
    kernel: str
    is_root: bool
    criu_path: str | None
    criu_version: str | None
    criu_check_ok: bool | None
    criu_check_output: str
    cgroup_v1: dict[str, str]  # controller -> mount point
    cgroup_v2_mount: str | None
    cgroup_v2_controllers: list[str]
    filesystems: list[str]
    ksm_run: int | None  # None: no KSM in this kernel
    psi: bool
    mem_total: int
    mem_available: int
    state_dir: str
    state_dir_free: int | None
    state_dir_fs: str | None
    tools: dict[str, bool]
    images: dict[str, str | None]  # profile -> sha256 of the built image (None: not built)
    max_user_namespaces: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
    # The kernel limits all slots share, against what the most slots this host admits need.
    limit_needs: list[LimitNeed] = field(default_factory=list)
    admitted_slots: int = 0
    # What the opt-in per-slot /proc view (config procview_dir) needs: lxcfs, and a C compiler
    # for its sysinfo() library. Empty: not looked at.
    procview_tools: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail"
    detail: str
    fix: str = ""


def parse_kernel(release: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n < 10 << 30 else f"{n / (1 << 30):.1f} GiB"


def assess(f: HostFacts) -> list[Check]:
    """Turn facts into checks. fail = drumsd cannot run slots; warn = works, but worse."""
    checks: list[Check] = []
    add = checks.append

    kernel = parse_kernel(f.kernel)
    if kernel >= MIN_KERNEL:
        add(Check("kernel", "ok", f.kernel))
    else:
        add(
            Check(
                "kernel",
                "fail",
                f"{f.kernel} is older than {MIN_KERNEL[0]}.{MIN_KERNEL[1]}",
                "use a newer kernel (Debian 12 backports, Ubuntu 22.04 HWE or later)",
            )
        )

    add(
        Check(
            "root",
            "ok" if f.is_root else "fail",
            "running as root" if f.is_root else "not root",
            "" if f.is_root else "run drumsd as root: it mounts, unshares and runs criu",
        )
    )

    if f.criu_path is None:
        add(
            Check(
                "criu",
                "fail",
                "no criu binary found",
                "run `drumsd host prepare` (builds CRIU 4.2.1 into /var/cache/drums)",
            )
        )
    else:
        version = f.criu_version or "unknown version"
        old = f.criu_version is not None and _version_tuple(f.criu_version) < (4, 2)
        if f.criu_check_ok and not old:
            add(Check("criu", "ok", f"{f.criu_path} ({version}), `criu check` passed"))
        elif f.criu_check_ok:
            add(
                Check(
                    "criu",
                    "warn",
                    f"{f.criu_path} is {version}: cannot dump TCP/UDP sockets on Linux >= 6.16",
                    "run `drumsd host prepare` for the pinned 4.2.1",
                )
            )
        else:
            last = (f.criu_check_output.strip().splitlines() or ["no output"])[-1]
            add(
                Check(
                    "criu",
                    "fail",
                    f"`{f.criu_path} check` failed: {last}",
                    "run `drumsd host prepare`; if it still fails, the kernel lacks "
                    "checkpoint/restore support (CONFIG_CHECKPOINT_RESTORE)",
                )
            )

    v1_missing = [c for c in CONTROLLERS if c not in f.cgroup_v1]
    v2_missing = [c for c in CONTROLLERS if c not in f.cgroup_v2_controllers]
    if not v1_missing:
        mounts = ", ".join(f"{c} at {f.cgroup_v1[c]}" for c in CONTROLLERS)
        add(Check("cgroups", "ok", f"cgroup v1: {mounts}"))
    elif f.cgroup_v2_mount and not v2_missing:
        add(
            Check(
                "cgroups",
                "ok",
                f"cgroup v2 at {f.cgroup_v2_mount}: {' '.join(f.cgroup_v2_controllers)}",
            )
        )
    else:
        have = sorted(set(f.cgroup_v1) | set(f.cgroup_v2_controllers))
        add(
            Check(
                "cgroups",
                "fail",
                f"memory, cpu and pids controllers are not all available (have: "
                f"{', '.join(have) or 'none'})",
                "mount cgroup2 at /sys/fs/cgroup with memory, cpu and pids enabled in "
                "cgroup.subtree_control (under systemd: Delegate=yes for the drumsd unit)",
            )
        )

    if "overlay" in f.filesystems:
        add(Check("overlayfs", "ok", "overlay is available"))
    else:
        add(
            Check(
                "overlayfs",
                "fail",
                "overlay is not in /proc/filesystems",
                "modprobe overlay (and add it to /etc/modules)",
            )
        )

    if f.ksm_run is None:
        add(
            Check(
                "ksm",
                "warn",
                "no KSM in this kernel: each idle desktop costs ~100 MiB",
                "use a kernel with CONFIG_KSM to pack many idle slots",
            )
        )
    elif f.ksm_run == 1:
        add(Check("ksm", "ok", "KSM is running"))
    else:
        add(Check("ksm", "ok", "KSM is available (drumsd turns it on when `ksm` is enabled)"))

    add(
        Check(
            "psi",
            "ok" if f.psi else "warn",
            "pressure stall information available" if f.psi else "no /proc/pressure",
            "" if f.psi else "boot with psi=1 so admission sees memory and CPU pressure",
        )
    )

    slots = f.mem_available // (OFFICE_SLOT_MIB << 20)
    status = "ok" if f.mem_available >= 2 << 30 else "warn"
    add(
        Check(
            "memory",
            status,
            f"{_mib(f.mem_available)} available of {_mib(f.mem_total)} "
            f"(~{slots} idle office slots without KSM)",
            "" if status == "ok" else "free memory: each desktop needs 100-250 MiB",
        )
    )

    if f.state_dir_free is None:
        add(
            Check(
                "state_dir",
                "warn",
                f"{f.state_dir} does not exist yet",
                "drumsd creates it; make sure its file system has room (tmpfs preferred)",
            )
        )
    else:
        tmpfs = f.state_dir_fs == "tmpfs"
        status = "ok" if f.state_dir_free >= 2 << 30 else "warn"
        where = f"{f.state_dir} ({f.state_dir_fs or 'unknown fs'}): {_mib(f.state_dir_free)} free"
        fix = "" if status == "ok" else "give the state dir at least 2 GiB"
        if not tmpfs:
            status, fix = "warn", "put the state dir on tmpfs: restores read images from it"
        add(Check("state_dir", status, where, fix))

    missing_tools = sorted(t for t, present in f.tools.items() if not present)
    add(
        Check(
            "tools",
            "fail" if missing_tools else "ok",
            f"missing: {', '.join(missing_tools)}" if missing_tools else "all present",
            "run scripts/prepare-host.sh (apt packages)" if missing_tools else "",
        )
    )

    for profile, sha in sorted(f.images.items()):
        if sha:
            add(Check(f"image {profile}", "ok", f"built, sha256 {sha[:16]}..."))
        else:
            add(
                Check(
                    f"image {profile}",
                    "warn",
                    "not built",
                    f"drumsd image build --profile {profile}",
                )
            )

    short = [n for n in f.limit_needs if n.short]
    if short:
        add(
            Check(
                "kernel limits",
                "warn",
                "; ".join(f"{n.name}={n.current} < {n.needed}" for n in short)
                + f" (what {f.admitted_slots} slots need; drumsd raises them at start when it "
                "runs as root, else a fork or create fails on them)",
                "; ".join(n.how.replace("=N", f"={n.needed}") for n in short),
            )
        )
    elif f.limit_needs:
        add(
            Check(
                "kernel limits",
                "ok",
                ", ".join(f"{n.name}={n.current}" for n in f.limit_needs)
                + f": enough for {f.admitted_slots} slots",
            )
        )

    if f.procview_tools:
        lacking = sorted(t for t, present in f.procview_tools.items() if not present)
        add(
            Check(
                "procview",
                "warn" if lacking else "ok",
                f"missing: {', '.join(lacking)} (needed only with procview_dir set: the daemon "
                "refuses to start without them)"
                if lacking
                else "lxcfs and a C compiler present (procview_dir: /proc files by LXCFS, "
                "sysinfo() by a preloaded library)",
                "apt-get install lxcfs gcc (scripts/prepare-host.sh does)" if lacking else "",
            )
        )

    if f.max_user_namespaces == 0:
        add(
            Check(
                "userns",
                "warn",
                "user namespaces are disabled",
                "sysctl user.max_user_namespaces=10000 (the hardened slot needs them)",
            )
        )
    return checks


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def render(checks: list[Check]) -> str:
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    lines = []
    for c in checks:
        lines.append(f"[{marks[c.status]}] {c.name:<14} {c.detail}")
        if c.fix:
            lines.append(f"       {'':<14} -> {c.fix}")
    fails = sum(c.status == "fail" for c in checks)
    warns = sum(c.status == "warn" for c in checks)
    lines.append(f"{fails} problem(s), {warns} warning(s)" if fails or warns else "host is ready")
    return "\n".join(lines)


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == "fail" for c in checks) else 0


# ---------------------------------------------------------------- effects: read the host


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def parse_mountinfo(text: str) -> tuple[dict[str, str], str | None]:
    """(v1 controller -> mount point, the cgroup2 mount point) from /proc/self/mountinfo."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype, opts = rfields[0], rfields[2].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = fields[4]
        elif fstype == "cgroup":
            for opt in opts:
                if opt in CONTROLLERS or opt in ("cpuacct", "freezer", "cpuset"):
                    v1.setdefault(opt, fields[4])
    return v1, v2


def parse_meminfo(text: str) -> Mapping[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def gather_facts(
    state_dir: Path = Path("/run/drums"),
    cache_root: Path = hostprep.DEFAULT_CACHE_ROOT,
    criu: Path = hostprep.CRIU_LINK,
    profiles: tuple[str, ...] = ("base", "office"),
    slot_range: tuple[int, int] = Config.model_fields["slot_range"].default,
) -> HostFacts:
    criu_path = str(criu) if criu.exists() else shutil.which("criu")
    version = None
    check_ok: bool | None = None
    check_out = ""
    if criu_path:
        try:
            proc = subprocess.run(
                [criu_path, "--version"], capture_output=True, text=True, timeout=10
            )
            m = re.search(r"Version:\s*(\S+)", proc.stdout)
            version = m.group(1) if m else None
            check_ok, check_out = hostprep.criu_check(Path(criu_path))
        except (OSError, subprocess.TimeoutExpired) as exc:
            check_ok, check_out = False, str(exc)

    v1, v2 = parse_mountinfo(_read("/proc/self/mountinfo") or "")
    v2_controllers = (_read(f"{v2}/cgroup.controllers") or "").split() if v2 else []
    filesystems = [
        line.split()[-1] for line in (_read("/proc/filesystems") or "").splitlines() if line.strip()
    ]
    ksm = _read("/sys/kernel/mm/ksm/run")
    mem = parse_meminfo(_read("/proc/meminfo") or "")

    free = shutil.disk_usage(state_dir).free if state_dir.exists() else None
    fs_type = _fs_type(state_dir) if state_dir.exists() else None

    images: dict[str, str | None] = {}
    for profile in profiles:
        meta = _read(str(cache_root / "images" / profile / "image.json"))
        images[profile] = json.loads(meta)["sha256"] if meta else None

    userns = _read("/proc/sys/user/max_user_namespaces")
    admitted = max_admitted_slots(slot_range, mem.get("MemTotal", 0) >> 20)
    tools = {
        t: shutil.which(t) is not None for t in ("unshare", "nsenter", "mount", "debootstrap", "ip")
    }
    return HostFacts(
        kernel=os.uname().release,
        is_root=os.geteuid() == 0,
        criu_path=criu_path,
        criu_version=version,
        criu_check_ok=check_ok,
        criu_check_output=check_out,
        cgroup_v1=v1,
        cgroup_v2_mount=v2,
        cgroup_v2_controllers=v2_controllers,
        filesystems=filesystems,
        ksm_run=int(ksm) if ksm and ksm.strip().isdigit() else None,
        psi=_read("/proc/pressure/memory") is not None,
        mem_total=mem.get("MemTotal", 0),
        mem_available=mem.get("MemAvailable", 0),
        state_dir=str(state_dir),
        state_dir_free=free,
        state_dir_fs=fs_type,
        tools=tools,
        images=images,
        max_user_namespaces=int(userns) if userns else None,
        limit_needs=host_limits.host_needs(admitted),
        admitted_slots=admitted,
        procview_tools={
            "lxcfs": shutil.which("lxcfs") is not None,
            "cc": (shutil.which("cc") or shutil.which("gcc")) is not None,
        },
    )


def _fs_type(path: Path) -> str | None:
    """File system type of the mount holding `path` (longest matching mount point)."""
    best, best_type = "", None
    target = str(path.resolve())
    for line in (_read("/proc/self/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mnt = parts[1].replace("\\040", " ")
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, best_type = mnt, parts[2]
    return best_type


def facts_as_dict(facts: HostFacts) -> dict:
    return asdict(facts)
