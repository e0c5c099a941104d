"""`drumsd bench episodes --ramp`: the density ramp, its levels summarised and its knee found.

Pure: the episodes of each level come from `bench.episodes.run_ramp`; here they become a row
(valid share, step + screenshot p50/p99, CPU per episode, MemAvailable) and the rows a knee: the
first level where validity (< 99% valid) or latency (step + screenshot p99 > 300 ms) breaks, and
the busy desktops per core of the last level before it.
"""

from __future__ import annotations

import json
from typing import Any

from drumsd.bench.common import percentile
from drumsd.bench.episodes_profile import render_profile

MIN_VALID_SHARE = 0.99
MAX_STEP_P99_S = 0.300
DEFAULT_RAMP = (1, 2, 4, 8, 16, 32)


class RampError(ValueError):
    """A --ramp value that is not a list of increasing positive integers."""


def parse_ramp(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8); a clear error for anything else."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise RampError(
            f"--ramp takes concurrency levels separated by commas, e.g. 1,2,4,8; got {text!r}"
        ) from exc
    if not levels or any(c < 1 for c in levels):
        raise RampError(f"--ramp levels must be integers >= 1, got {text!r}")
    if list(levels) != sorted(set(levels)):
        raise RampError(f"--ramp levels must increase, each once, got {text!r}")
    return levels


def level_row(
    concurrency: int,
    episodes: list[dict[str, Any]],
    wall_s: float,
    own_cpu_s: float | None,
    host_cpu_s: float,
    mem_available_mib: tuple[float, float],
) -> dict[str, Any]:
    """One level's row from its episode records (run_episode's) and its readings: the daemon's
    own CPU (daemon + slots; None without cpuacct) and the host's, over the level's wall time;
    MemAvailable at the level's start and its lowest during the level."""
    steps = [s for e in episodes for s in e.get("steps_s", [])]
    valid = sum(1 for e in episodes if e.get("valid"))
    n = len(episodes)
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "episodes": n,
        "valid": valid,
        "valid_share": round(valid / n, 4) if n else 0.0,
        "step_screenshot_s": {
            "p50": round(percentile(steps, 50), 4) if steps else None,
            "p99": round(percentile(steps, 99), 4) if steps else None,
            "n": len(steps),
        },
        "wall_s": round(wall_s, 2),
        "cpu_per_episode_s": None if own_cpu_s is None or not n else round(own_cpu_s / n, 3),
        "host_cpu_per_episode_s": round(host_cpu_s / n, 3) if n else None,
        "valid_per_hour": round(valid * 3600 / wall_s) if wall_s > 0 else 0,
        "mem_available_mib": {
            "start": round(mem_available_mib[0]),
            "min": round(mem_available_mib[1]),
        },
        "errors": sorted({str(e["error"])[:120] for e in episodes if e.get("error")})[:3],
    }
    row["broken"] = broken_on(row)
    return row


def broken_on(row: dict[str, Any]) -> list[str]:
    """What a level breaks: validity, latency, both or nothing."""
    out = []
    if row["valid_share"] < MIN_VALID_SHARE:
        out.append("validity")
    p99 = row["step_screenshot_s"]["p99"]
    if p99 is None or p99 > MAX_STEP_P99_S:
        out.append("latency")
    return out


def find_knee(rows: list[dict[str, Any]], cpus: int) -> dict[str, Any]:
    """The last level that holds (every level up to it holds too) and the first that breaks."""
    last_ok = None
    first_broken = None
    for row in rows:
        if row["broken"]:
            first_broken = row
            break
        last_ok = row
    held = last_ok["concurrency"] if last_ok else 0
    return {
        "criteria": f">= {MIN_VALID_SHARE:.0%} valid and step + screenshot p99 <= "
        f"{MAX_STEP_P99_S * 1e3:.0f} ms",
        "last_holding": held,
        "first_broken": first_broken["concurrency"] if first_broken else None,
        "broken_on": first_broken["broken"] if first_broken else [],
        "cpus": cpus,
        "busy_desktops_per_core": round(held / cpus, 2) if cpus else None,
    }


def render_ramp_table(ramp: dict[str, Any]) -> str:
    head = (
        f"{'conc':>5}{'valid':>9}{'step p50':>10}{'p99':>8}{'CPU/ep':>8}{'host/ep':>9}"
        f"{'valid/h':>9}{'MemAvail':>10}{'min':>7}  breaks"
    )
    overrides = ramp.get("config_overrides")
    config = f", config {json.dumps(overrides)}" if overrides else ""
    state = f", state_dir on {ramp['state_fs']}" if ramp.get("state_fs") else ""
    lines = [f"density ramp (drums path{config}{state})", head, "-" * len(head)]
    for r in ramp["levels"]:
        s = r["step_screenshot_s"]
        p50 = f"{s['p50'] * 1e3:.0f}ms" if s["p50"] is not None else "-"
        p99 = f"{s['p99'] * 1e3:.0f}ms" if s["p99"] is not None else "-"
        cpu = f"{r['cpu_per_episode_s']:.2f}s" if r["cpu_per_episode_s"] is not None else "-"
        host = f"{r['host_cpu_per_episode_s']:.2f}s" if r["host_cpu_per_episode_s"] else "-"
        mem = r["mem_available_mib"]
        lines.append(
            f"{r['concurrency']:>5}{r['valid']:>4}/{r['episodes']:<4}{p50:>10}{p99:>8}{cpu:>8}"
            f"{host:>9}{r['valid_per_hour']:>9}{mem['start'] / 1024:>8.1f}G"
            f"{mem['min'] / 1024:>6.1f}G  {', '.join(r['broken']) or '-'}"
        )
    k = ramp["knee"]
    broke = (
        f"breaks at {k['first_broken']} ({', '.join(k['broken_on'])})"
        if k["first_broken"]
        else "no level broke"
    )
    lines.append(
        f"knee ({k['criteria']}): holds at {k['last_holding']} busy episodes, {broke}; "
        f"{k['busy_desktops_per_core']} busy desktops per core ({k['cpus']} CPUs)"
    )
    profiled = [r for r in ramp["levels"] if "profile" in r]
    if profiled:
        lines.append("slow steps, profiled (what they overlapped; cores busy by kind of process):")
        for r in profiled:
            lines += render_profile(r["concurrency"], r["profile"])
    return "\n".join(lines)
