"""Pure parts of `drumsd bench episodes`: the feature switches, the task mix, the summaries,
ratios and the table, and the command line's refusals. The run itself is live (root, CRIU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from drumsd.bench import episodes as be
from drumsd.cli import build_parser
from drumsd.core.config import Config

REPO = Path(__file__).resolve().parents[2]


def test_features_off_is_a_valid_config_block_that_turns_every_switch_off() -> None:
    off = be.features_off()
    assert off["tasks"]["resident_checkers"] is False
    assert off["task_checkpoints"]["enabled"] is False
    # Every switch names a real config field: the daemon would refuse an unknown key.
    Config.model_validate({"token_file": "/t", **off})
    for feature in be.FEATURES:
        assert feature.off, feature


def test_features_are_tagged_by_issue_and_chosen_by_it() -> None:
    assert {f.issue for f in be.FEATURES} == {33, 35}
    assert be.features_off("33") == {
        "tasks": {"resident_checkers": False},
        "task_checkpoints": {"enabled": False},
    }, "the default path before: issue 33's switches only, as before"
    off35 = be.features_off("35")
    assert off35 == {
        "linux": {"screen_grab": "full"},
        "save_delta_depth": 0,
        "ksm": {"boost_s": 0.0},
    }
    Config.model_validate({"token_file": "/t", **off35})
    assert be.features_off("all") == be.merge_config(be.features_off("33"), off35)
    with pytest.raises(be.BenchError, match="give one of 33, 35, all"):
        be.features_of("34")


def test_the_command_line_chooses_whose_features_are_off() -> None:
    parser, _ = build_parser()
    assert parser.parse_args(["bench", "episodes"]).features_off == "33"
    assert parser.parse_args(["bench", "episodes", "--features-off", "35"]).features_off == "35"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "episodes", "--features-off", "36"])


def test_merge_config_merges_blocks_and_leaves_the_base_alone() -> None:
    base = {"tasks": {"dirs": ["/a"]}, "alive_after_s": 1.0}
    out = be.merge_config(base, {"tasks": {"resident_checkers": False}}, {"alive_after_s": 2.0})
    assert out == {"tasks": {"dirs": ["/a"], "resident_checkers": False}, "alive_after_s": 2.0}
    assert base == {"tasks": {"dirs": ["/a"]}, "alive_after_s": 1.0}


def test_task_mix_reads_the_example_tasks_one_per_app() -> None:
    opts = be.EpisodeBenchOptions(tasks_dir=REPO / "examples" / "tasks")
    ids = be.task_mix(opts)
    assert len(ids) == 6
    files = be.task_mix(be.EpisodeBenchOptions(tasks_dir=opts.tasks_dir, tasks=("0f2c5a61",)))
    assert files == [i for i in ids if i.startswith("0f2c5a61")]


def test_task_mix_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(be.BenchError, match="no task directory"):
        be.task_mix(be.EpisodeBenchOptions(tasks_dir=tmp_path / "nope"))
    with pytest.raises(be.BenchError, match="holds no task JSON"):
        be.task_mix(be.EpisodeBenchOptions(tasks_dir=tmp_path))
    (tmp_path / "a.json").write_text(json.dumps({"id": "abc"}))
    with pytest.raises(be.BenchError, match="starting with zzz"):
        be.task_mix(be.EpisodeBenchOptions(tasks_dir=tmp_path, tasks=("zzz",)))
    (tmp_path / "b.json").write_text("[1]")
    with pytest.raises(be.BenchError, match=r"b\.json is not an OSWorld-format task"):
        be.task_mix(be.EpisodeBenchOptions(tasks_dir=tmp_path))


def test_scripted_steps_only_move_and_scroll() -> None:
    kinds = {be.scripted_action(i)["type"] for i in range(20)}
    assert kinds == {"move", "scroll"}


def _path(
    create: float, verify: float, host_cpu: float, wall: float, valid: int, own: float | None
) -> dict:
    eps = [
        {
            "task": "t",
            "create_s": create,
            "steps_s": [0.02, 0.03],
            "gates_wait_s": 0.1,
            "verify_s": verify,
            "destroy_s": 0.05,
            "wall_s": create + verify + 0.2,
            "valid": i < valid,
        }
        for i in range(4)
    ]
    r = {
        "episodes": eps,
        "bare_create_s": be.stats([0.1]),
        "task_reset_s": be.stats([create]),
        "episodes_phase": {
            "wall_s": wall,
            "host_cpu_s": host_cpu,
            "background_cpu_per_s": 0.5,
            "daemon_cpu_s": own,
            "loadavg_end": (1.0, 1.0, 1.0),
        },
    }
    return be.summarize_path(r, be.EpisodeBenchOptions())


def test_summaries_ratios_and_table() -> None:
    on = _path(create=0.5, verify=0.2, host_cpu=6.0, wall=4.0, valid=4, own=2.0)
    off = _path(create=1.5, verify=2.0, host_cpu=22.0, wall=12.0, valid=3, own=8.0)
    # host 6 CPU-s less 0.5/s of background over 4 s = 4 CPU-s over 4 episodes
    assert on["cpu_per_episode_s"]["host_less_background"] == 1.0
    assert on["cpu_per_episode_s"]["own"] == 0.5
    assert on["valid_episodes_per_hour"] == 3600.0
    assert off["valid_episodes"] == 3
    boot = {"cold_boot_s": be.stats([10.0]), "cold_boot_host_cpu_s": be.stats([12.0])}
    paths = {"drums": on, "features off": off, "boot per episode": be.boot_path(boot, off, 0.5)}
    # boot: 10 s + setup (1.5 - 0.1) + the rest of the off episode (its wall less its create)
    assert paths["boot per episode"]["episode_wall_s"]["p50"] == pytest.approx(10 + 1.4 + 2.2)
    rs = be.ratios(paths)
    assert rs["features off"]["create_p50"] == 3.0
    assert rs["features off"]["verify_p50"] == 10.0
    assert rs["features off"]["cpu_per_episode"] == 4.0  # the own account: 2.0 / 0.5
    # No own account of those boots: host against host ((12 - 5) + 4 over drums' 1.0)
    assert rs["boot per episode"]["cpu_per_episode"] == 11.0
    # Without an own account (no cgroup v1 cpuacct) the host figure stands in.
    bare = _path(create=0.5, verify=0.2, host_cpu=6.0, wall=4.0, valid=4, own=None)
    assert be.episode_cpu(bare) == 1.0
    table = be.render_table({"paths": paths, "ratios": rs})
    assert "boot per episode" in table and "verify p50" in table and "4/4" in table


def test_command_line_refuses_nonsense_counts(capsys: pytest.CaptureFixture[str]) -> None:
    parser, _ = build_parser()
    args = parser.parse_args(["bench", "episodes", "--episodes", "0"])
    assert args.func is be.main_episode_bench
    assert be.main_episode_bench(args) == 2
    assert "--episodes must be at least 1" in capsys.readouterr().err
    args = parser.parse_args(["bench", "episodes", "--phase-episodes", "-1"])
    assert be.main_episode_bench(args) == 2
    assert "--phase-episodes are >= 0" in capsys.readouterr().err
    # `drumsd bench` without the subcommand is still the restore bench
    assert parser.parse_args(["bench", "--image", "office"]).func.__name__ == "main_bench"


def test_a_host_that_other_load_saturates_gives_no_host_figure() -> None:
    import os

    busy = _path(create=0.5, verify=0.2, host_cpu=6.0, wall=4.0, valid=4, own=2.0)
    assert busy["host_saturated"] is False
    r = {
        "episodes": busy["episodes"],
        "bare_create_s": be.stats([0.1]),
        "episodes_phase": {
            "wall_s": 4.0,
            "host_cpu_s": 8.0,
            "background_cpu_per_s": float(os.cpu_count() or 1),
            "daemon_cpu_s": 2.0,
            "loadavg_end": (9.0, 9.0, 9.0),
        },
    }
    full = be.summarize_path(r, be.EpisodeBenchOptions())
    assert full["host_saturated"] is True
    assert full["cpu_per_episode_s"]["host_less_background"] is None
    assert be.episode_cpu(full) == 0.5  # the own account still stands


def test_phase_cpu_charges_each_phase_what_the_reading_grew_by() -> None:
    readings = iter([10.0, 10.5, 12.0, 12.0, 12.25])
    phases = be.PhaseCpu(lambda: next(readings))
    for name in ("create", "steps", "gates_wait", "verify"):
        phases.mark(name)
    assert phases.by_phase == {"create": 0.5, "steps": 1.5, "gates_wait": 0.0, "verify": 0.25}
    # No reader (no cpuacct on the host): nothing recorded, nothing raised.
    none = be.PhaseCpu(None)
    none.mark("create")
    assert none.by_phase == {}


def test_cpu_by_phase_in_the_summary_and_the_table() -> None:
    on = _path(create=0.5, verify=0.2, host_cpu=6.0, wall=4.0, valid=4, own=2.0)
    whole = {"create": 0.1, "steps": 1.0, "gates_wait": 0.0, "verify": 0.3, "destroy": 0.05}
    r = {
        **on,
        "phase_episodes": [
            {"cpu_s": whole},
            {"cpu_s": {**whole, "steps": 2.0}},
            {"cpu_s": {"create": 0.2}},  # failed after create: counts for create alone
        ],
    }
    summary = be.summarize_path(r, be.EpisodeBenchOptions())
    by = summary["cpu_by_phase_s"]
    assert by["create"]["n"] == 3 and by["steps"]["n"] == 2 and by["steps"]["mean"] == 1.5
    assert by["episode"]["n"] == 2 and by["episode"]["mean"] == pytest.approx(1.95)
    table = be.render_table({"paths": {"drums": summary}, "ratios": {}})
    assert "CPU-s by phase p50, 1 at a time" in table and "  gates wait" in table
    # A run without them (the boot path, an old JSON) shows no phase rows.
    assert "by phase" not in be.render_table({"paths": {"drums": on}, "ratios": {}})


def test_settle_waits_for_the_account_to_rest_and_reports_its_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from drumsd.bench import episodes_host as eh

    clock = [0.0]
    monkeypatch.setattr(eh.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(eh.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(eh, "host_busy_s", lambda: clock[0] * 0.5)
    # 0.8 cores busy for 3 s (spare refills), then 0.01 at rest
    busy = [0.0]

    def account() -> float:
        busy[0] = min(clock[0], 3.0) * 0.8 + max(0.0, clock[0] - 3.0) * 0.01
        return busy[0]

    out = eh.settle(account, limit_s=60.0)
    assert out == {"waited_s": 4.0, "rest_rate": 0.01, "host_rest_rate": 0.5}
    clock[0] = 0.0
    never = eh.settle(lambda: clock[0] * 1.0, limit_s=5.0)  # never at rest: the limit ends it
    assert never["waited_s"] == 5.0 and never["rest_rate"] == 1.0
    assert eh.settle(lambda: None) == {"waited_s": 0.0, "rest_rate": 0.0, "host_rest_rate": 0.0}


def test_the_state_dir_is_a_tmpfs_unless_the_command_line_keeps_it_on_disk() -> None:
    parser, _ = build_parser()
    assert parser.parse_args(["bench", "episodes"]).state_tmpfs is True
    assert parser.parse_args(["bench", "episodes", "--state-on-disk"]).state_tmpfs is False


def test_a_state_tmpfs_that_cannot_be_mounted_stops_the_bench_before_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from drumsd.bench import episodes_host
    from drumsd.linux import syscalls

    def refuse(source: str, target: str, *rest: object) -> None:
        raise OSError(errno.EPERM, f"mount {source!r} on {target!r}: Operation not permitted")

    monkeypatch.setattr(syscalls, "mount", refuse)
    started: list[object] = []
    monkeypatch.setattr(episodes_host.subprocess, "Popen", lambda *a, **k: started.append(a))
    opts = be.EpisodeBenchOptions(state_root=tmp_path)
    daemon = episodes_host.BenchDaemon.configure("drums", opts, {})
    with pytest.raises(be.BenchError) as caught:
        daemon.start()
    message = str(caught.value)
    assert "cannot mount a tmpfs at" in message and str(tmp_path / "drums" / "state") in message
    assert "--state-on-disk" in message and "Operation not permitted" in message
    assert started == []  # no daemon on a state_dir other than the one asked for


def test_a_second_run_on_a_state_root_stops_before_it_touches_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `drumsd bench episodes` on one --state-root: the second says who runs there and which
    flag to change, and leaves the first's daemon dir as it was. It used to remove what it could
    of the first's dirs (its tmpfs included) and die on a FileExistsError traceback."""
    import os

    from drumsd.bench.common import bench_dir_lock

    monkeypatch.setattr(be.os, "geteuid", lambda: 0)  # the check before the lock
    token = tmp_path / "ramp" / "token"
    (tmp_path / "ramp" / "state").mkdir(parents=True)
    token.write_text("the first run's\n")
    ran: list[object] = []
    monkeypatch.setattr(be, "_run_locked", lambda *a: ran.append(a) or {"ramp": {}})
    monkeypatch.setattr(be, "render_ramp_table", lambda ramp: "table")
    parser, _ = build_parser()
    argv = ["bench", "episodes", "--ramp", "1", "--state-root", str(tmp_path)]
    args = parser.parse_args([*argv, "--tasks-dir", str(REPO / "examples" / "tasks")])
    args.out = tmp_path / "out.json"
    with bench_dir_lock(tmp_path, "--state-root"):
        assert be.main_episode_bench(args) == 1
    err = capsys.readouterr().err
    assert f"another drumsd bench is running on {tmp_path} (pid {os.getpid()}: " in err, err
    assert "give this run another --state-root" in err and "Traceback" not in err, err
    assert ran == [] and token.read_text() == "the first run's\n"
    assert be.main_episode_bench(args) == 0 and len(ran) == 1  # the root is free again
