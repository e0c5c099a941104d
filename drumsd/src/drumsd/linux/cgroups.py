"""cgroup drivers for slots: v1 (memory, cpu, pids, freezer hierarchies) and v2 (one hierarchy).

Both take their root paths as parameters so tests run against a temp dir. The limit plans are pure
(`limit_writes_v1`, `limit_writes_v2`); the drivers only write and read files. Slot cgroups nest
under the daemon's own cgroup (from /proc/self/cgroup) in a group of their own (`drums` by
default; one per runtime state dir), so a host that confines the daemon confines its slots too and
two runtimes on one host never sweep each other's slots.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from drumsd.core.seams import SlotLimits

MIB = 1024 * 1024
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "cpu", "pids", "freezer")
# With the /proc view on (config procview_dir), slots also join these where mounted: LXCFS counts
# a reader's CPUs from its cpuset group (and that path's CPU quota) and its CPU time from cpuacct.
V1_VIEW_CONTROLLERS = ("cpuacct", "cpuset")
V2_CONTROLLERS = ("memory", "cpu", "pids")
GROUP = "drums"


class CgroupError(RuntimeError):
    """A cgroup operation failed; the message names the file and what to do next."""


@dataclass(frozen=True)
class CgroupWrite:
    """One limit to write: `controller`'s `file` in the slot's cgroup gets `value`."""

    controller: str
    file: str
    value: str


def cpu_quota_us(vcpus: float) -> int:
    return max(1000, round(vcpus * CPU_PERIOD_US))


# A cgroup's CPU weight when nothing set it: v1 shares 1024, v2 weight 100 (the same weight).
DEFAULT_SHARES = 1024


def clamp_shares(shares: int) -> int:
    return max(2, min(262144, shares))


def v2_weight(shares: int) -> int:
    return max(1, min(10000, shares * 100 // DEFAULT_SHARES))


def limit_writes_v1(limits: SlotLimits) -> list[CgroupWrite]:
    return [
        CgroupWrite("memory", "memory.limit_in_bytes", str(limits.memory_mib * MIB)),
        CgroupWrite("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US)),
        CgroupWrite("cpu", "cpu.cfs_quota_us", str(cpu_quota_us(limits.vcpus))),
        CgroupWrite("pids", "pids.max", str(limits.pids_max)),
    ]


def limit_writes_v2(limits: SlotLimits) -> list[CgroupWrite]:
    return [
        CgroupWrite("memory", "memory.max", str(limits.memory_mib * MIB)),
        CgroupWrite("memory", "memory.swap.max", str(limits.swap_mib * MIB)),
        CgroupWrite("memory", "memory.oom.group", "1"),
        CgroupWrite("cpu", "cpu.max", f"{cpu_quota_us(limits.vcpus)} {CPU_PERIOD_US}"),
        CgroupWrite("pids", "pids.max", str(limits.pids_max)),
    ]


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup -> {controller: path}; the v2 entry is under the key ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c.removeprefix("name=")] = path
    return out


def parse_cgroup_mounts(mountinfo: str) -> tuple[dict[str, Path], Path | None]:
    """mountinfo -> ({v1 controller: mount point}, v2 mount point or None)."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        mnt, fstype = Path(fields[4]), rfields[0]
        if fstype == "cgroup2" and v2 is None:
            v2 = mnt
        elif fstype == "cgroup":
            for opt in rfields[2].split(","):
                if opt in V1_CONTROLLERS + V1_VIEW_CONTROLLERS and opt not in v1:
                    v1[opt] = mnt
    return v1, v2


# The leaf the daemon runs in below the cgroup it manages (cgroup v2), next to its slots' group.
DAEMON_LEAF = "daemon"


def managed_base(own: str) -> str:
    """The v2 cgroup drumsd manages, from its own (/proc/self/cgroup): its parent when the daemon
    already runs in the `daemon` leaf, as systemd's DelegateSubgroup=daemon starts it (the NixOS
    unit) and an earlier prepare() leaves it. Taking the leaf itself would find no controllers
    there (systemd enables them in the unit's cgroup, the delegated one), and enabling them in it
    would make the leaf an inner node that a restarted daemon cannot be placed in (EBUSY)."""
    parent, _, name = own.rstrip("/").rpartition("/")
    return (parent or "/") if name == DAEMON_LEAF else own


def _controllers_of(v2_root: Path) -> set[str]:
    try:
        return set((v2_root / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


class CgroupDriver(Protocol):
    """What the runtime needs from a cgroup version. `dirs` maps controller -> cgroup dir."""

    version: int

    def create(self, name: str, limits: SlotLimits) -> dict[str, str]: ...
    def procs_files(self, dirs: Mapping[str, str]) -> list[Path]: ...
    def pids(self, dirs: Mapping[str, str]) -> list[int]: ...
    def set_cpu(self, dirs: Mapping[str, str], vcpus: float | None) -> None: ...
    def set_shares(self, dirs: Mapping[str, str], shares: int | None) -> None: ...
    def cpu_shares(self, dirs: Mapping[str, str]) -> int: ...
    def freeze(self, dirs: Mapping[str, str], timeout_s: float = 2.0) -> None: ...
    def thaw(self, dirs: Mapping[str, str]) -> None: ...
    def kill(self, dirs: Mapping[str, str], timeout_s: float = 5.0) -> None: ...
    def remove(self, dirs: Mapping[str, str], timeout_s: float = 5.0) -> None: ...
    def oom_kills(self, dirs: Mapping[str, str]) -> int: ...
    def pids_max_hits(self, dirs: Mapping[str, str]) -> int: ...
    def memory_bytes(self, dirs: Mapping[str, str]) -> int: ...
    def limits_in_force(self, dirs: Mapping[str, str]) -> dict[str, str]: ...
    def slot_names(self) -> list[str]: ...
    def dirs_of(self, name: str) -> dict[str, str]: ...
    def set_group_weight(self, shares: int) -> None: ...
    def set_daemon_weight(self, shares: int) -> Path: ...
    def set_group_memory(self, limit_mib: int | None) -> None: ...
    def group_memory_bytes(self) -> int: ...
    def remove_group_if_empty(self) -> None: ...


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(
            f"cannot write {value!r} to {path}: {exc.strerror}; check that the controller is "
            "enabled and the daemon may manage this cgroup (run `drumsd doctor`)"
        ) from exc


def _pids_max_hits(events: Path) -> int:
    for line in events.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "max":
            return int(value)
    return 0


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


def freeze_whole(driver: CgroupDriver, dirs: Mapping[str, str], timeout_s: float = 2.0) -> None:
    """Stop every process of a slot (verify reads its state while nothing can change it), or
    leave it running and raise CgroupError: a freeze that did not complete in time is undone,
    so a slot is never left half frozen."""
    try:
        driver.freeze(dirs, timeout_s)
    except (CgroupError, OSError) as exc:
        with contextlib.suppress(OSError):
            driver.thaw(dirs)
        raise CgroupError(f"cannot freeze the slot's cgroup {dict(dirs)}: {exc}") from exc


def _kill_until_empty(driver: CgroupDriver, dirs: Mapping[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        pids = driver.pids(dirs)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise CgroupError(f"processes {pids[:8]} of cgroup {dict(dirs)} survive SIGKILL")
        time.sleep(0.002)


def _rmdir_all(dirs: Sequence[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for d in dirs:
        while True:
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                # EBUSY while exiting tasks still leave the cgroup: retry until the deadline.
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise CgroupError(f"cannot remove cgroup {d}: {exc.strerror}") from exc
                time.sleep(0.002)


class CgroupV1:
    """Separate hierarchies: `mounts` maps controller -> mount point, `bases` controller -> the
    daemon's own path in that hierarchy (from /proc/self/cgroup)."""

    version = 1

    def __init__(
        self,
        mounts: Mapping[str, Path],
        bases: Mapping[str, str],
        group: str = GROUP,
        extra: Sequence[str] = (),
    ) -> None:
        missing = [c for c in V1_CONTROLLERS if c not in mounts]
        if missing:
            raise CgroupError(
                f"cgroup v1 controllers {missing} are not mounted; mount them under "
                "/sys/fs/cgroup or run on a cgroup v2 host"
            )
        self.mounts = dict(mounts)
        self.bases = dict(bases)
        self.group = group
        self.controllers = V1_CONTROLLERS + tuple(c for c in extra if c in mounts)

    @classmethod
    def from_host(cls, group: str = GROUP, extra: Sequence[str] = ()) -> CgroupV1:
        v1, _ = parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
        own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
        # A daemon set_daemon_weight moved into its leaf manages the leaf's parent, as on v2.
        return cls(v1, {c: managed_base(p) for c, p in own.items()}, group, extra)

    def _group(self, controller: str) -> Path:
        base = self.bases.get(controller, "/").lstrip("/")
        return self.mounts[controller] / base / self.group

    def dirs_of(self, name: str) -> dict[str, str]:
        return {c: str(self._group(c) / name) for c in self.controllers}

    def create(self, name: str, limits: SlotLimits) -> dict[str, str]:
        dirs = self.dirs_of(name)
        for d in dirs.values():
            os.makedirs(d, exist_ok=True)
        if "cpuset" in dirs:  # a new cpuset has no CPUs or memory nodes until given its parent's
            for cpuset in (self._group("cpuset"), Path(dirs["cpuset"])):
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (cpuset / f).read_text().strip():
                        _write(cpuset / f, (cpuset.parent / f).read_text().strip())
        for w in limit_writes_v1(limits):
            _write(Path(dirs[w.controller]) / w.file, w.value)
        return dirs

    def procs_files(self, dirs: Mapping[str, str]) -> list[Path]:
        return [Path(dirs[c]) / "cgroup.procs" for c in self.controllers if c in dirs]

    def pids(self, dirs: Mapping[str, str]) -> list[int]:
        return _read_pids(Path(dirs["pids"]) / "cgroup.procs")

    def set_cpu(self, dirs: Mapping[str, str], vcpus: float | None) -> None:
        quota = "-1" if vcpus is None else str(cpu_quota_us(vcpus))
        _write(Path(dirs["cpu"]) / "cpu.cfs_quota_us", quota)

    def set_shares(self, dirs: Mapping[str, str], shares: int | None) -> None:
        """The slot's CPU weight against the other slots (None: the default, 1024)."""
        value = DEFAULT_SHARES if shares is None else clamp_shares(shares)
        _write(Path(dirs["cpu"]) / "cpu.shares", str(value))

    def cpu_shares(self, dirs: Mapping[str, str]) -> int:
        return int((Path(dirs["cpu"]) / "cpu.shares").read_text())

    def freeze(self, dirs: Mapping[str, str], timeout_s: float = 2.0) -> None:
        state = Path(dirs["freezer"]) / "freezer.state"
        _write(state, "FROZEN")
        deadline = time.monotonic() + timeout_s
        while state.read_text().strip() != "FROZEN":
            if time.monotonic() > deadline:
                raise CgroupError(f"{state} did not reach FROZEN in {timeout_s} s")
            time.sleep(0.001)

    def thaw(self, dirs: Mapping[str, str]) -> None:
        _write(Path(dirs["freezer"]) / "freezer.state", "THAWED")

    def kill(self, dirs: Mapping[str, str], timeout_s: float = 5.0) -> None:
        # v1 frozen tasks ignore SIGKILL until thawed.
        if Path(dirs["freezer"]).exists():
            self.thaw(dirs)
        _kill_until_empty(self, dirs, timeout_s)

    def remove(self, dirs: Mapping[str, str], timeout_s: float = 5.0) -> None:
        _rmdir_all([dirs[c] for c in self.controllers if c in dirs], timeout_s)

    def memory_bytes(self, dirs: Mapping[str, str]) -> int:
        return int((Path(dirs["memory"]) / "memory.usage_in_bytes").read_text())

    def oom_kills(self, dirs: Mapping[str, str]) -> int:
        text = (Path(dirs["memory"]) / "memory.oom_control").read_text()
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def pids_max_hits(self, dirs: Mapping[str, str]) -> int:
        """Forks refused because the tree stood at pids.max (pids.events `max`)."""
        return _pids_max_hits(Path(dirs["pids"]) / "pids.events")

    def limits_in_force(self, dirs: Mapping[str, str]) -> dict[str, str]:
        files = [
            ("memory", "memory.limit_in_bytes"),
            ("cpu", "cpu.cfs_quota_us"),
            ("cpu", "cpu.cfs_period_us"),
            ("pids", "pids.max"),
            ("freezer", "freezer.state"),
        ]
        return {f: (Path(dirs[c]) / f).read_text().strip() for c, f in files}

    def remove_group_if_empty(self) -> None:
        for c in self.controllers:
            with contextlib.suppress(OSError):  # still holds slots: keep it
                os.rmdir(self._group(c))

    def set_group_weight(self, shares: int) -> None:
        """The CPU weight of all slots together against the daemon's siblings (v1 shares)."""
        group = self._group("cpu")
        group.mkdir(parents=True, exist_ok=True)
        _write(group / "cpu.shares", str(clamp_shares(shares)))

    def set_daemon_weight(self, shares: int) -> Path:
        """Move this process into the `daemon` leaf of the cpu hierarchy beside the slots' group
        (the root cgroup's weight cannot be set) and give the leaf `shares`; its cgroup dir."""
        leaf = self.mounts["cpu"] / self.bases.get("cpu", "/").lstrip("/") / DAEMON_LEAF
        leaf.mkdir(parents=True, exist_ok=True)
        _write(leaf / "cpu.shares", str(clamp_shares(shares)))
        _write(leaf / "cgroup.procs", str(os.getpid()))
        return leaf

    def set_group_memory(self, limit_mib: int | None) -> None:
        """The memory limit of all slots together (None: no limit). The kernel refuses a limit
        below what the group already uses (EBUSY, raised as OSError)."""
        group = self._group("memory")
        group.mkdir(parents=True, exist_ok=True)
        _write(group / "memory.limit_in_bytes", str(limit_mib << 20) if limit_mib else "-1")

    def group_memory_bytes(self) -> int:
        """What all slots together are charged now (0 before the group exists)."""
        try:
            return int((self._group("memory") / "memory.usage_in_bytes").read_text())
        except FileNotFoundError:
            return 0

    def slot_names(self) -> list[str]:
        names: set[str] = set()
        for c in self.controllers:
            g = self._group(c)
            if g.is_dir():
                names.update(p.name for p in g.iterdir() if p.is_dir())
        return sorted(names)


class CgroupV2:
    """One hierarchy at `root`; the daemon's cgroup is `base`. Slots are leaves of `base/drums`.
    Because of the no-internal-processes rule, `prepare()` moves the daemon into `base/daemon`
    before enabling controllers in `base` (under systemd the unit needs Delegate=yes)."""

    version = 2

    def __init__(self, root: Path, base: str, group: str = GROUP) -> None:
        self.root = root
        self.base = root / base.lstrip("/")
        self.group = self.base / group

    @classmethod
    def from_host(cls, group: str = GROUP) -> CgroupV2:
        _, v2 = parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
        if v2 is None:
            raise CgroupError("no cgroup2 mount found; mount one at /sys/fs/cgroup")
        own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text()).get("", "/")
        return cls(v2, managed_base(own), group)

    def prepare(self) -> None:
        missing = set(V2_CONTROLLERS) - _controllers_of(self.base)
        if missing:
            raise CgroupError(
                f"controllers {sorted(missing)} not available in {self.base}; under systemd set "
                "Delegate=yes on the drumsd unit"
            )
        procs = _read_pids(self.base / "cgroup.procs")
        if procs and self.base != self.root:
            leaf = self.base / DAEMON_LEAF
            leaf.mkdir(exist_ok=True)
            for pid in procs:
                try:
                    _write(leaf / "cgroup.procs", str(pid))
                except CgroupError:
                    pass  # a process that exited meanwhile
        enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
        _write(self.base / "cgroup.subtree_control", enable)
        self.group.mkdir(exist_ok=True)
        _write(self.group / "cgroup.subtree_control", enable)

    def dirs_of(self, name: str) -> dict[str, str]:
        d = str(self.group / name)
        return {"unified": d, "memory": d, "cpu": d, "pids": d, "freezer": d}

    def create(self, name: str, limits: SlotLimits) -> dict[str, str]:
        if not (self.group / "cgroup.subtree_control").exists():
            self.prepare()
        dirs = self.dirs_of(name)
        os.makedirs(dirs["unified"], exist_ok=True)
        for w in limit_writes_v2(limits):
            path = Path(dirs[w.controller]) / w.file
            if w.file == "memory.swap.max" and not path.exists():
                continue  # swap accounting off on this host
            _write(path, w.value)
        return dirs

    def procs_files(self, dirs: Mapping[str, str]) -> list[Path]:
        return [Path(dirs["unified"]) / "cgroup.procs"]

    def pids(self, dirs: Mapping[str, str]) -> list[int]:
        return _read_pids(Path(dirs["unified"]) / "cgroup.procs")

    def set_cpu(self, dirs: Mapping[str, str], vcpus: float | None) -> None:
        value = "max" if vcpus is None else str(cpu_quota_us(vcpus))
        _write(Path(dirs["unified"]) / "cpu.max", f"{value} {CPU_PERIOD_US}")

    def set_shares(self, dirs: Mapping[str, str], shares: int | None) -> None:
        """The slot's CPU weight against the other slots (None: the default, v2 weight 100)."""
        weight = v2_weight(DEFAULT_SHARES if shares is None else shares)
        _write(Path(dirs["unified"]) / "cpu.weight", str(weight))

    def cpu_shares(self, dirs: Mapping[str, str]) -> int:
        """The slot's weight in v1 shares."""
        return int((Path(dirs["unified"]) / "cpu.weight").read_text()) * DEFAULT_SHARES // 100

    def _events(self, dirs: Mapping[str, str], file: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in (Path(dirs["unified"]) / file).read_text().splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value)
        return out

    def freeze(self, dirs: Mapping[str, str], timeout_s: float = 2.0) -> None:
        _write(Path(dirs["unified"]) / "cgroup.freeze", "1")
        deadline = time.monotonic() + timeout_s
        while self._events(dirs, "cgroup.events").get("frozen") != 1:
            if time.monotonic() > deadline:
                raise CgroupError(f"{dirs['unified']} did not freeze in {timeout_s} s")
            time.sleep(0.001)

    def thaw(self, dirs: Mapping[str, str]) -> None:
        _write(Path(dirs["unified"]) / "cgroup.freeze", "0")

    def kill(self, dirs: Mapping[str, str], timeout_s: float = 5.0) -> None:
        kill_file = Path(dirs["unified"]) / "cgroup.kill"
        if kill_file.exists():
            _write(kill_file, "1")  # kills frozen tasks too
        _kill_until_empty(self, dirs, timeout_s)

    def remove(self, dirs: Mapping[str, str], timeout_s: float = 5.0) -> None:
        _rmdir_all([dirs["unified"]], timeout_s)

    def memory_bytes(self, dirs: Mapping[str, str]) -> int:
        return int((Path(dirs["unified"]) / "memory.current").read_text())

    def oom_kills(self, dirs: Mapping[str, str]) -> int:
        return self._events(dirs, "memory.events").get("oom_kill", 0)

    def pids_max_hits(self, dirs: Mapping[str, str]) -> int:
        return _pids_max_hits(Path(dirs["unified"]) / "pids.events")

    def limits_in_force(self, dirs: Mapping[str, str]) -> dict[str, str]:
        d = Path(dirs["unified"])
        files = ["memory.max", "cpu.max", "pids.max", "cgroup.freeze"]
        return {f: (d / f).read_text().strip() for f in files if (d / f).exists()}

    def remove_group_if_empty(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.group)

    def set_group_weight(self, shares: int) -> None:
        if not (self.group / "cgroup.subtree_control").exists():
            self.prepare()
        _write(self.group / "cpu.weight", str(v2_weight(shares)))

    def set_daemon_weight(self, shares: int) -> Path:
        """The weight of the `daemon` leaf prepare() moved this process into; its cgroup dir."""
        if not (self.group / "cgroup.subtree_control").exists():
            self.prepare()
        leaf = self.base / DAEMON_LEAF
        if not leaf.is_dir():
            raise CgroupError(
                f"the daemon runs in {self.base}, not in a {DAEMON_LEAF!r} leaf of its own; run it "
                "under systemd with Delegate=yes (DelegateSubgroup=daemon) to weigh it"
            )
        _write(leaf / "cpu.weight", str(v2_weight(shares)))
        return leaf

    def set_group_memory(self, limit_mib: int | None) -> None:
        if not (self.group / "cgroup.subtree_control").exists():
            self.prepare()
        _write(self.group / "memory.max", str(limit_mib << 20) if limit_mib else "max")

    def group_memory_bytes(self) -> int:
        """What all slots together are charged now (0 before the group exists)."""
        try:
            return int((self.group / "memory.current").read_text())
        except FileNotFoundError:
            return 0

    def slot_names(self) -> list[str]:
        if not self.group.is_dir():
            return []
        return sorted(p.name for p in self.group.iterdir() if p.is_dir())


def detect_driver(group: str = GROUP, *, procview: bool = False) -> CgroupDriver:
    """v1 when the memory, cpu, pids and freezer hierarchies are mounted (this kind of VM), else
    v2 when its root offers memory, cpu and pids. `procview`: v1 slots join cpuacct and cpuset
    too (the /proc view reads them)."""
    v1, v2 = parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    if all(c in v1 for c in V1_CONTROLLERS):
        return CgroupV1.from_host(group, V1_VIEW_CONTROLLERS if procview else ())
    if v2 is not None and set(V2_CONTROLLERS) <= _controllers_of(v2):
        return CgroupV2.from_host(group)
    raise CgroupError(
        "neither cgroup v1 (memory, cpu, pids, freezer) nor a cgroup v2 hierarchy with memory, "
        "cpu and pids is available; run `drumsd doctor`"
    )
