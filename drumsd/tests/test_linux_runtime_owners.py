"""The Linux runtime's owners, each through its public interface: the instance table, the spare
pool's bookkeeping, the uid ranges, the image cache, KSM membership and instance filesystems
(no root, no desktops)."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from drumsd.core.seams import CheckpointRef, RuntimeError_, SlotHandle, SlotLimits
from drumsd.linux import host_share, idmap, mounts, procfs, slot_fs
from drumsd.runtime.linux.base import Instance, LinuxRuntimeConfig, Prepared
from drumsd.runtime.linux.fs import InstanceFs
from drumsd.runtime.linux.images import ImageCache
from drumsd.runtime.linux.instances import InstanceTable
from drumsd.runtime.linux.ksm import KsmMembership
from drumsd.runtime.linux.restore import Restorer
from drumsd.runtime.linux.slots import Slots
from drumsd.runtime.linux.spare_pool import SparePool
from drumsd.runtime.linux.spares import Spares
from drumsd.runtime.linux.supervision import Supervision
from drumsd.runtime.linux.uids import UidRanges

LIMITS = SlotLimits(vcpus=1.0, memory_mib=2048, pids_max=1024, tmpfs_mib=1024)


def inst(iid: str, pid: int = 10, born: float = 0.0) -> Instance:
    i = Instance(iid, mounts.SlotPaths(Path("/nonexistent") / iid), {}, "ck", (Path("/l"),))
    i.pid, i.born = pid, born
    return i


def ref(cid: str, where: Path = Path("/ck")) -> CheckpointRef:
    return CheckpointRef(cid, where / cid, Path("/l"), "img", "up", "hardened")


def handle(slot_id: str, pid: int) -> SlotHandle:
    return SlotHandle(slot_id, pid, 1, Path("/r"), Path("/u"), "ck", {}, {})


# ---------------------------------------------------------------- InstanceTable


def test_the_table_serves_one_instance_per_slot_and_refuses_a_stale_handle() -> None:
    table = InstanceTable()
    a = inst("slot-a-1", pid=10)
    table.serve("a", a)
    assert "a" in table and len(table) == 1 and table.of(handle("a", 10)) is a
    with pytest.raises(RuntimeError_, match=r"slot a .pid 11. is not served by this runtime"):
        table.of(handle("a", 11))  # an older instance of the slot (a reset swapped it)
    with pytest.raises(RuntimeError_, match="adopt"):
        table.of(handle("b", 10))
    assert table.release("a") is a and table.release("a") is None and "a" not in table


def test_a_warm_upper_is_kept_only_for_a_served_slot_without_one() -> None:
    table = InstanceTable()
    prep = Prepared("warm-a-1", mounts.SlotPaths(Path("/x")), "ck")
    assert not table.park_warm("a", prep)  # the slot went away while it was made
    table.serve("a", inst("slot-a-1"))
    assert table.park_warm("a", prep) and table.has_warm("a")
    assert not table.park_warm("a", Prepared("warm-a-2", mounts.SlotPaths(Path("/y")), "ck"))
    assert table.iids() == {"slot-a-1", "warm-a-1"}
    assert table.take_warm("a") is prep and table.take_warm("a") is None
    table.park_warm("a", prep)
    assert table.take_all_warm() == [prep] and not table.has_warm("a")


async def test_a_restore_told_there_is_no_next_one_prepares_no_warm_upper(tmp_path: Path) -> None:
    """With warm_upper on, a restore prepares the slot's next fs in the background; one whose
    instance is destroyed right after (a task checkpoint's probe) says so and gets none."""
    started: list[str] = []

    class Sup:
        driver = type("Driver", (), {"version": 2})()

        def start_soon(self, fn: object, slot_id: str, *args: object) -> None:
            started.append(slot_id)

    class Restoring:
        async def check_lower(self, checkpoint: CheckpointRef) -> None:
            pass

        async def restore(self, owner: str, *args: object, **kwargs: object) -> Instance:
            return inst(f"{owner}-1", pid=os.getpid())

    config = LinuxRuntimeConfig(state_dir=tmp_path, warm_upper=True)
    table, sup, restorer = InstanceTable(), Sup(), Restoring()
    spares = Spares(config, sup, None, table, restorer, {})  # type: ignore[arg-type]
    slots = Slots(config, sup, table, restorer, spares, None)  # type: ignore[arg-type]
    await slots.restore("probe", ref("ck", tmp_path), LIMITS, warm_upper=False)
    await slots.restore("a", ref("ck", tmp_path), LIMITS)
    assert started == ["a"] and "probe" in table and "a" in table


# ---------------------------------------------------------------- SparePool


def test_spares_are_kept_for_one_checkpoint_dir_and_its_limits_only() -> None:
    pool = SparePool(per_checkpoint=2, per_host=16)
    ck = ref("ck")
    pool.enable(ck, LIMITS)
    assert pool.keeps(ck, LIMITS)
    assert not pool.keeps(ref("ck", Path("/elsewhere")), LIMITS)  # replaced under the same id
    assert not pool.keeps(ck, SlotLimits(vcpus=2.0, memory_mib=2048, pids_max=1024, tmpfs_mib=1))
    off = SparePool(per_checkpoint=0, per_host=16)
    off.enable(ck, LIMITS)
    assert not off.keeps(ck, LIMITS) and off.next_need(lambda: True) is None


def test_refills_follow_targets_the_host_cap_and_admission() -> None:
    pool = SparePool(per_checkpoint=2, per_host=3)
    a, b = ref("a"), ref("b")
    pool.enable(a, LIMITS)
    pool.enable(b, LIMITS)
    assert pool.next_need(lambda: False) is None  # admission holds refills back
    assert pool.next_need(lambda: True) == (a, LIMITS)
    pool.park("a", inst("s1"))
    pool.park("a", inst("s2"))
    assert pool.next_need(lambda: True) == (b, LIMITS)
    pool.set_target("b", 0)
    assert pool.target("b") == 0 and pool.next_need(lambda: True) is None
    pool.set_target("b", 9)
    assert pool.target("b") == 2  # capped by per_checkpoint
    pool.park("b", inst("s3"))
    assert pool.next_need(lambda: True) is None  # the host's cap: 3 parked
    assert pool.counts() == {"a": 2, "b": 1} and pool.iids() == {"s1", "s2", "s3"}


def test_claims_take_the_oldest_and_a_forgotten_checkpoint_parks_nothing() -> None:
    pool = SparePool(per_checkpoint=2, per_host=16)
    pool.enable(ref("a"), LIMITS)
    first, second = inst("s1"), inst("s2")
    pool.park("a", first)
    pool.park("a", second)
    assert pool.take("a") is first and pool.take("a") is second and pool.take("a") is None
    pool.park("a", first)
    assert pool.forget("a") == [first] and pool.counts() == {}
    assert not pool.park("a", second)  # restored while the checkpoint was deleted


def test_old_spares_and_extras_above_target_are_taken_for_disposal() -> None:
    pool = SparePool(per_checkpoint=3, per_host=16)
    pool.enable(ref("a"), LIMITS)
    old, mid, new = inst("old", born=0.0), inst("mid", born=50.0), inst("new", born=90.0)
    for i in (old, mid, new):
        pool.park("a", i)
    assert pool.take_expired(now=100.0, max_age_s=60.0) == [old]
    pool.set_target("a", 1)
    assert pool.take_expired(now=100.0, max_age_s=60.0) == [mid]  # the oldest extra
    assert pool.take_all() == [new] and pool.counts() == {}


def test_a_wake_ends_the_refillers_wait_and_is_consumed() -> None:
    pool = SparePool(per_checkpoint=1, per_host=1)

    async def main() -> tuple[float, float]:
        pool.wake()
        t0 = trio.current_time()
        await pool.wait_wakeup(30.0)
        woken = trio.current_time() - t0
        await pool.wait_wakeup(30.0)  # nothing new: the full timeout
        return woken, trio.current_time() - t0

    woken, idle = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert woken == 0.0 and idle == 30.0


# ---------------------------------------------------------------- UidRanges


def test_uid_ranges_are_claimed_lowest_first_host_wide_and_freed(tmp_path: Path) -> None:
    mine = UidRanges(host_share.UidRanges(tmp_path / "a", tmp_path / "claims"), hardened=True)
    other = UidRanges(host_share.UidRanges(tmp_path / "b", tmp_path / "claims"), hardened=True)
    assert mine.allocate() == 0 and other.allocate() == 1 and mine.allocate() == 2
    assert mine.held() == {0, 2}
    mine.free(0)
    assert mine.held() == {2} and other.allocate() == 0  # freed host-wide too
    mine.free(None)  # trusted instances hold no range: nothing to free
    trusted = UidRanges(host_share.UidRanges(tmp_path / "c", tmp_path / "claims"), hardened=False)
    assert trusted.allocate() is None and trusted.recover_claims() == []


def test_ranges_held_before_a_restart_are_reclaimed_and_conflicts_named(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    other = UidRanges(host_share.UidRanges(tmp_path / "b", tmp_path / "claims"), hardened=True)
    assert other.allocate() == 0
    mine = UidRanges(host_share.UidRanges(tmp_path / "a", tmp_path / "claims"), hardened=True)
    mine.hold([0, 3])
    assert mine.recover_claims() == [0]  # range 0 is the other daemon's
    assert mine.allocate() == 1  # neither ours (0, 3) nor claimed on the host
    assert UidRanges.id_map(None) == idmap.IDENTITY and UidRanges.id_map(1) == idmap.range_map(1)


# ---------------------------------------------------------------- ImageCache


def _images(tmp_path: Path, cid: str) -> CheckpointRef:
    ck = ref(cid, tmp_path)
    (ck.dir / "images").mkdir(parents=True)
    (ck.dir / "images" / "inventory.img").write_bytes(b"\0" * 8)
    return ck


def test_images_off_tmpfs_are_copied_once_and_forgotten_with_their_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slot_fs.mounts, "fs_type_of", lambda path: "ext4")  # not on tmpfs
    copies: list[str] = []

    def copy(images: Path, cache: Path, key: str, tmpfs_mib: int) -> Path:
        copies.append(key)
        (cache / key).mkdir(parents=True)
        return cache / key

    cache = ImageCache(tmp_path / "cache", 64, copy=copy)
    a, ab = _images(tmp_path, "a"), _images(tmp_path, "a-b")

    async def main() -> tuple[Path, Path, Path]:
        first = await cache.images_for(a, None)
        again = await cache.images_for(a, None)
        other = await cache.images_for(ab, None)
        await cache.forget("a")
        return first, again, other

    first, again, other = trio.run(main)
    assert first == again and len(copies) == 2 and first != other
    assert set(cache.copies()) == {copies[1]}  # a's copy forgotten, a-b's ("a-b-...") kept
    assert not first.exists() and other.exists()


def test_a_checkpoint_without_images_is_a_restore_failure_naming_the_dir(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache", 64)
    with pytest.raises(RuntimeError_, match=r"no CRIU images at .*missing/images; re-create"):
        trio.run(cache.images_for, ref("missing", tmp_path), None)


def test_a_checkpoint_deleted_during_its_copy_is_a_restore_failure_and_leaves_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its images vanish under the copy (a prefork deleted while a spare refilled from it): a
    restore_failed naming the checkpoint, not a shutil.Error that ended the daemon."""
    cache_dir = tmp_path / "cache"
    # The checkpoint's images on disk, the cache already a tmpfs (nothing to mount here).
    monkeypatch.setattr(
        slot_fs.mounts, "fs_type_of", lambda path: "tmpfs" if path == cache_dir else "ext4"
    )
    ck = _images(tmp_path, "pf-gone")
    real_copy = slot_fs.sparse.copy_path

    def vanishing_copy(src: str, dst: str) -> object:
        shutil.rmtree(ck.dir)  # deleted between listing and copying
        return real_copy(src, dst)

    monkeypatch.setattr(slot_fs.sparse, "copy_path", vanishing_copy)
    cache = ImageCache(cache_dir, 64)
    with pytest.raises(RuntimeError_, match=r"checkpoint pf-gone: its CRIU images could not be"):
        trio.run(cache.images_for, ck, None)
    assert list(cache_dir.iterdir()) == []  # no half copy left on the tmpfs
    assert cache.copies() == {}


# ---------------------------------------------------------------- KsmMembership


def test_ksm_is_joined_with_our_settings_and_the_hosts_values_come_back(tmp_path: Path) -> None:
    knobs = tmp_path / "ksm"
    knobs.mkdir()
    for name, value in (("run", "0"), ("pages_to_scan", "100"), ("sleep_millisecs", "200")):
        (knobs / name).write_text(value)
    share = host_share.KsmShare(knobs, tmp_path / "claims")
    ksm = KsmMembership(share, enabled=True, pages_to_scan=1000, sleep_millisecs=20)
    ksm.join()
    assert ksm.joined and (knobs / "run").read_text().strip() == "1"
    assert (knobs / "pages_to_scan").read_text().strip() == "1000"
    assert ksm.stats()["enabled"] is True
    ksm.leave()
    assert not ksm.joined and (knobs / "run").read_text().strip() == "0"
    off = KsmMembership(share, enabled=False, pages_to_scan=1, sleep_millisecs=1)
    off.join()
    assert not off.joined and off.stats()["enabled"] is False


# ---------------------------------------------------------------- InstanceFs


def test_a_failed_fs_build_leaves_no_dir_no_busy_iid_and_no_uid_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(slot_fs, "build_fs", fail)
    uids = UidRanges(host_share.UidRanges(tmp_path / "s", tmp_path / "claims"), hardened=True)
    fs = InstanceFs(tmp_path / "state", uids)
    iid = fs.new_iid("slot-a")
    assert iid.startswith("slot-a-") and fs.busy() == {iid}  # a sweep leaves it alone
    with pytest.raises(OSError, match="No space"):
        trio.run(fs.make, iid, "slot:a", None, (tmp_path,), 64)
    assert not (tmp_path / "state" / "slots" / iid).exists()
    assert fs.busy() == set() and uids.held() == set()
    assert not list((tmp_path / "claims").iterdir())  # the host-wide claim is gone too


# ---------------------------------------------------------------- Spares (the refill loop)


def test_a_refill_that_raises_anything_costs_a_spare_never_the_runtime(tmp_path: Path) -> None:
    """The refill loop runs in the runtime's nursery: an error it did not expect (a shutil.Error
    ended the daemon once) is logged and retried after a pause, and the loop goes on."""
    calls: list[float] = []

    class Raising:
        async def restore(self, *args: object, **kwargs: object) -> Instance:
            calls.append(trio.current_time())
            raise ValueError("something no refill expects")

    config = LinuxRuntimeConfig(state_dir=tmp_path, spares_per_checkpoint=1)
    spares = Spares(config, None, None, None, Raising(), {})  # type: ignore[arg-type]
    spares.pool.enable(ref("ck", tmp_path), LIMITS)

    async def main() -> None:
        with trio.move_on_after(200):
            await spares.serve()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    # Retried, backing off: at least 1, 2, 4, ... 60 seconds apart (a refill that keeps failing
    # is not retried every second for as long as the daemon runs).
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert len(calls) >= 6 and all(g >= min(60, 2.0**i) for i, g in enumerate(gaps)), gaps
    assert len(calls) <= 10, gaps
    assert not spares.pool.refilling


def test_refills_of_a_failing_checkpoint_back_off_and_a_success_resets_them() -> None:
    pool = SparePool(per_checkpoint=1, per_host=4)
    a, b = ref("a"), ref("b")
    pool.enable(a, LIMITS)
    pool.enable(b, LIMITS)
    assert [pool.refill_failed("a", 100.0) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert pool.next_need(lambda: True, 150.0) == (b, LIMITS)  # a waits; b is not held up
    assert pool.next_need(lambda: True, 160.0) == (a, LIMITS)
    pool.refill_done("a")
    assert pool.refill_failed("a", 200.0) == 1


def test_a_runtime_stopped_by_an_error_names_it_to_requests_still_arriving() -> None:
    sup = Supervision(None, None, 1.0)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError_, match="not running; use open_linux_runtime"):
        sup.running()
    sup.stopped_by = "ValueError: boom"
    with pytest.raises(RuntimeError_, match=r"stopped on an error \(ValueError: boom\); drumsd is"):
        sup.running()


async def test_an_init_that_exits_before_its_agent_answers_says_how_it_ended() -> None:
    """A restore whose init died before its agent answered names how it ended (the watch's
    `exit_how`), so the error means something once the failed slot and its logs are gone."""
    sup = Supervision(None, None, 5.0)  # type: ignore[arg-type]  # wait_agent touches neither
    dead = inst("i-dead", pid=2**22 + 7)  # no such process
    dead.watched = True  # a boot's init: its watch says how it ended

    async def ends() -> None:
        await trio.sleep(0.05)  # the watch learns how it ended a moment later
        dead.exit_how = "killed by signal 9 (SIGKILL)"
        dead.exited.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ends)
        with pytest.raises(RuntimeError_) as caught:
            await sup.wait_agent(dead, 5.0)
    assert caught.value.code == "restore_failed"
    assert "exited (killed by signal 9 (SIGKILL)) before its agent answered" in caught.value.message


async def test_a_restored_init_not_watched_yet_is_said_how_it_ended_by_its_launcher() -> None:
    """A restore's init is watched only once its agent answers: one that dies before is named
    with the wait status the launcher's process reaped (it said nothing: live, all three fork
    children the stale-pidfd kill took said only 'exited before its agent answered')."""
    asked: list[int] = []

    class Reaped:
        async def exit_status(self, pid: int, timeout_s: float) -> int | None:
            asked.append(pid)
            return signal.SIGKILL  # a wait status: killed by SIGKILL

    sup = Supervision(None, None, 5.0)  # type: ignore[arg-type]
    sup.launcher = Reaped()  # type: ignore[assignment]
    dead = inst("i-dead", pid=2**22 + 7)  # no such process
    with pytest.raises(RuntimeError_) as caught:
        await sup.wait_agent(dead, 5.0)
    assert asked == [dead.pid]
    assert "exited (killed by SIGKILL) before its agent answered" in caught.value.message


def test_a_teardown_signals_its_own_init_never_a_pidfd_number_reused_since() -> None:
    """The cgroup kill ends the init, its watch closes the instance's pidfd, and a fork's next
    restore opens its own init's pidfd at that lowest free number: the teardown's SIGKILL by
    pidfd must not reach that new init (CI's validator lost a fork child's init so)."""
    victim = subprocess.Popen(["sleep", "60"])
    bystander = subprocess.Popen(["sleep", "60"])  # the next restore's init
    reopened: list[int] = []
    dead = inst("i-torn", pid=victim.pid)
    dead.cgroups = {"unified": "/nonexistent"}
    dead.pidfd = os.pidfd_open(victim.pid)

    class CgroupKillThenRestore:
        def kill(self, dirs: object) -> None:
            if reopened:
                return
            victim.kill()
            deadline = time.monotonic() + 5
            while dead.pidfd != -1 and time.monotonic() < deadline:  # the watch closes it
                time.sleep(0.001)
            reopened.append(os.pidfd_open(bystander.pid))

        def remove(self, dirs: object) -> None:
            pass

    class NoFs:
        def teardown(self, paths: object) -> None:
            pass

    class NotTheParent:
        def is_parent_of(self, pid: int) -> bool:
            return False

    sup = Supervision(CgroupKillThenRestore(), NoFs(), 5.0)  # type: ignore[arg-type]
    stale = dead.pidfd

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            sup.nursery, sup.launcher = nursery, NotTheParent()  # type: ignore[assignment]
            sup.watch(dead)
            await sup.dispose(dead, background=False)

    try:
        trio.run(main)
        assert reopened == [stale], "the new pidfd did not reuse the number: nothing tested"
        assert dead.exit_how == "killed by SIGKILL"
        # A SIGKILL lands when its target next runs: give a stray one time to end it.
        ended = procfs.reap(bystander.pid, 1.0)
        assert not ended, "the teardown killed another process by a stale pidfd number"
    finally:
        bystander.kill()
        bystander.wait()
        for fd in reopened:
            os.close(fd)


# ---------------------------------------------------------------- Restorer (a restored init dies)


def test_a_restore_whose_init_dies_keeps_its_logs_in_the_error(tmp_path: Path) -> None:
    """CRIU restored the tree, then its init died before its agent answered: the discard deletes
    the slot's files, so the error carries what the init logged since the restore (not the
    boot's lines the upper came with) and CRIU's restore log errors."""
    inits: list[subprocess.Popen[bytes]] = []
    made: list[mounts.SlotPaths] = []
    torn: list[str] = []

    class Fs:
        helper = None

        def new_iid(self, prefix: str) -> str:
            return f"{prefix}-1"

        async def make(self, iid: str, owner: str, *args: object) -> tuple[mounts.SlotPaths, None]:
            paths = slot_fs.make_instance_dir(tmp_path, iid, owner, None)
            log = paths.upper / "var/log/desktop-init.log"
            log.parent.mkdir(parents=True)
            log.write_text('{"msg": "ready"}\n')  # the checkpoint's boot, copied with the upper
            made.append(paths)
            return paths, None

        def teardown(self, paths: mounts.SlotPaths) -> None:
            torn.append(paths.dir.name)

    class Driver:
        version = 2

        def create(self, iid: str, limits: SlotLimits) -> dict[str, str]:
            return {"unified": str(tmp_path / "cg" / iid)}

        def procs_files(self, dirs: object) -> list[Path]:
            return []

        def set_cpu(self, *args: object) -> None: ...
        def set_shares(self, *args: object) -> None: ...
        def kill(self, dirs: object) -> None: ...
        def remove(self, dirs: object) -> None: ...

    class Launcher:
        """CRIU's run: the restored init logs a line and dies soon after."""

        async def run(self, argv: list[str], out: Path, timeout_s: float) -> object:
            work = out.parent
            work.mkdir(parents=True, exist_ok=True)
            (work / "restore.log").write_text("(00.3) Error (criu/net.c): lo not up\n")
            log = made[-1].upper / "var/log/desktop-init.log"
            start_init(f"echo 'Traceback: OSError boom' >> {log}; exec sleep 0.2")
            while "boom" not in log.read_text():  # noqa: ASYNC110 (a test double's own wait)
                await trio.sleep(0.01)
            (work / "pid").write_text(str(inits[-1].pid))

            class Done:
                returncode, timed_out, cpu_s = 0, False, 0.0

            return Done()

    def start_init(script: str) -> None:
        inits.append(subprocess.Popen(["sh", "-c", script]))

    class Images:
        async def images_for(self, checkpoint: CheckpointRef, index: object) -> Path:
            return tmp_path

    config = LinuxRuntimeConfig(state_dir=tmp_path)
    sup = Supervision(Driver(), Fs(), 5.0)  # type: ignore[arg-type]
    restorer = Restorer(config, sup, Fs(), Images(), {"restores": 0})  # type: ignore[arg-type]

    async def main() -> RuntimeError_:
        async with trio.open_nursery() as nursery:
            sup.nursery, sup.launcher = nursery, Launcher()  # type: ignore[assignment]
            with pytest.raises(RuntimeError_) as caught:
                await restorer.restore("slot:a", ref("ck", tmp_path), LIMITS)
        return caught.value

    try:
        error = trio.run(main)
    finally:
        for p in inits:
            p.wait()
    assert error.code == "restore_failed" and torn == ["slot-a-1"]
    assert error.message.endswith(
        "before its agent answered; desktop-init.log since the restore: Traceback: OSError boom; "
        "criu restore.log errors: (00.3) Error (criu/net.c): lo not up"
    ), error.message
