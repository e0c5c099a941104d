"""`drumsd bench episodes --profile`'s pure parts: a step's window placed among the sampler's
samples and the other episodes' phases, the slow steps against all, and the parsing of what the
sampler reads from /proc."""

from __future__ import annotations

import pytest
from drumsd.bench import episodes_profile as prof
from drumsd.bench import episodes_sampler as sampler
from drumsd.bench.episodes import main_episode_bench
from drumsd.bench.episodes_profile import Sample
from drumsd.cli import build_parser
from drumsd.linux import procfs


def samples() -> list[Sample]:
    """Four 1-second intervals: a spare's restore runs in the third, the desktops all along."""
    return [
        Sample(10.0, {}),
        Sample(11.0, {"desktop": 1.0}),
        Sample(12.0, {"desktop": 1.0}),
        Sample(13.0, {"desktop": 0.4, "criu restore (spare)": 1.6}, {"criu restore (spare)": 1}),
        Sample(14.0, {"desktop": 1.0}),
    ]


def test_cpu_in_a_window_counts_each_interval_by_its_overlap() -> None:
    got = prof.cpu_in(samples(), 11.5, 12.5)
    assert got == pytest.approx({"desktop": 0.5 + 0.2, "criu restore (spare)": 0.8})
    assert prof.cpu_in(samples(), 20.0, 21.0) == {}, "after the last sample: nothing known"


def test_inflight_is_what_a_sample_inside_saw_or_the_next_one() -> None:
    assert prof.inflight_in(samples(), 12.5, 13.5) == {"criu restore (spare)": 1}
    # A window between two samples: the one after it says what ran.
    assert prof.inflight_in(samples(), 12.2, 12.4) == {"criu restore (spare)": 1}
    assert prof.inflight_in(samples(), 13.2, 13.4) == {}


def episode(start: float, walls: list[float], ops: list[list]) -> dict:
    at = [start + sum(walls[:i]) for i in range(len(walls))]
    return {"steps_s": walls, "steps_at": at, "steps_daemon_s": [w / 2 for w in walls], "ops": ops}


def test_a_step_counts_the_other_episodes_phases_it_overlapped_not_its_own() -> None:
    eps = [
        episode(12.0, [0.1, 0.6], [["create", 11.0, 12.0], ["verify", 12.7, 12.9]]),
        episode(10.0, [0.1], [["create", 12.05, 12.3], ["destroy", 12.3, 12.8]]),
    ]
    w = prof.step_windows(eps)
    assert [(x.episode, x.index) for x in w] == [(0, 0), (0, 1), (1, 0)]
    assert prof.ops_during(eps, w[1]) == {"create": 1, "destroy": 1}
    assert prof.ops_during(eps, w[0]) == {"create": 1}, "its own create ended before it"
    p = prof.step_profile(eps, samples(), w[1])
    assert (p["wall_s"], p["daemon_s"], p["outside_daemon_s"]) == (0.6, 0.3, 0.3)
    assert p["inflight"] == {"criu restore (spare)": 1}
    assert list(p["cpu_s"]) == ["criu restore (spare)", "desktop"], "largest first"


def test_the_slow_steps_against_all_say_what_they_waited_behind() -> None:
    eps = [
        episode(10.0, [0.1, 0.1, 0.1], [["create", 9.9, 10.0], ["destroy", 10.3, 12.05]]),
        episode(12.1, [0.6], []),  # during the spare's restore, after the first wave
        episode(11.0, [0.1], [["create", 12.0, 12.5]]),
    ]
    got = prof.profile_level(eps, samples(), slow_s=0.3)
    slow, every = got["slow_steps"], got["all_steps"]
    assert (slow["n"], every["n"]) == (1, 5)
    assert slow["share_overlapping"] == {"create": 1.0, "criu restore (spare)": 1.0}
    assert every["share_overlapping"]["criu restore (spare)"] == 0.2
    assert slow["cores_busy_p50"]["criu restore (spare)"] == pytest.approx(1.6)
    assert every["cores_busy_p50"]["desktop"] == 1.0
    assert [(p["episode"], p["at_s"]) for p in got["slowest"]] == [(1, 2.2)]
    assert (slow["share_first_step"], every["share_first_step"]) == (1.0, 0.6)
    assert (slow["share_first_wave"], every["share_first_wave"]) == (0.0, 0.8)
    lines = prof.render_profile(8, got)
    assert lines[0] == "  8 at a time: 1 of 5 steps over 300 ms"
    assert "first step (slow / all): 100%/60%" in lines[2] and "wave" in lines[2]
    assert "criu restore (spare) 100%/20%" in lines[3]
    # No slow step: one line, no medians of nothing.
    assert prof.render_profile(1, prof.profile_level(eps[:1], samples(), 0.3)) == [
        "  1 at a time: 0 of 3 steps over 300 ms"
    ]


def test_the_level_cpu_is_split_by_role_and_at_the_first_wave_end() -> None:
    """The level's CPU per kind and per command, whole and either side of its first episode's
    end: what an episode costs by role, and how much of it came while the creates settled."""
    cmds = [
        Sample(10.0, {}),
        Sample(11.0, {"desktop": 1.0}, commands={"desktop: Xvfb": 0.25, "desktop: soffice": 0.75}),
        Sample(12.0, {"desktop": 1.0}, commands={"desktop: Xvfb": 1.0}),
        Sample(13.0, {"criu restore (spare)": 1.6}, commands={"criu restore (spare): criu": 1.6}),
    ]
    eps = [episode(10.5, [0.1], [["create", 10.0, 10.4], ["destroy", 10.6, 11.5]])]
    got = prof.profile_level(eps, cmds)["cpu"]
    assert got["all"]["wall_s"] == 3.0
    assert got["all"]["by_kind_s"] == {"desktop": 2.0, "criu restore (spare)": 1.6}
    assert list(got["all"]["by_command_s"]) == [
        "criu restore (spare): criu",
        "desktop: Xvfb",
        "desktop: soffice",
    ], "largest first"
    assert got["first_wave"]["wall_s"] == 1.5
    assert got["first_wave"]["by_command_s"] == {"desktop: Xvfb": 0.75, "desktop: soffice": 0.75}
    assert got["rest"]["by_kind_s"] == {"criu restore (spare)": 1.6, "desktop": 0.5}
    # No destroy yet (or one sample): no split, or nothing to say.
    assert list(prof.level_cpu([episode(10.5, [0.1], [])], cmds)) == ["all"]
    assert prof.level_cpu(eps, cmds[:1]) == {}


def test_an_episode_is_charged_what_ran_inside_its_window_and_the_rest_is_between() -> None:
    eps = [
        episode(10.5, [0.1], [["create", 10.0, 10.4], ["destroy", 10.6, 11.0]]),
        episode(12.5, [0.1], [["create", 12.0, 12.4], ["destroy", 12.6, 13.0]]),
    ]
    got = prof.episode_cpu(eps, samples())
    assert got["n"] == 2
    # Inside [10, 11] desktop 1.0; inside [12, 13] desktop 0.4 + the spare's restore 1.6.
    assert got["own_s"] == {"p50": 1.5, "mean": 1.5}
    assert got["own_s_each"] == [1.0, 2.0], "in the order they started"
    assert got["by_kind_s_each"][1] == {"desktop": 0.4, "criu restore (spare)": 1.6}
    assert got["by_kind_s_mean"] == {"criu restore (spare)": 0.8, "desktop": 0.7}
    assert got["level_own_s"] == 5.0, "desktop 3.4 + restore 1.6 over [10, 14]"
    assert got["level_own_outside_episodes_s"] == pytest.approx(1.0 + 1.0)
    assert prof.episode_cpu([], samples()) == {"n": 0}


def test_the_sampler_reads_proc_stat_cgroups_and_pressure() -> None:
    stat = "4242 (Web Content (x)) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 1 0 98765 0 0"
    st = procfs.parse_stat(stat)  # the sampler's reading of each process
    assert (st.comm, st.ticks, st.starttime) == ("Web Content (x)", 175, 98765)
    reaper = "77 (desktop-init) S 1 2 3 4 5 6 7 8 9 10 150 25 7 3 20 0 1 0 98765 0 0"
    assert procfs.parse_stat(reaper).child_ticks == 10, "cutime + cstime: its children's CPU"
    spare = "/drums-1a2b3c4d/spare-tpl-office-9-ab12"
    cg = f"4:memory:/x\n3:freezer:{spare}\n1:cpu:{spare}\n"
    assert sampler.instance_of(cg) == ("spare-tpl-office-9-ab12", spare)
    assert sampler.instance_of("1:cpu:/daemon\n") == (None, "/daemon")
    assert sampler.instance_of("1:cpu:/drums-1a2b3c4d\n") == (None, "/drums-1a2b3c4d")
    assert sampler.restore_kind("spare-tpl-x") == "criu restore (spare)"
    assert sampler.restore_kind("slot-s-1") == "criu restore"
    psi = "some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\nfull avg10=0 total=7\n"
    assert sampler.psi_some_s(psi) == 2.5


def test_profile_interval_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    parser, _ = build_parser()
    args = ["bench", "episodes", "--ramp", "1", "--profile", "--profile-interval-s", "0"]
    assert main_episode_bench(parser.parse_args(args)) == 2
    assert "between 0.01 and 5" in capsys.readouterr().err


def test_ramp_config_is_a_config_block_or_a_clear_refusal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from drumsd.bench.episodes import BenchError, ramp_overrides

    assert ramp_overrides("") == {}
    assert ramp_overrides('{"restore_cpu_weight": 64}') == {"restore_cpu_weight": 64}
    for bad, words in [("{x", "not JSON"), ("[1]", "JSON object"), ('{"nope": 1}', "not a valid")]:
        with pytest.raises(BenchError, match=words):
            ramp_overrides(bad)
    parser, _ = build_parser()
    args = parser.parse_args(["bench", "episodes", "--ramp", "1", "--ramp-config", "{x"])
    assert main_episode_bench(args) == 2
    assert "--ramp-config is not JSON" in capsys.readouterr().err
