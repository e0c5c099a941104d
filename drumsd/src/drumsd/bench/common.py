"""What every bench shares: the progress callback, the slot limits benches restore with, the quiet
window a cold boot waits for, the nearest-rank percentile and the host arguments (image, image
cache, CRIU). The bench modules import this one and never each other in a circle."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drumsd.core.seams import SlotHandle, SlotLimits

if TYPE_CHECKING:
    from drumsd.runtime.linux import LinuxRuntime, LinuxRuntimeConfig

Progress = Callable[[str], None]
QUIET_WINDOW_S = 0.5
BENCH_LIMITS = SlotLimits(vcpus=1.0, memory_mib=2048, pids_max=1024, tmpfs_mib=512)
CACHE_ROOT = Path("/var/cache/drums")
CRIU = Path("/usr/local/sbin/criu")
KSM_DIR = Path("/sys/kernel/mm/ksm")
MIB = 1024 * 1024


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def add_host_args(parser: argparse.ArgumentParser, image: str, image_help: str) -> None:
    """The image and the host's CRIU and image cache, as every bench takes them."""
    parser.add_argument("--image", default=image, help=image_help)
    parser.add_argument("--cache-root", type=Path, default=CACHE_ROOT)
    parser.add_argument("--criu", type=Path, default=CRIU)


def summarize(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 4),
        "p99": round(percentile(values, 99), 4),
        "max": round(max(values), 4),
        "mean": round(statistics.fmean(values), 4),
    }


# A restored child's phases (Restorer, inst.phases): its fs, its images (the checkpoint's copy on
# tmpfs and its uid map's variant, made once under one lock), the wait for a restore seat, criu's
# wall, the wait for its agent; CPU of criu and of criu plus the restored tree until then.
FORK_PHASES = ("fs", "images", "queue", "criu", "agent", "criu_cpu", "restore_cpu")


def fork_breakdown(
    n: int, dumps: Sequence[float], walls: Sequence[float], phases: Sequence[dict[str, float]]
) -> dict[str, Any]:
    """Where a fork of `n` spends its time: the prefork's dump, the restore's wall, and each
    child's phases (p50 over children); `per_child_s` is (dump + restore wall) / n."""
    return {
        "dump_s": summarize(list(dumps)),
        "restore_wall_s": summarize(list(walls)),
        "per_child_s": summarize([(d + w) / n for d, w in zip(dumps, walls, strict=True)]),
        "child_phases_s": {
            name: summarize([float(p[name]) for p in phases if name in p])
            for name in FORK_PHASES
            if any(name in p for p in phases)
        },
    }


def meminfo_mib() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v.split()[0]) // 1024  # MiB
    return out


def slot_anon_mib(handle: SlotHandle) -> float:
    """Anonymous memory charged to the slot (page cache of the shared image excluded)."""
    d = Path(handle.cgroups["memory"])
    stat = dict(
        (k, int(v)) for k, v in (ln.split() for ln in (d / "memory.stat").read_text().splitlines())
    )
    anon = stat.get("total_rss", stat.get("rss", stat.get("anon", 0)))
    shmem = stat.get("total_shmem", stat.get("shmem", 0))
    return (anon + shmem) / MIB


def ksm_saved_mib() -> float:
    try:
        return int((KSM_DIR / "pages_sharing").read_text()) * os.sysconf("SC_PAGE_SIZE") / MIB
    except OSError:
        return 0.0


def stderr_progress(msg: str) -> None:
    """A bench's progress line, on stderr (its table goes to stdout)."""
    progress_line(f"bench: {msg}")


def progress_line(text: str) -> None:
    """A line on stderr. One that cannot be written (stderr a closed pipe, as after `| head`)
    is dropped: a progress line must never cut a run's cleanup short (it once skipped a
    daemon's stop and left the daemon running)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


def was_interrupted(exc: BaseException) -> bool:
    """Ctrl-C or a stopping signal (`stopped_by_signals`), alone or as all that a trio nursery's
    exception group holds."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(KeyboardInterrupt)[1] is None
    return isinstance(exc, KeyboardInterrupt)


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP stop a bench as Ctrl-C does, so its cleanup runs (daemons stopped,
    slots destroyed, mounts undone): Python's default for them ends the process at once and
    left the daemons and their mounts behind. The SIGINT handler in place takes the signal
    (trio's delivers KeyboardInterrupt at a safe point); without one, KeyboardInterrupt."""

    def as_interrupt(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    old = {s: signal.signal(s, as_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def host_facts(state_dir: Path | None = None) -> dict[str, Any]:
    """The host a bench ran on: its JSON's "host" (with `state_dir`, the fs type it is on)."""
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "kernel": os.uname().release,
        "mem_total_mib": meminfo_mib()["MemTotal"],
        "loadavg_start": os.getloadavg(),
    }
    if state_dir is not None:
        from drumsd.linux import mounts

        out["state_fs"] = mounts.fs_type_of(state_dir)
    return out


class BenchError(RuntimeError):
    """The bench could not run (what failed and where to look)."""


# The bench locks this process holds (fd -> dir): the daemons a bench starts inherit them, so
# a lock stays held while anything of the run is alive.
_HELD_LOCKS: dict[int, Path] = {}


def lock_file_of(path: Path) -> Path:
    """A bench's lock on `path`: a file beside it, never under a tmpfs the bench mounts there."""
    return path.parent / f".{path.name}.bench-lock"


@contextlib.contextmanager
def bench_dir_lock(path: Path, flag: str) -> Iterator[int]:
    """One run at a time on `path` (the state dir or root a bench mounts, fills and removes): an
    exclusive flock on `lock_file_of(path)` for the run, inherited by the daemons it starts. A
    second run on the same dir, or a bench on a live daemon's state_dir (its
    `host_share.hold_dir` lock), stops here with a BenchError naming the holder and `flag`,
    before it removes or unmounts anything. Yields the lock's fd."""
    from drumsd.linux.host_share import ClaimError, LockBusy, hold_dir, hold_lock_file

    path.mkdir(parents=True, exist_ok=True)
    try:
        fd = hold_lock_file(lock_file_of(path))
    except LockBusy as busy:
        raise BenchError(
            f"another drumsd bench is running on {path} ({busy.holder}); wait for it to end, "
            f"or give this run another {flag}"
        ) from None
    try:
        try:
            os.close(hold_dir(path, flag, claimant="bench"))  # no daemon lives there
        except ClaimError as exc:
            raise BenchError(str(exc)) from None
        _HELD_LOCKS[fd] = path
        try:
            yield fd
        finally:
            del _HELD_LOCKS[fd]
    finally:
        os.close(fd)


def held_bench_locks() -> tuple[int, ...]:
    """The fds of the dir locks this process holds as a bench, for its daemons to inherit."""
    return tuple(_HELD_LOCKS)


def clear_leftovers(path: Path) -> int:
    """Unmount what an earlier run that crashed left mounted at or under `path` (deepest first);
    only under the dir's bench lock, which proves no run of it is alive. Returns how many."""
    from drumsd.linux import mounts

    left = mounts.mounts_under(path)
    for target in left:
        mounts.apply([mounts.MountOp("umount", target)])
    if left:
        stderr_progress(f"unmounted {len(left)} mount(s) an earlier run left under {path}")
    return len(left)


@contextlib.asynccontextmanager
async def bench_runtime(cfg: LinuxRuntimeConfig) -> AsyncIterator[LinuxRuntime]:
    """The Linux runtime a bench runs on: what an earlier run left is swept first, and at the
    end whatever the runtime still holds, shielded from the cancellation that ends the run (a
    run stopped by Ctrl-C or SIGTERM left its restored desktops running in their cgroups,
    their state dir unmounted under them)."""
    import trio

    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(cfg) as rt:
        await rt.sweep([])
        try:
            yield rt
        finally:
            with trio.CancelScope(shield=True):
                await rt.sweep([], own=True)


def mount_state_tmpfs(state_dir: Path, what: str) -> None:
    """A tmpfs at `state_dir` (`what` is kept there, for the message); a refused mount is a
    BenchError naming --state-on-disk."""
    from drumsd.linux import syscalls

    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        syscalls.mount("tmpfs", str(state_dir), "tmpfs", 0, "mode=0755")
    except OSError as exc:
        raise BenchError(
            f"cannot mount a tmpfs at {state_dir} for {what} ({exc}); run as root, or pass "
            "--state-on-disk to keep it on its own filesystem"
        ) from exc


@contextlib.contextmanager
def state_on_tmpfs(state_dir: Path, enabled: bool = True) -> Iterator[None]:
    """The bench's state dir as a deployment's is, a tmpfs: mounted for the run, unmounted
    after it with whatever the runtime left mounted under it. A disk adds its writes, fsyncs
    and discards to every dump, restore and teardown. `enabled` False (--state-on-disk) leaves
    the dir on its own filesystem."""
    if not enabled:
        yield
        return
    from drumsd.linux import mounts

    clear_leftovers(state_dir)  # a tmpfs stacked on a crashed run's would hide it
    mount_state_tmpfs(state_dir, "the bench's state")
    try:
        yield
    finally:
        for target in mounts.mounts_under(state_dir):  # deepest first; the tmpfs last
            mounts.apply([mounts.MountOp("umount", target)])


def options_json(opts: Any) -> dict[str, Any]:
    """A bench's options dataclass as its JSON's "options" (paths as strings)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}


def publish(results: dict[str, Any], table: str, out: Path) -> None:
    """The table on stdout and the results as JSON at `out`."""
    print(table)
    out.write_text(json.dumps(results, indent=1))
    print(f"results written to {out}")
