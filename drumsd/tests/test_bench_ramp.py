"""The density ramp's pure parts: --ramp parsing, a level's row, the knee and the table."""

from __future__ import annotations

import pytest
from drumsd.bench import ramp
from drumsd.bench.episodes import main_episode_bench
from drumsd.cli import build_parser


def episodes(n: int, valid: int, step_s: float) -> list[dict]:
    return [
        {"valid": i < valid, "steps_s": [step_s] * 20, **({} if i < valid else {"error": "boom"})}
        for i in range(n)
    ]


def row(concurrency: int, valid: int, step_s: float) -> dict:
    n = 2 * concurrency
    return ramp.level_row(concurrency, episodes(n, valid, step_s), 30.0, 3.0, 5.0, (8192, 6144))


def test_parse_ramp_takes_increasing_levels_and_says_what_is_wrong() -> None:
    assert ramp.parse_ramp("1,2,4,8,16,32") == ramp.DEFAULT_RAMP
    for bad, words in [("1,x", "separated by commas"), ("0,2", ">= 1"), ("4,2", "increase")]:
        with pytest.raises(ramp.RampError, match=words):
            ramp.parse_ramp(bad)


def test_a_level_row_has_its_figures_and_what_it_breaks() -> None:
    r = row(4, 8, 0.1)
    assert (r["valid"], r["episodes"], r["valid_share"]) == (8, 8, 1.0)
    assert r["step_screenshot_s"]["p50"] == 0.1 and r["cpu_per_episode_s"] == 0.375
    assert r["valid_per_hour"] == 960 and r["mem_available_mib"] == {"start": 8192, "min": 6144}
    assert r["broken"] == []
    assert row(4, 7, 0.1)["broken"] == ["validity"], "7 of 8 valid is under 99%"
    assert row(4, 8, 0.31)["broken"] == ["latency"]
    assert row(4, 0, 0.5)["errors"] == ["boom"]


def test_the_knee_is_the_last_level_before_the_first_that_breaks() -> None:
    rows = [row(1, 2, 0.05), row(2, 4, 0.1), row(4, 8, 0.2), row(8, 16, 0.4), row(16, 32, 0.2)]
    knee = ramp.find_knee(rows, cpus=2)
    assert (knee["last_holding"], knee["first_broken"], knee["broken_on"]) == (4, 8, ["latency"])
    assert knee["busy_desktops_per_core"] == 2.0, "a later level that holds again does not count"
    held = ramp.find_knee(rows[:3], cpus=2)
    assert held["first_broken"] is None and held["last_holding"] == 4
    assert ramp.find_knee([row(1, 1, 0.1)], cpus=2)["last_holding"] == 0
    table = ramp.render_ramp_table({"levels": rows, "knee": knee})
    assert "holds at 4 busy episodes, breaks at 8 (latency)" in table
    assert "2.0 busy desktops per core" in table


def test_a_bad_ramp_on_the_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser, _ = build_parser()
    args = parser.parse_args(["bench", "episodes", "--ramp", "2,1"])
    assert main_episode_bench(args) == 2
    assert "--ramp levels must increase" in capsys.readouterr().err
    args = parser.parse_args(["bench", "episodes", "--ramp", "1", "--ramp-rounds", "0"])
    assert main_episode_bench(args) == 2
