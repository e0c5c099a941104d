"""The KSM scan boost after a fork (issue 35): knobs at the boost rate, back to the quiet rate
after three full passes or the boost's seconds, extended by another burst, undone on leave; and
the fork that asks for it (no root, a knob dir in tmp, no ksmd to renice)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from drumsd.core.seams import SlotHandle
from drumsd.linux import host_share
from drumsd.runtime.linux.base import LinuxRuntimeConfig
from drumsd.runtime.linux.ksm import BOOST_NICE, BOOST_PASSES, KsmBoost, KsmMembership
from drumsd.runtime.linux.slots import Slots

QUIET = {"pages_to_scan": "1000", "sleep_millisecs": "20"}
BOOSTED = {"pages_to_scan": "20000", "sleep_millisecs": "5"}


def knobs_dir(tmp_path: Path) -> Path:
    knobs = tmp_path / "ksm"
    knobs.mkdir()
    for name, value in (("run", "0"), ("pages_to_scan", "100"), ("sleep_millisecs", "200")):
        (knobs / name).write_text(value)
    (knobs / "full_scans").write_text("7\n")
    return knobs


def knobs(d: Path) -> dict[str, str]:
    return {n: (d / n).read_text().strip() for n in ("pages_to_scan", "sleep_millisecs")}


def membership(tmp_path: Path, seconds: float = 20.0) -> tuple[KsmMembership, Path]:
    d = knobs_dir(tmp_path)
    share = host_share.KsmShare(d, tmp_path / "claims", proc=tmp_path / "proc")
    ksm = KsmMembership(
        share,
        enabled=True,
        pages_to_scan=1000,
        sleep_millisecs=20,
        boost=KsmBoost(seconds, 20_000, 5),
    )
    ksm.join()
    return ksm, d


def run_with_boosts(ksm: KsmMembership, body) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(ksm.serve_boosts)
            await body()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_boost_runs_for_its_seconds_then_the_quiet_rate_is_back(tmp_path: Path) -> None:
    ksm, d = membership(tmp_path)
    seen: list[dict[str, str]] = []

    async def body() -> None:
        assert knobs(d) == QUIET
        ksm.boost()
        seen.append(knobs(d))
        await trio.sleep(19.0)
        seen.append(knobs(d))
        await trio.sleep(2.0)
        seen.append(knobs(d))

    run_with_boosts(ksm, body)
    assert seen == [BOOSTED, BOOSTED, QUIET]
    assert ksm.boosts == 1


def test_a_boost_ends_after_three_full_passes(tmp_path: Path) -> None:
    ksm, d = membership(tmp_path)
    seen: list[dict[str, str]] = []

    async def body() -> None:
        ksm.boost()
        (d / "full_scans").write_text(str(7 + BOOST_PASSES - 1))
        await trio.sleep(2.0)
        seen.append(knobs(d))
        (d / "full_scans").write_text(str(7 + BOOST_PASSES))
        await trio.sleep(1.0)
        seen.append(knobs(d))

    run_with_boosts(ksm, body)
    assert seen == [BOOSTED, QUIET]


def test_another_burst_extends_the_boost(tmp_path: Path) -> None:
    ksm, d = membership(tmp_path)
    seen: list[dict[str, str]] = []

    async def body() -> None:
        ksm.boost()
        await trio.sleep(15.0)
        ksm.boost()  # 15 s into the first: now until 35 s
        await trio.sleep(15.0)
        seen.append(knobs(d))
        await trio.sleep(6.0)
        seen.append(knobs(d))

    run_with_boosts(ksm, body)
    assert seen == [BOOSTED, QUIET]
    assert ksm.boosts == 1


@pytest.mark.parametrize("seconds", [0.0, None])
def test_no_boost_when_it_is_off(tmp_path: Path, seconds: float | None) -> None:
    d = knobs_dir(tmp_path)
    share = host_share.KsmShare(d, tmp_path / "claims", proc=tmp_path / "proc")
    boost = None if seconds is None else KsmBoost(seconds, 20_000, 5)
    ksm = KsmMembership(share, enabled=True, pages_to_scan=1000, sleep_millisecs=20, boost=boost)
    ksm.join()

    async def body() -> None:
        ksm.boost()

    run_with_boosts(ksm, body)
    assert knobs(d) == QUIET and ksm.boosts == 0


def test_leaving_mid_boost_leaves_the_quiet_rate_for_the_daemons_still_in(tmp_path: Path) -> None:
    ksm, d = membership(tmp_path)
    (tmp_path / "claims" / "holders" / "1").write_text("")  # pid 1: another daemon, alive

    async def body() -> None:
        ksm.boost()
        ksm.leave()

    run_with_boosts(ksm, body)
    assert knobs(d) == QUIET


def test_ksmd_is_found_by_its_name(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, comm in ((2, "kthreadd"), (39, "ksmd"), (400, "bash")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    assert host_share.ksmd_pid(proc) == 39
    assert host_share.ksmd_pid(tmp_path / "nothing") is None


class OneTable:
    def of(self, handle: SlotHandle) -> object:
        return object()


@pytest.mark.parametrize(("width", "asks"), [(1, []), (3, ["before", "after"])])
def test_a_fork_of_several_children_asks_for_a_boost_as_it_starts_and_ends(
    tmp_path: Path, width: int, asks: list[str]
) -> None:
    asked: list[str] = []
    restored: list[str] = []
    config = LinuxRuntimeConfig(state_dir=tmp_path)
    slots = Slots(
        config,
        None,  # type: ignore[arg-type]
        OneTable(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        before_fork=lambda: asked.append("before"),
        after_fork=lambda: asked.append("after"),
    )

    async def restore(slot_id: str, *args: object) -> str:
        assert asked[:1] == asks[:1]  # the scan rate is up before the first restore
        restored.append(slot_id)
        return slot_id

    slots.restore = restore  # type: ignore[method-assign]
    parent = SlotHandle("p", 1, 1, tmp_path, tmp_path, "ck")
    ids = [f"c{i}" for i in range(width)]
    out = trio.run(slots.fork, parent, None, ids, None)
    assert out == ids and sorted(restored) == ids
    assert asked == asks


def test_a_boost_begun_by_a_fork_leaves_ksmd_alone_until_the_children_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ksm, d = membership(tmp_path)
    niced: list[int] = []
    monkeypatch.setattr(
        host_share.KsmShare, "renice_scanner", lambda self, n: niced.append(n) or True
    )

    async def body() -> None:
        ksm.start_boost()
        assert knobs(d) == BOOSTED and niced == []
        ksm.boost()
        ksm.boost()
        assert niced == [BOOST_NICE]
        await trio.sleep(21.0)

    run_with_boosts(ksm, body)
    assert knobs(d) == QUIET and niced == [BOOST_NICE, host_share.KSMD_NICE]


def test_one_daemons_boost_ending_keeps_another_daemons_boost(tmp_path: Path) -> None:
    d = knobs_dir(tmp_path)
    ours = host_share.KsmShare(d, tmp_path / "claims", proc=tmp_path / "proc")
    theirs = host_share.KsmShare(d, tmp_path / "claims", proc=tmp_path / "proc")
    theirs.pid = 1  # another live daemon
    ours.boost(BOOSTED, 20.0)
    theirs.boost(BOOSTED, 20.0)
    assert not ours.unboost(QUIET) and knobs(d) == BOOSTED  # theirs still runs
    assert theirs.unboost(QUIET) and knobs(d) == QUIET
    theirs.boost(BOOSTED, -1.0)  # a boost already over (its daemon never ended it)
    assert ours.unboost(QUIET) and knobs(d) == QUIET
    assert list((tmp_path / "claims" / "boosts").iterdir()) == []
