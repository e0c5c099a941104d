"""Live tests of the Linux slot runtime on real CRIU-restored desktops (root, CRIU, the base image).

Without DRUMS_LIVE=1 they skip; with it (CI) a missing CRIU or image is a failure, not a skip.
The image checkpoint is made once per module (a cold boot and a dump, ~3 s) on a fresh state dir.
"""

# Polling with a deadline is how these tests wait for the desktop (no event to wait on).
# ruff: noqa: ASYNC110, ASYNC240

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from drumsd.core.seams import CheckpointRef, RuntimeError_, SaveParent, SlotHandle, SlotLimits
from drumsd.linux import save_delta
from drumsd.linux.write_track import criu_tracks_writes

pytestmark = pytest.mark.live

CACHE_ROOT = Path(os.environ.get("DRUMS_CACHE", "/var/cache/drums"))
CRIU = Path(os.environ.get("DRUMS_CRIU", "/usr/local/sbin/criu"))
LIMITS = SlotLimits(vcpus=1.0, memory_mib=2048, pids_max=1024, tmpfs_mib=512)


def _require_live() -> tuple[Path, str]:
    """(image root, image sha256); skip without DRUMS_LIVE=1, fail when it is set but the host
    lacks what the runtime needs."""
    if os.environ.get("DRUMS_LIVE") != "1":
        pytest.skip("live runtime tests run with DRUMS_LIVE=1 (root, CRIU, the base image)")
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    if not os.access(CRIU, os.X_OK):
        problems.append(f"no CRIU at {CRIU} (run scripts/prepare-host.sh)")
    image = None
    try:
        from drumsd.linux.image import find_image

        image = find_image("base", CACHE_ROOT)
    except Exception as exc:  # the image module reports what to run
        problems.append(f"no base image: {exc}")
    if problems:
        pytest.fail("DRUMS_LIVE=1 but " + "; ".join(problems))
    assert image is not None
    return image.root, image.sha256


@pytest.fixture(scope="module", params=["hardened", "trusted"])
def profile(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def state_dir(profile: str) -> Iterator[Path]:
    top = Path(f"/run/drums-test-{profile}-{uuid.uuid4().hex[:8]}")
    # A parent only root may search (like pytest's tmp dirs): the slot's ids never walk it.
    top.mkdir(mode=0o700, parents=True)
    d = top / "state"
    d.mkdir()
    yield d
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        mnt = line.split()[4]
        if mnt.startswith(str(top)):
            subprocess.run(["umount", "-l", mnt], check=False)
    shutil.rmtree(top, ignore_errors=True)


def _config(state_dir: Path, **kw: object):
    from drumsd.runtime.linux import LinuxRuntimeConfig

    profile = "hardened" if "-hardened-" in state_dir.parent.name else "trusted"
    return LinuxRuntimeConfig(
        state_dir=state_dir,
        criu=CRIU,
        profile=profile,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def template(state_dir: Path) -> CheckpointRef:
    lower, sha = _require_live()
    from drumsd.runtime.linux import open_linux_runtime

    async def make() -> CheckpointRef:
        async with open_linux_runtime(_config(state_dir)) as rt:
            return await rt.make_template(lower, sha, "base-live", state_dir / "ck" / "base")

    return trio.run(make)


@pytest.fixture
async def rt(state_dir: Path, template: CheckpointRef) -> AsyncIterator[object]:
    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(_config(state_dir)) as runtime:
        yield runtime
        await runtime.sweep([])


def _digest(png: bytes) -> str:
    """A digest of the pixels (PNG encoders may differ in bytes for equal pixels)."""
    try:
        import io

        from PIL import Image

        return hashlib.sha256(Image.open(io.BytesIO(png)).convert("RGB").tobytes()).hexdigest()
    except ImportError:
        return hashlib.sha256(png).hexdigest()


async def _screen(rt, h: SlotHandle) -> str:
    png = await rt.screenshot(h)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return _digest(png)


async def _type_into_xterm(rt, h: SlotHandle, text: str) -> None:
    # Focus follows the map order at dump time: click into the xterm (placed at +40+40 by the
    # desktop init) before typing.
    await rt.step(h, {"type": "click", "x": 300, "y": 200})
    await rt.step(h, {"type": "type", "text": text})
    await rt.step(h, {"type": "key", "keys": ["enter"]})


async def _screen_changes_from(rt, h: SlotHandle, before: str) -> str:
    with trio.fail_after(10):
        while (now := await _screen(rt, h)) == before:
            await trio.sleep(0.05)
    return now


def _leftovers(state_dir: Path, h: SlotHandle) -> list[str]:
    out = []
    inst_dir = Path(h.root).parent
    if inst_dir.exists():
        out.append(f"dir {inst_dir}")
    mounts = Path("/proc/self/mountinfo").read_text()
    out += [
        f"mount {ln.split()[4]}"
        for ln in mounts.splitlines()
        if ln.split()[4].startswith(str(inst_dir))
    ]
    out += [f"cgroup {d}" for d in set(h.cgroups.values()) if Path(d).exists()]
    if Path(f"/proc/{h.init_pid}").exists():
        stat = Path(f"/proc/{h.init_pid}/stat").read_text().split()
        if stat[21] == str(h.init_starttime):
            out.append(f"process {h.init_pid}")
    return out


async def test_create_type_and_reset_restores_the_original_screen(rt, template) -> None:
    h = await rt.restore("live-a", template, LIMITS)
    facts = await rt.facts(h)
    assert facts.alive and facts.init_identity_ok
    assert facts.namespaces["pid"] != facts.extra["host_namespaces"]["pid"]
    assert facts.namespaces["net"] != facts.extra["host_namespaces"]["net"]
    assert facts.net_links == ["lo"]
    assert facts.oom_kills == 0 and len(facts.pids) >= 3
    original = await _screen(rt, h)
    await _type_into_xterm(rt, h, "echo drums-was-here")
    await _screen_changes_from(rt, h, original)
    h2 = await rt.reset(h, template, LIMITS)
    assert h2.init_pid != h.init_pid
    assert await _screen(rt, h2) == original
    await rt.destroy("live-a")


async def test_fork_of_4_children_are_independent(rt, template, state_dir) -> None:
    h = await rt.restore("live-b", template, LIMITS)
    await rt.exec_user(h, "echo parent > /tmp/parent-mark", 10)
    ck = await rt.capture(h, "live-b-pre", state_dir / "ck" / f"pre-{uuid.uuid4().hex[:6]}")
    kids = await rt.fork(h, ck, [f"live-b-{i}" for i in range(4)], LIMITS)
    assert len({k.init_pid for k in kids}) == 4
    res = await rt.exec_user(kids[0], "touch /tmp/only-in-child-0", 10)
    assert res.returncode == 0, res.stderr
    for i, k in enumerate(kids):
        assert (await rt.exec_user(k, "cat /tmp/parent-mark", 10)).stdout.strip() == "parent"
        present = (await rt.exec_user(k, "test -e /tmp/only-in-child-0", 10)).returncode == 0
        assert present == (i == 0), f"child {i}"
    for k in kids:
        await rt.destroy(k.slot_id)
    facts = await rt.facts(h)  # the fork and its children's teardown leave the parent running
    assert facts.alive and facts.init_identity_ok, facts
    await rt.destroy("live-b")


async def test_a_killed_init_says_how_it_ended(rt, template) -> None:
    """wait_exit gives the quarantine reason its words: the signal that ended the slot's init."""
    h = await rt.restore("live-k", template, LIMITS)
    os.kill(h.init_pid, 9)
    with trio.fail_after(10):
        how = await rt.wait_exit(h)
    assert how.startswith("killed by SIGKILL"), how
    await rt.destroy("live-k")


async def test_capture_then_create_from_the_saved_state(rt, template, state_dir) -> None:
    h = await rt.restore("live-c", template, LIMITS)
    await rt.write_file(h, "/home/user/Desktop/note.txt", b"saved state\n")
    ck = await rt.capture(h, "live-c-save", state_dir / "ck" / f"save-{uuid.uuid4().hex[:6]}")
    assert (ck.dir / "images" / "inventory.img").exists() and ck.upper_sha256
    await rt.write_file(h, "/home/user/Desktop/note.txt", b"changed after capture\n")
    h2 = await rt.restore("live-c2", ck, LIMITS)
    assert await rt.read_file(h2, "/home/user/Desktop/note.txt", 1024) == b"saved state\n"
    assert await rt.read_file(h, "/home/user/Desktop/note.txt", 1024) == b"changed after capture\n"
    await rt.destroy("live-c2")
    await rt.destroy("live-c")


async def test_a_tracked_save_that_cannot_be_stored_is_dumped_again_untracked(
    template, state_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write tracking never loses a save: a tracked dump whose store fails (here made to) is
    discarded and the tree dumped again untracked, compared against the same parent; the save
    restores with what was written."""
    if not criu_tracks_writes(CRIU):
        pytest.skip(f"needs drums' CRIU at {CRIU} (scripts/setup.sh builds it)")
    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(_config(state_dir, track_writes=True)) as rt:
        await _save_through_a_failed_store(rt, template, state_dir, monkeypatch)
        await rt.sweep([])


async def _save_through_a_failed_store(
    rt, template: CheckpointRef, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await rt.restore("live-t", template, LIMITS)
    await rt.write_file(h, "/home/user/Desktop/note.txt", b"tracked or not\n")

    refused: list[object] = []

    def refuse(*args: object, **kw: object) -> None:
        refused.append(args)
        raise ValueError("made to fail by the test")

    monkeypatch.setattr(save_delta, "store_tracked", refuse)
    dest = state_dir / "ck" / f"track-{uuid.uuid4().hex[:6]}"
    ck = await rt.capture(h, "live-t-save", dest, parent=SaveParent(template.dir, 8))
    meta = json.loads((ck.dir / "meta.json").read_text())
    assert len(refused) == 1, "the tracked dump came first"
    assert meta["tracked"] is False and meta["delta"]["parent"] == template.id, meta
    h2 = await rt.restore("live-t2", ck, LIMITS)
    assert await rt.read_file(h2, "/home/user/Desktop/note.txt", 1024) == b"tracked or not\n"
    await rt.destroy("live-t2")
    await rt.destroy("live-t")


async def test_a_dump_that_misses_a_process_of_the_slot_is_refused(rt, template, state_dir) -> None:
    # A process in the slot's pid namespace and cgroup whose parent is outside its tree (here
    # nsenter from the host) is not in CRIU's dump: every restore would lose it.
    h = await rt.restore("live-m", template, LIMITS)
    # (nsenter forks by itself when it enters a pid namespace)
    joined = await trio.lowlevel.open_process(
        ["nsenter", "-t", str(h.init_pid), "-p", "sleep", "60"]
    )
    kids: list[str] = []
    try:
        await trio.sleep(0.5)
        kids = Path(f"/proc/{joined.pid}/task/{joined.pid}/children").read_text().split()
        assert kids, "nsenter has not started its child"
        for directory in h.cgroups.values():
            Path(directory, "cgroup.procs").write_text(kids[0])
        dest = state_dir / "ck" / f"miss-{uuid.uuid4().hex[:6]}"
        with pytest.raises(RuntimeError_) as caught:
            await rt.capture(h, "live-m-save", dest)
        assert "does not hold every process" in caught.value.message, caught.value.message
        assert any(m.startswith("sleep(") for m in caught.value.detail["missing"]), caught.value
        assert not dest.exists()  # the half checkpoint is gone
    finally:
        joined.kill()
        await joined.wait()
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
    ck = await rt.capture(h, "live-m-save2", state_dir / "ck" / f"ok-{uuid.uuid4().hex[:6]}")
    assert ck.dir.exists()  # once it is gone, the same slot dumps
    await rt.destroy("live-m")


async def test_destroy_leaves_no_mount_cgroup_or_process(rt, template, state_dir) -> None:
    h = await rt.restore("live-d", template, LIMITS)
    assert _leftovers(state_dir, h) != []  # the probe sees a live slot
    await rt.destroy("live-d")
    assert _leftovers(state_dir, h) == []
    await rt.destroy("live-d")  # idempotent


async def test_exec_trusted_runs_as_root_in_the_slot(rt, template) -> None:
    h = await rt.restore("live-e", template, LIMITS)
    res = await rt.exec_trusted(h, "id -u; hostname; cat /proc/1/comm", 10)
    assert res.returncode == 0, res.stderr
    uid, _host, _comm = res.stdout.split()
    assert uid == "0"
    user = await rt.exec_user(h, "id -un", 10)
    assert user.stdout.strip() == "user"
    await rt.destroy("live-e")


async def test_twenty_resets_in_a_row(rt, template) -> None:
    h = await rt.restore("live-r", template, LIMITS)
    original = await _screen(rt, h)
    for i in range(20):
        h = await rt.reset(h, template, LIMITS)
        if i % 5 == 4:
            assert await _screen(rt, h) == original
    await rt.destroy("live-r")


async def test_warm_spares_are_pristine_and_claimed(state_dir, template) -> None:
    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(_config(state_dir, spares_per_checkpoint=2)) as rt:
        await rt.sweep([])  # what an earlier failed test may have left
        rt.enable_spares(template, LIMITS)
        with trio.fail_after(30):
            while rt.spare_counts().get(template.id, 0) < 2:
                await trio.sleep(0.05)
        h = await rt.restore("live-s", template, LIMITS)
        assert h.extra["spare"] is True
        original = await _screen(rt, h)
        await _type_into_xterm(rt, h, "echo spare")
        await _screen_changes_from(rt, h, original)
        old = h
        h = await rt.reset(h, template, LIMITS)
        assert h.extra["spare"] is True
        assert await _screen(rt, h) == original
        # The claim names its slot in the instance's owner record (what a sweep after a crash
        # reads), times its steps, and the old tree, killed after the thaw, goes all the same.
        from drumsd.linux.procfs import is_same_process
        from drumsd.linux.slot_fs import read_owner

        assert read_owner(Path(h.root).parent) == "slot:live-s"
        phases = h.extra["phases"]
        assert {"claim_owner", "claim_thaw", "claim_agent", "parked_s"} <= phases.keys(), phases
        with trio.fail_after(30):
            while _leftovers(state_dir, old) or is_same_process(old.init_pid, old.init_starttime):
                await trio.sleep(0.1)
        await rt.drop_spares(template.id)
        assert rt.spare_counts().get(template.id, 0) == 0
        await rt.destroy("live-s")
        assert await rt.sweep([]) == []


async def test_a_sweep_with_own_takes_the_runtimes_live_instances_too(state_dir, template) -> None:
    """What a stopped bench's runtime does at its end (bench.common.bench_runtime): a sweep with
    `own` kills and removes the runtime's own live instances, which a plain sweep keeps (as at
    the end of test_warm_spares_are_pristine_and_claimed). No plain sweep here right after the
    restore: it would race the slot's warm upper, which is built in the background."""
    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(_config(state_dir)) as rt:
        h = await rt.restore("live-own", template, LIMITS)
        assert _leftovers(state_dir, h)
        assert h.extra["iid"] in await rt.sweep([], own=True)
        assert _leftovers(state_dir, h) == []


async def test_slot_survives_a_runtime_restart_and_is_adopted(state_dir, template) -> None:
    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(_config(state_dir)) as rt1:
        h = await rt1.restore("live-adopt", template, LIMITS)
        orphan = await rt1.restore("live-orphan", template, LIMITS)
        before = await _screen(rt1, h)
    # The first runtime is gone (as after a daemon crash); both trees still run.
    assert _leftovers(state_dir, h) and _leftovers(state_dir, orphan)
    async with open_linux_runtime(_config(state_dir)) as rt2:
        assert await rt2.adopt(h) is True
        assert await _screen(rt2, h) == before
        cleaned = await rt2.sweep(["live-adopt"])  # live-orphan is no longer a live slot
        assert orphan.extra["iid"] in cleaned
        assert _leftovers(state_dir, orphan) == []
        assert (await rt2.facts(h)).alive
        await rt2.destroy("live-adopt")
        assert _leftovers(state_dir, h) == []
        assert await rt2.adopt(h) is False


async def test_slot_ids_map_as_the_profile_says(rt, template, profile) -> None:
    if profile == "trusted":  # trusted code only: the identity map, and says so
        h = await rt.restore("live-t1", template, LIMITS)
        try:
            assert (await rt.facts(h)).extra["uid_map"] == ["0", "0", "4294967295"]
            assert (await rt.exec_user(h, "id -u", 10)).stdout.strip() == "1000"
        finally:
            await rt.destroy("live-t1")
        return
    a = await rt.restore("live-h1", template, LIMITS)
    b = await rt.restore("live-h2", template, LIMITS)
    base_a, base_b = a.extra["uid_base"], b.extra["uid_base"]
    assert base_a >= 100000 and base_b >= 100000 and base_a != base_b
    for h, base in ((a, base_a), (b, base_b)):
        facts = await rt.facts(h)
        assert facts.extra["uid_map"] == ["0", str(base), "65536"]
        for pid in facts.pids:
            uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[1])
            assert base <= uid < base + 65536, f"pid {pid} runs as host uid {uid}"
        # Root in the slot is an unprivileged host uid: no device nodes.
        res = await rt.exec_trusted(h, "id -u; mknod /tmp/sda b 8 0 && echo MKNOD-OK", 10)
        assert res.stdout.split()[0] == "0" and "MKNOD-OK" not in res.stdout
    # A fork restores into its own range: the userns image is rewritten per range.
    ck = await rt.capture(a, "live-h-pre", Path(a.root).parents[2] / "ck" / uuid.uuid4().hex[:6])
    (kid,) = await rt.fork(a, ck, ["live-h3"], LIMITS)
    assert kid.extra["uid_base"] not in (base_a, base_b)
    assert (await rt.exec_user(kid, "id -un", 10)).stdout.strip() == "user"
    for sid in ("live-h3", "live-h2", "live-h1"):
        await rt.destroy(sid)


async def test_a_hanging_restore_times_out_is_retried_and_leaves_nothing(
    state_dir, template
) -> None:
    from drumsd.core.seams import RuntimeError_
    from drumsd.runtime.linux import open_linux_runtime

    broken_dir = state_dir / "ck" / f"broken-{uuid.uuid4().hex[:6]}"
    await trio.run_process(["cp", "-a", str(template.dir), str(broken_dir)])  # sockets too
    for pages in (broken_dir / "images").glob("pages-*.img"):
        pages.write_bytes(b"")  # criu then spins forever restoring memory
    broken = CheckpointRef("broken", broken_dir, template.lower, template.image_sha256)
    cfg = _config(state_dir, restore_timeout_s=3.0, max_attempts=2)
    async with open_linux_runtime(cfg) as rt:
        await rt.sweep([])
        before = set((state_dir / "slots").iterdir())
        with pytest.raises(RuntimeError_) as info:
            await rt.restore("live-broken", broken, LIMITS)
        assert info.value.code == "restore_failed" and "timed out" in info.value.message
        assert rt.stats["restore_retries"] == 2
        assert set((state_dir / "slots").iterdir()) == before
        assert not [
            ln
            for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if "slot-live-broken" in ln
        ]
        assert not [n for n in rt.driver.slot_names() if n.startswith("slot-live-broken")]


async def test_the_group_above_all_slots_has_a_memory_limit(rt, template) -> None:
    from drumsd.linux.host_sampler import read_meminfo

    h = await rt.restore("live-g", template, LIMITS)
    try:
        # Each slot's own limit alone let 50 slots x 2 GiB overcommit a 24 GiB host: the group
        # above them is capped at the host's memory less admission's 4096 MiB floor.
        _, total_mib = read_meminfo()
        assert total_mib is not None
        if "memory" in h.cgroups:  # v1
            limit = Path(h.cgroups["memory"]).parent / "memory.limit_in_bytes"
        else:
            limit = Path(h.cgroups["unified"]).parent / "memory.max"
        assert int(limit.read_text()) == (int(total_mib) - 4096) << 20
    finally:
        await rt.destroy("live-g")


async def test_criu_log_level_sets_the_restore_logs_detail(state_dir, template) -> None:
    """criu_log_level reaches CRIU: a restore's log at level 4 (debug) is many times the one at
    level 1 (errors only); without the setting taking effect both would be CRIU's default."""
    from drumsd.runtime.linux import open_linux_runtime

    lines = {}
    for level in (1, 4):
        async with open_linux_runtime(_config(state_dir, criu_log_level=level)) as rt:
            await rt.restore(f"live-log{level}", template, LIMITS)
            logs = sorted(
                state_dir.glob("slots/*/rw/criu/restore.log"), key=lambda p: p.stat().st_mtime
            )
            lines[level] = len(logs[-1].read_text(errors="replace").splitlines())
            await rt.destroy(f"live-log{level}")
            await rt.sweep([])
    assert lines[4] > 10 * max(lines[1], 1), lines


async def test_restore_cpu_weight_holds_until_the_agent_answers(state_dir, template) -> None:
    """restore_cpu_weight is the restoring slot's cpu weight while its agent is awaited (read
    from the cgroup at that moment), then the slot's own (1024) once it answers."""
    from drumsd.linux import cgroups
    from drumsd.runtime.linux import open_linux_runtime

    seen: list[int] = []
    async with open_linux_runtime(
        _config(state_dir, restore_cpu_weight=8192, spares_per_checkpoint=0)
    ) as rt:
        sup = rt.restorer.sup
        wait_agent = sup.wait_agent

        async def observed(inst, timeout_s):
            seen.append(rt.driver.cpu_shares(inst.cgroups))
            return await wait_agent(inst, timeout_s)

        sup.wait_agent = observed
        h = await rt.restore("live-w", template, LIMITS)
        try:
            assert seen == [8192]
            assert rt.driver.cpu_shares(h.cgroups) == cgroups.DEFAULT_SHARES
        finally:
            await rt.destroy("live-w")
            await rt.sweep([])


async def test_daemon_cpu_weight_is_set_on_the_daemons_cgroup_at_start(state_dir, template) -> None:
    """daemon_cpu_weight: after start this process (the daemon) is in a cgroup of that weight."""
    from drumsd.linux import cgroups
    from drumsd.runtime.linux import open_linux_runtime

    def own_cpu_dir() -> Path:
        own = cgroups.parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
        v1, v2 = cgroups.parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
        if "cpu" in v1:
            return v1["cpu"] / own["cpu"].lstrip("/")
        assert v2 is not None
        return v2 / own[""].lstrip("/")

    before = own_cpu_dir()
    try:
        async with open_linux_runtime(_config(state_dir, daemon_cpu_weight=3072)):
            after = own_cpu_dir()
            if (after / "cpu.shares").exists():
                assert int((after / "cpu.shares").read_text()) == 3072, after
            else:
                assert int((after / "cpu.weight").read_text()) == 300, after
            assert after.name == cgroups.DAEMON_LEAF
    finally:  # the test process goes back where it was
        (before / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):  # another daemon's still in it
            (before / cgroups.DAEMON_LEAF).rmdir()


async def test_a_process_in_a_nested_namespace_is_named_when_a_capture_is_refused(
    rt, template, state_dir
) -> None:
    """nested_pidns is not possible with CRIU 4.2.1 (docs/runtime.md): the desktop user's seccomp
    lock refuses unshare (EPERM), and a process slot root put in user and pid namespaces of its
    own fails the dump ("Can't dump nested user namespace"). The refusal is a conflict naming
    that process and what to do, not a retried runtime error; once it is gone the slot dumps."""
    h = await rt.restore("live-n", template, LIMITS)
    try:
        denied = await rt.exec_user(h, "unshare -Urpf true", 10)
        assert denied.returncode != 0 and "not permitted" in denied.stderr, denied
        started = await rt.exec_trusted(
            h, "setsid unshare -Urpf --mount-proc sleep 600 >/dev/null 2>&1 & sleep 0.5", 10
        )
        assert started.returncode == 0, started.stderr
        dest = state_dir / "ck" / f"ns-{uuid.uuid4().hex[:6]}"
        with pytest.raises(RuntimeError_) as caught:
            await rt.capture(h, "live-n-save", dest)
        assert caught.value.code == "conflict", caught.value.message
        # unshare itself entered the new user namespace (its child sleep the new pid one).
        assert caught.value.detail["process"].startswith("unshare("), caught.value.detail
        assert caught.value.detail["namespace"] == "user", caught.value.detail
        assert "End that process" in caught.value.message
        assert not dest.exists()
        gone = await rt.exec_trusted(
            h,
            "pkill -9 -x unshare; pkill -9 -x sleep; while pgrep -x 'unshare|sleep'; do "
            "sleep 0.1; done; echo gone",
            10,
        )
        assert gone.stdout.strip().endswith("gone"), gone
        ck = await rt.capture(h, "live-n-save2", state_dir / "ck" / f"ns2-{uuid.uuid4().hex[:6]}")
        assert ck.dir.exists()
    finally:
        await rt.destroy("live-n")


@pytest.fixture
def procview_dir() -> Iterator[Path]:
    """An empty directory the runtime mounts LXCFS on (searchable by a hardened slot's ids);
    unmounted after, which ends that LXCFS."""
    from drumsd.linux import procview

    view = Path(f"/run/drums-procview-{uuid.uuid4().hex[:8]}")
    yield view
    procview.stop(view)
    for p in (view, Path(f"{view}.pid"), Path(f"{view}.log")):
        with contextlib.suppress(OSError):
            p.rmdir() if p == view else p.unlink()


async def _proc_view(rt, h: SlotHandle) -> dict[str, float]:
    """What a desktop process reads of its memory, CPUs, CPU time and uptime."""
    script = (
        "awk '/^MemTotal/{print \"mem_kib\", $2}' /proc/meminfo; "
        "echo cpus $(grep -c ^processor /proc/cpuinfo); "
        "echo stat_cpus $(grep -c '^cpu[0-9]' /proc/stat); "
        "echo uptime $(cut -d' ' -f1 /proc/uptime); "
        "echo loadavg_fields $(wc -w < /proc/loadavg)"
    )
    res = await rt.exec_user(h, script, 10)
    assert res.returncode == 0, res.stderr
    return {k: float(v) for k, v in (ln.split() for ln in res.stdout.splitlines())}


# What a desktop process reads of sysinfo(2) through libc (as glibc's sysconf and Chromium do),
# and the cost of a call through libc against the bare system call, interleaved in one process.
SYSINFO_SCRIPT = r"""
import ctypes, json, os, time
class SI(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3)] + [
        (n, ctypes.c_ulong) for n in ("totalram", "freeram", "sharedram", "bufferram",
                                      "totalswap", "freeswap")] + [
        ("procs", ctypes.c_ushort), ("pad", ctypes.c_ushort), ("totalhigh", ctypes.c_ulong),
        ("freehigh", ctypes.c_ulong), ("mem_unit", ctypes.c_uint), ("_f", ctypes.c_char * 8)]
libc = ctypes.CDLL(None, use_errno=True)
si = SI()
assert libc.sysinfo(ctypes.byref(si)) == 0, ctypes.get_errno()
out = {"totalram": si.totalram * si.mem_unit, "freeram": si.freeram * si.mem_unit,
       "uptime": si.uptime, "procs": si.procs,
       "phys": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")}
with open("/proc/uptime") as f:
    out["proc_uptime"] = float(f.read().split()[0])
rates = {"libc": [], "syscall": []}
for _ in range(3):
    for kind, call in (("libc", lambda: libc.sysinfo(ctypes.byref(si))),
                       ("syscall", lambda: libc.syscall(99, ctypes.byref(si)))):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            call(); n += 1
        rates[kind].append(n / (time.perf_counter() - t0))
out["rate_libc"] = sorted(rates["libc"])[1]
out["rate_syscall"] = sorted(rates["syscall"])[1]
print(json.dumps(out))
"""


async def _sysinfo(rt, h: SlotHandle) -> dict[str, float]:
    res = await rt.exec_user(h, f"python3 -c '{SYSINFO_SCRIPT}'", 20)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _check_sysinfo(seen: dict[str, float]) -> None:
    """sysinfo() and sysconf(_SC_PHYS_PAGES) answer the slot's 1 GiB and its own uptime (as
    /proc/uptime through the view: whole seconds, rounded up), not the host's."""
    assert seen["totalram"] == 1 << 30, seen
    assert seen["phys"] == 1 << 30, seen
    assert 0 < seen["freeram"] < 1 << 30, seen
    assert seen["uptime"] < 120 and seen["uptime"] >= int(seen["proc_uptime"]), seen
    print(
        f"sysinfo calls/s in the slot: through libc (the view) {seen['rate_libc']:.0f}, "
        f"bare syscall {seen['rate_syscall']:.0f}"
    )


async def test_procview_shows_each_slot_its_own_limits_across_forks(
    state_dir, procview_dir
) -> None:
    """procview_dir on: a desktop in a 1 GiB, 1-vCPU slot reads 1 GiB in /proc/meminfo, one CPU
    in cpuinfo and stat and its own uptime (seconds, not the host's), and sysinfo() and
    sysconf(_SC_PHYS_PAGES) answer the same 1 GiB and uptime (the preloaded library), in the
    template's restore, after a reset and in a fork's child (dump and restore with the binds as
    CRIU external mounts). With it off the same desktop reads the host's 24 GiB and 2 CPUs (and
    without the library, sysinfo() the host's 24 GiB and uptime): this test fails."""
    lower, sha = _require_live()
    from drumsd.runtime.linux import open_linux_runtime

    small = SlotLimits(vcpus=1.0, memory_mib=1024, pids_max=1024, tmpfs_mib=512)
    async with open_linux_runtime(_config(state_dir, procview_dir=procview_dir)) as rt:
        tpl = await rt.make_template(lower, sha, "base-pv", state_dir / "ck" / "base-pv")
        h = await rt.restore("live-pv", tpl, small)
        try:
            seen = await _proc_view(rt, h)
            assert seen["mem_kib"] == 1024 * 1024, seen
            assert seen["cpus"] == 1 and seen["stat_cpus"] == 1, seen
            assert seen["uptime"] < 120, seen
            assert seen["loadavg_fields"] == 5, seen
            _check_sysinfo(await _sysinfo(rt, h))
            h = await rt.reset(h, tpl, small)
            _check_sysinfo(await _sysinfo(rt, h))
            ck = await rt.capture(h, "live-pv-pre", state_dir / "ck" / "pv-pre")
            (kid,) = await rt.fork(h, ck, ["live-pv-1"], small)
            try:
                assert (await _proc_view(rt, kid))["mem_kib"] == 1024 * 1024
                _check_sysinfo(await _sysinfo(rt, kid))
                facts = await rt.facts(kid)
                assert facts.alive and facts.init_identity_ok, facts
            finally:
                await rt.destroy(kid.slot_id)
        finally:
            await rt.destroy("live-pv")
            await rt.sweep([])


# What CRIU logs when it restores a slot's net namespace itself (`ip` and iptables-restore).
CRIU_NET_RESTORE = ("Address already assigned", "iptables-restore", "ip6tables-restore")


async def test_netns_fast_restores_without_criu_rebuilding_the_network(state_dir, template) -> None:
    """netns_fast: CRIU makes an empty net namespace and the exec helper (its setup-namespaces
    action) brings lo up, instead of CRIU running `ip` and four failing iptables-restore execs:
    the restore log has none of those lines, lo is up with 127.0.0.1 and the slot's netns holds
    only lo, and a fork child restores the same way. With netns_fast off the log has them."""
    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(_config(state_dir, netns_fast=True)) as rt:
        h = await rt.restore("live-nf", template, LIMITS)
        try:
            log = Path(h.root).parent / "rw" / "criu" / "restore.log"
            text = log.read_text(errors="replace")
            assert not [m for m in CRIU_NET_RESTORE if m in text], text[-2000:]
            lo = await rt.exec_user(h, "ip -o -4 addr show dev lo; ip -o link show lo", 10)
            assert "127.0.0.1/8" in lo.stdout and "UP" in lo.stdout, lo
            facts = await rt.facts(h)
            assert facts.alive and facts.net_links == ["lo"], facts
            ck = await rt.capture(h, "live-nf-pre", state_dir / "ck" / f"nf-{uuid.uuid4().hex[:6]}")
            (kid,) = await rt.fork(h, ck, ["live-nf-1"], LIMITS)
            try:
                kid_log = Path(kid.root).parent / "rw" / "criu" / "restore.log"
                assert "iptables-restore" not in kid_log.read_text(errors="replace")
                assert (await rt.facts(kid)).net_links == ["lo"]
            finally:
                await rt.destroy(kid.slot_id)
        finally:
            await rt.destroy("live-nf")
            await rt.sweep([])
