"""Pure parts of `drumsd bench`: percentiles, admission fit and the table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from drumsd.bench.common import BenchError, bench_dir_lock, held_bench_locks, percentile
from drumsd.bench.runtime import render_table, slots_that_fit, summarize


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    s = summarize([0.1, 0.2, 0.3, 0.4])
    assert s["n"] == 4 and s["p50"] == 0.2 and s["max"] == 0.4


def test_slots_that_fit_keeps_the_admission_reserve() -> None:
    # 24 GiB host, 22 GiB available, reserve max(4096, 8%) = 4096 MiB; 100 MiB per slot.
    assert slots_that_fit(22528, 24576, 100, 4096, 8) == 184
    assert slots_that_fit(3000, 24576, 100, 4096, 8) == 0
    assert slots_that_fit(22528, 24576, 0, 4096, 8) == 0


def test_render_table_shows_ratios_to_the_cold_boot() -> None:
    r = {
        "cold_boot_s": summarize([2.0]),
        "reset_s": summarize([0.2, 0.25]),
        "branch": {"8": summarize([1.0])},
        "step_screenshot_s": summarize([0.05]),
        "memory": {"per_slot_mib_no_ksm": 100.0, "slots_fit_no_ksm": 180},
    }
    table = render_table(r)
    assert "10x faster" in table  # 2.0 / 0.2
    assert "branch of 8" in table and "16.0x faster than 8 cold boots" in table
    assert "180" in table


def test_profiles_table_puts_hardened_beside_trusted_with_the_ratio() -> None:
    from drumsd.bench.runtime import render_profiles

    runs = {
        "hardened": {"reset_s": {"p50": 0.2}, "branch": {"8": {"p50": 0.9}}},
        "trusted": {"reset_s": {"p50": 0.1}, "branch": {"8": {"p50": 0.9}}},
    }
    table = render_profiles(runs)
    reset = next(line for line in table.splitlines() if line.startswith("reset, restore path"))
    assert reset.split()[-1] == "2.00" and "0.200s" in reset and "0.100s" in reset
    assert any(
        line.startswith("branch of 8") and line.endswith("1.00") for line in table.splitlines()
    )
    assert "create" not in table  # an operation neither run measured is left out


def test_a_forks_time_is_broken_down_per_child_and_phase() -> None:
    from drumsd.bench.runtime import fork_breakdown, render_fork_phases

    phases = [{"fs": 0.03, "criu": 0.3, "restore_cpu": 0.08}, {"fs": 0.05, "criu": 0.4}]
    f = fork_breakdown(2, [0.2, 0.4], [0.6, 0.8], phases)
    assert f["per_child_s"]["p50"] in (0.4, 0.6)  # (0.2 + 0.6) / 2 and (0.4 + 0.8) / 2
    assert f["child_phases_s"]["criu"]["n"] == 2
    assert f["child_phases_s"]["restore_cpu"]["n"] == 1
    assert "queue" not in f["child_phases_s"]  # a phase no child recorded is left out
    line = render_fork_phases({"fork_phases": {"2": f}})
    assert line.startswith("fork of 2: dump ") and "criu 0." in line


def test_saves_are_summarized_full_beside_delta() -> None:
    from drumsd.bench.saves import render_saves, summarize_mode

    full = [{"capture_s": 0.3, "dump_s": 0.25, "bytes": 100 << 20, "restore_first_s": 0.5}] * 3
    delta = [
        {"capture_s": c, "dump_s": 0.25, "diff_s": 0.2, "bytes": 5 << 20, "restore_first_s": 0.6}
        | {"pages_bytes": 90 << 20, "pages_fresh": 20 << 20, "pages_stored": 4 << 20}
        for c in (0.5, 0.45, 0.9)
    ]
    modes = {"full": summarize_mode(full), "delta": summarize_mode(delta)}
    assert modes["delta"]["capture_s"] == 0.5  # the median
    ratios = {k: modes["delta"][k] / modes["full"][k] for k in ("bytes", "capture_s")}
    r = {
        "options": {"image": "office", "apps": [], "rounds": 3},
        "modes": modes,
        "ratios": ratios,
        "targets": {"bytes<=0.15": True, "time<=0.5": False},
    }
    table = render_saves(r)
    assert "0.050" in table  # 5 of 100 MiB
    assert "delta pages: 20.0 of 90.0 MiB" in table and "stored in 4.0 MiB" in table
    assert table.splitlines()[-1] == "targets: bytes<=0.15 True, time<=0.5 False"


def test_fork_bench_summary_and_table() -> None:
    from drumsd.bench.forks import MODES, render_forks, summarize_mode

    def one(fork_s: float, memory: float) -> dict[str, Any]:
        t = {"memory_mib": memory, "fork_cost_mib": memory - 100}
        return {
            "fork_s": fork_s,
            "dump_s": 0.5,
            "restore_wall_s": fork_s - 1.0,
            "answer_s": 0.5,
            "memory_mib": memory,
            "children_charge_mib": memory - 150,
            "fork_cost_mib": memory - 100,
            "ksm_saved_mib": 10.0,
            "ksmd_cpu_s": 1.0,
            "foreign_s": 0,
            "timeline": [t, t],
            "phases": [{"criu": 0.4, "restore_cpu": 0.1}],
        }

    off = summarize_mode([one(4.0, 2400), one(5.0, 2500), one(9.0, 2300)], 16)
    on = summarize_mode([one(4.2, 900), one(5.1, 800), one(3.0, 1500)], 16)
    assert (off["fork_s"], off["memory_mib"], on["memory_mib"]) == (5.0, 2400, 900)  # medians
    assert on["breakdown"]["child_phases_s"]["criu"]["p50"] == 0.4
    r = {
        "options": {"settle_s": 10.0, "width": 16, "image": "office", "apps": [], "rounds": 3},
        "modes": dict(zip(MODES, (off, on), strict=True)),
        "targets": {"fork_s<=2.5": False, "memory_mib<=1024": True},
    }
    table = render_forks(r)
    assert "fork, all answering (s)" in table and "memory_mib<=1024 True" in table
    assert "2400.00" in table and "900.00" in table


def test_fork_bench_queue_modes() -> None:
    """--fork-queue compares restore queue widths (boost on in each) instead of the boost."""
    import pytest
    from drumsd.bench.forks import (
        MODES,
        ForkBenchOptions,
        mode_settings,
        modes_of,
        parse_queues,
        targets_met,
    )

    assert parse_queues("2, 4,8") == (2, 4, 8)
    for bad in ("4", "4,4", "0,4", "two,4", ""):
        with pytest.raises(ValueError, match="two or more distinct restore queue widths"):
            parse_queues(bad)
    assert modes_of(ForkBenchOptions()) == MODES
    assert modes_of(ForkBenchOptions(queues=(2, 4))) == ("queue 2", "queue 4")
    assert [mode_settings(m) for m in (*MODES, "queue 8")] == [
        (False, None),
        (True, None),
        (True, 8),
    ]
    m = {"fork_s": 2.0, "memory_mib": 1500.0}
    assert targets_met({"boost off": m, "boost on": m}, "office") == {
        "fork_s<=2.5": True,
        "memory_mib<=1024": False,
    }
    got = targets_met({"queue 2": m, "queue 4": {**m, "fork_s": 4.5}}, "osworld")
    assert got == {
        "queue 2: fork_s<=4.0": True,
        "queue 2: memory_mib<=2048": True,
        "queue 4: fork_s<=4.0": False,
        "queue 4: memory_mib<=2048": True,
    }


# What a fork bench round reports, as the rounds' fakes return it.
FAKE_FORK_ROUND: dict[str, Any] = {
    "fork_s": 1.0,
    "memory_mib": 1.0,
    "ksm_saved_mib": 0,
    "ksmd_cpu_s": 0,
    "foreign_s": 0,
}


def test_fork_bench_rounds_set_queue_width_and_boost(monkeypatch: Any) -> None:
    """Each round runs at its mode's queue width with the boost on; the configured width comes
    back for boost modes; modes alternate order round by round."""
    from types import SimpleNamespace

    import trio
    import trio.lowlevel
    from drumsd.bench import forks

    seen: list[tuple[int, bool, object]] = []

    async def fake_round(rt: Any, *_a: Any, encode: bool = False) -> dict[str, Any]:
        seen.append((rt.restorer.limiter.total_tokens, _a[-1], rt.ksm.boost_rate))
        return dict(FAKE_FORK_ROUND)

    monkeypatch.setattr(forks, "one_round", fake_round)

    async def run(opts: Any) -> dict[str, list[Any]]:
        rt = SimpleNamespace(
            restorer=SimpleNamespace(limiter=trio.CapacityLimiter(4)),
            ksm=SimpleNamespace(boost_rate=None),
        )
        rounds: dict[str, list[Any]] = {m: [] for m in forks.modes_of(opts)}
        await forks.run_rounds(rt, None, None, opts, "B", rounds, lambda _m: None)
        return rounds

    rounds = trio.run(run, forks.ForkBenchOptions(queues=(2, 8), rounds=2))
    assert seen == [(2, True, "B"), (8, True, "B"), (8, True, "B"), (2, True, "B")]
    assert [len(v) for v in rounds.values()] == [2, 2]
    seen.clear()
    trio.run(run, forks.ForkBenchOptions(rounds=2))
    assert seen == [(4, False, None), (4, True, "B"), (4, True, "B"), (4, False, None)]


def test_fork_bench_warm_modes_encode_on_fresh_parents(monkeypatch: Any) -> None:
    """--fork-warm: the boost on in both modes, the screen encoded only in "screen encoded",
    and every round forks a parent of its own that is destroyed after it."""
    from types import SimpleNamespace

    import trio
    import trio.lowlevel
    from drumsd.bench import forks

    seen: list[tuple[str, bool, bool]] = []
    destroyed: list[str] = []

    async def fake_round(
        rt: Any, parent: Any, _ck: Any, _o: Any, _tag: str, on: bool, encode: bool = False
    ) -> dict[str, Any]:
        seen.append((parent.slot_id, on, encode))
        return dict(FAKE_FORK_ROUND)

    async def new_parent(tag: str) -> Any:
        return SimpleNamespace(slot_id=f"p-{tag}")

    async def destroy(slot_id: str) -> None:
        destroyed.append(slot_id)

    monkeypatch.setattr(forks, "one_round", fake_round)

    async def run() -> None:
        rt = SimpleNamespace(
            restorer=SimpleNamespace(limiter=trio.CapacityLimiter(4)),
            ksm=SimpleNamespace(boost_rate=None),
            destroy=destroy,
        )
        opts = forks.ForkBenchOptions(warm=True, rounds=2)
        rounds: dict[str, list[Any]] = {m: [] for m in forks.modes_of(opts)}
        parent = SimpleNamespace(slot_id="shared")
        await forks.run_rounds(rt, parent, None, opts, "B", rounds, lambda _m: None, new_parent)

    trio.run(run)
    assert seen == [
        ("p-0m0", True, False),
        ("p-0m1", True, True),
        ("p-1m0", True, True),
        ("p-1m1", True, False),
    ]
    assert destroyed == ["p-0m0", "p-0m1", "p-1m0", "p-1m1"]


def test_fork_bench_tracking_modes_switch_the_restorers_setting(monkeypatch: Any) -> None:
    """--fork-tracking: the boost on in both modes, the restorer armed only in "tracked", its
    other settings as configured."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    import trio
    from drumsd.bench import forks

    @dataclass(frozen=True)
    class Cfg:
        track_writes: bool = False
        max_attempts: int = 3

    seen: list[tuple[bool, bool, int]] = []

    async def fake_round(rt: Any, *_a: Any, encode: bool = False) -> dict[str, Any]:
        cfg = rt.restorer.config
        seen.append((_a[-1], cfg.track_writes, cfg.max_attempts))
        return dict(FAKE_FORK_ROUND)

    monkeypatch.setattr(forks, "one_round", fake_round)
    opts = forks.ForkBenchOptions(tracking=True, rounds=2)
    assert forks.modes_of(opts) == ("untracked", "tracked")

    async def run() -> None:
        rt = SimpleNamespace(
            restorer=SimpleNamespace(limiter=trio.CapacityLimiter(4), config=Cfg()),
            ksm=SimpleNamespace(boost_rate=None),
        )
        rounds: dict[str, list[Any]] = {m: [] for m in forks.modes_of(opts)}
        await forks.run_rounds(rt, None, None, opts, "B", rounds, lambda _m: None)

    trio.run(run)
    assert seen == [(True, False, 3), (True, True, 3), (True, True, 3), (True, False, 3)]


def test_fork_bench_cpu_by_phase() -> None:
    """Each phase's CPU is the difference of the marks around it, per part; "fork" spans all."""
    from drumsd.bench.forks import cpu_by_phase

    marks = [(0.0, 0.0, 0.0), (1.0, 0.5, 0.1), (3.0, 1.0, 0.5), (4.0, 1.25, 0.625)]
    got = cpu_by_phase(marks)
    assert got["dump"] == {"host": 1.0, "runtime": 0.5, "ksmd": 0.1}
    assert got["restores"] == {"host": 2.0, "runtime": 0.5, "ksmd": 0.4}
    assert got["screenshots"] == {"host": 1.0, "runtime": 0.25, "ksmd": 0.12}
    assert got["fork"] == {"host": 4.0, "runtime": 1.25, "ksmd": 0.62}


def test_fork_bench_host_cpu() -> None:
    """The host's busy CPU leaves idle and iowait out; a mode's medians are per part."""
    import os

    from drumsd.bench.forks import host_busy_s, summarize_mode

    hz = os.sysconf("SC_CLK_TCK")
    stat = f"cpu  {hz} {hz} {2 * hz} {50 * hz} {9 * hz} 0 {hz} {hz} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert host_busy_s(stat) == 6.0  # user 1 + nice 1 + system 2 + softirq 1 + steal 1
    parts = ("dump", "restores", "screenshots", "fork")

    def one(k: float) -> dict[str, Any]:
        t = {"memory_mib": 1.0}
        return {
            **dict.fromkeys(("fork_s", "dump_s", "restore_wall_s", "answer_s"), 1.0),
            **dict.fromkeys(("memory_mib", "children_charge_mib", "fork_cost_mib"), 1.0),
            **dict.fromkeys(("ksm_saved_mib", "ksmd_cpu_s", "foreign_s"), 0),
            "timeline": [t],
            "phases": [],
            "host_cpu_s": dict.fromkeys(parts, k),
        }

    out = summarize_mode([one(1.0), one(3.0), one(2.0)], 16)
    assert out["host_cpu_s"] == dict.fromkeys(parts, 2.0)


def test_the_runtime_benches_state_dir_is_a_tmpfs_unless_the_command_line_keeps_it_on_disk(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """`drumsd bench` mounts a tmpfs at --state-dir for the run and unmounts it (and what the
    runtime left mounted under it) after; --state-on-disk runs without a mount."""
    from drumsd.bench import runtime as bench_runtime
    from drumsd.cli import build_parser
    from drumsd.linux import mounts, syscalls

    parser, _ = build_parser()
    state = tmp_path / "state"
    argv = ["bench", "--forks", "--state-dir", str(state)]
    assert parser.parse_args(argv).state_tmpfs is True
    assert parser.parse_args([*argv, "--state-on-disk"]).state_tmpfs is False
    mounted: list[str] = []
    unmounted: list[str] = []
    monkeypatch.setattr(syscalls, "mount", lambda src, target, *rest: mounted.append(target))
    monkeypatch.setattr(
        mounts, "mounts_under", lambda p: [f"{p}/images", str(p)] if mounted else []
    )
    monkeypatch.setattr(mounts, "apply", lambda ops: unmounted.extend(op.target for op in ops))
    ran: list[list[str]] = []
    monkeypatch.setattr(bench_runtime, "_run_bench", lambda args: ran.append(list(mounted)) or 0)

    assert bench_runtime.main_bench(parser.parse_args(argv)) == 0
    assert ran == [[str(state)]]  # the bench ran with the tmpfs mounted
    assert unmounted == [f"{state}/images", str(state)]  # deepest first, the tmpfs last
    mounted.clear()
    unmounted.clear()
    ran.clear()
    assert bench_runtime.main_bench(parser.parse_args([*argv, "--state-on-disk"])) == 0
    assert ran == [[]] and unmounted == []


def test_a_state_tmpfs_that_cannot_be_mounted_stops_the_runtime_bench_before_it_runs(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    import errno

    from drumsd.bench import runtime as bench_runtime
    from drumsd.cli import build_parser
    from drumsd.linux import syscalls

    def refuse(source: str, target: str, *rest: object) -> None:
        raise OSError(errno.EPERM, f"mount {source!r} on {target!r}: Operation not permitted")

    monkeypatch.setattr(syscalls, "mount", refuse)
    ran: list[object] = []
    monkeypatch.setattr(bench_runtime, "_run_bench", lambda args: ran.append(args) or 0)
    parser, _ = build_parser()
    args = parser.parse_args(["bench", "--saves", "--state-dir", str(tmp_path / "state")])
    assert bench_runtime.main_bench(args) == 1
    err = capsys.readouterr().err
    assert f"cannot mount a tmpfs at {tmp_path / 'state'}" in err, err
    assert "--state-on-disk" in err and "Operation not permitted" in err, err
    assert ran == []


def test_a_bench_lock_is_held_by_the_daemons_a_run_started_until_they_are_gone(
    tmp_path: Path,
) -> None:
    """The lock beside the state dir (never under the tmpfs a run mounts there) refuses a second
    run, naming the holder and the flag, and stays held by a process the run started with it:
    a run that died leaves its daemon's dirs alone while the daemon lives."""
    state = tmp_path / "state"
    with bench_dir_lock(state, "--state-dir") as fd:
        assert held_bench_locks() == (fd,)
        with pytest.raises(BenchError) as caught, bench_dir_lock(state, "--state-dir"):
            pass
        message = str(caught.value)
        assert f"another drumsd bench is running on {state} (pid {os.getpid()}: " in message
        assert message.endswith("give this run another --state-dir"), message
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=held_bench_locks()
        )
    try:
        assert held_bench_locks() == ()
        with pytest.raises(BenchError, match="another drumsd bench is running"):
            with bench_dir_lock(state, "--state-dir"):
                pass
    finally:
        child.kill()
        child.wait()
    with bench_dir_lock(state, "--state-dir"):
        assert (tmp_path / ".state.bench-lock").exists()  # beside it, not under its tmpfs


def test_a_bench_on_a_live_daemons_state_dir_stops_before_it_runs(tmp_path: Path) -> None:
    from drumsd.linux.host_share import hold_dir

    fd = hold_dir(tmp_path, "state_dir")
    try:
        with pytest.raises(BenchError) as caught, bench_dir_lock(tmp_path, "--state-dir"):
            pass
    finally:
        os.close(fd)
    message = str(caught.value)
    assert f"--state-dir {tmp_path} is in use by another drumsd (pid {os.getpid()}: " in message
    assert message.endswith("give this bench its own --state-dir"), message


def test_the_runtime_bench_stops_on_a_busy_state_dir_and_clears_a_crashed_runs_mounts(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """A second `drumsd bench` on the same --state-dir stops before it mounts anything (a tmpfs
    stacked on the first's, then unmounted with everything under it, took the first's slots).
    Under a free lock, what a crashed run left mounted there is unmounted before the new tmpfs."""
    from drumsd.bench import runtime as bench_runtime
    from drumsd.cli import build_parser
    from drumsd.linux import mounts, syscalls

    state = tmp_path / "state"
    events: list[tuple[str, str]] = []
    left = [f"{state}/slots/a/root", str(state)]  # a crashed run's tmpfs and a slot's root
    monkeypatch.setattr(
        syscalls, "mount", lambda src, target, *rest: events.append(("mount", target))
    )

    def under(p: Path) -> list[str]:
        return list(left) if not any(e[0] == "mount" for e in events) else [str(p)]

    def apply(ops: list[Any]) -> None:
        for op in ops:
            events.append((op.kind, op.target))
            if op.target in left:
                left.remove(op.target)

    monkeypatch.setattr(mounts, "mounts_under", under)
    monkeypatch.setattr(mounts, "apply", apply)
    monkeypatch.setattr(bench_runtime, "_run_bench", lambda args: events.append(("run", "")) or 0)
    args = build_parser()[0].parse_args(["bench", "--forks", "--state-dir", str(state)])

    with bench_dir_lock(state, "--state-dir"):
        assert bench_runtime.main_bench(args) == 1
    err = capsys.readouterr().err
    assert f"drumsd bench: another drumsd bench is running on {state}" in err, err
    assert events == []  # nothing mounted, unmounted or run

    assert bench_runtime.main_bench(args) == 0
    assert events == [
        ("umount", f"{state}/slots/a/root"),
        ("umount", str(state)),
        ("mount", str(state)),
        ("run", ""),
        ("umount", str(state)),
    ]
    assert "unmounted 2 mount(s) an earlier run left under" in capsys.readouterr().err


def test_a_progress_line_to_a_closed_pipe_never_cuts_the_run_short(monkeypatch: Any) -> None:
    from drumsd.bench.common import progress_line, stderr_progress

    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stderr", ClosedPipe())
    progress_line("bench episodes: [ramp] failed; daemon log kept")  # no BrokenPipeError
    stderr_progress("restores ...")


@pytest.mark.parametrize("under_trio", [False, True])
def test_sigterm_and_sighup_stop_a_bench_through_its_cleanup(
    tmp_path: Path, under_trio: bool
) -> None:
    """A bench killed with SIGTERM (or its terminal gone, SIGHUP) runs its finally blocks, as
    on Ctrl-C, in plain code and inside trio.run: the daemons it started are stopped and its
    mounts undone, where the default ended it at once and left them behind."""
    import signal
    import textwrap

    marker = tmp_path / "cleaned"
    body = "trio.run(trio.sleep_forever)" if under_trio else "while True: time.sleep(0.05)"
    script = textwrap.dedent(
        f"""
        import sys, time, trio
        from pathlib import Path
        from drumsd.bench.common import stopped_by_signals
        try:
            with stopped_by_signals():
                try:
                    print("ready", flush=True)
                    {body}
                finally:
                    Path({str(marker)!r}).write_text("yes")
        except KeyboardInterrupt:
            sys.exit(130)
        """
    )
    for sig in (signal.SIGTERM, signal.SIGHUP):
        marker.unlink(missing_ok=True)
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.send_signal(sig)
        assert child.wait(timeout=20) == 130, sig
        assert marker.read_text() == "yes", sig


def test_a_bench_runtime_sweeps_what_it_holds_even_when_the_run_is_cancelled(
    monkeypatch: Any,
) -> None:
    """The sweep at the end runs shielded: a run stopped by Ctrl-C or SIGTERM (trio cancels
    the run's tasks) still kills the desktops its runtime restored."""
    import contextlib

    import trio
    import trio.lowlevel
    from drumsd.bench.common import bench_runtime
    from drumsd.runtime import linux as runtime_linux

    sweeps: list[tuple[list[str], bool]] = []

    class Runtime:
        async def sweep(self, live: list[str], *, own: bool = False) -> list[str]:
            await trio.lowlevel.checkpoint()  # raises Cancelled unless shielded
            sweeps.append((live, own))
            return []

    @contextlib.asynccontextmanager
    async def fake_open(cfg: Any) -> Any:
        yield Runtime()

    monkeypatch.setattr(runtime_linux, "open_linux_runtime", fake_open)

    async def run() -> None:
        with trio.CancelScope() as scope:
            async with bench_runtime(None):  # type: ignore[arg-type]
                scope.cancel()
                await trio.sleep(1)
        assert scope.cancelled_caught

    trio.run(run)
    assert sweeps == [([], False), ([], True)]


def test_an_interrupt_is_told_apart_from_a_failure_in_a_trio_exception_group() -> None:
    from drumsd.bench.common import was_interrupted

    assert was_interrupted(KeyboardInterrupt())
    assert was_interrupted(BaseExceptionGroup("nursery", [KeyboardInterrupt()]))
    assert not was_interrupted(BaseExceptionGroup("n", [KeyboardInterrupt(), OSError("disk")]))
    assert not was_interrupted(ValueError("x"))
