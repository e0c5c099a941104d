"""`drumsd bench episodes`, the report: per-path figures (p50 / p99, CPU per episode, valid
episodes per hour), the boot-per-episode path derived from this run's cold boots, the ratios
against the drums path and the table. Pure: it reads the runs' records, never the host."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from drumsd.bench.common import percentile
from drumsd.bench.episode_options import EpisodeBenchOptions

SATURATED = 0.9  # background CPU per second, as a share of the host's CPUs
# An episode's phases, in order, as the one-at-a-time episodes record their CPU.
PHASES = ("create", "steps", "gates_wait", "verify", "destroy")


def stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 4),
        "p99": round(percentile(values, 99), 4),
        "mean": round(sum(values) / len(values), 4),
    }


def summarize_path(r: dict[str, Any], opts: EpisodeBenchOptions) -> dict[str, Any]:
    eps = r["episodes"]
    ok = [e for e in eps if "verify_s" in e]
    valid = sum(1 for e in eps if e.get("valid"))
    phase = r["episodes_phase"]
    n = max(1, len(eps))
    host_net = max(0.0, phase["host_cpu_s"] - phase["background_cpu_per_s"] * phase["wall_s"])
    # A host that other load already kept busy has no margin to see ours in: no host figure.
    saturated = phase["background_cpu_per_s"] >= SATURATED * (os.cpu_count() or 1)
    r["host_saturated"] = saturated
    own = phase["daemon_cpu_s"]
    r["create_s"] = stats([e["create_s"] for e in eps])
    r["step_screenshot_s"] = stats([s for e in eps for s in e["steps_s"]])
    r["verify_s"] = stats([e["verify_s"] for e in ok])
    r["gates_wait_s"] = stats([e["gates_wait_s"] for e in ok])
    r["destroy_s"] = stats([e["destroy_s"] for e in eps])
    r["episode_wall_s"] = stats([e["wall_s"] for e in eps])
    r["valid_episodes"] = valid
    r["errors"] = [e["error"] for e in eps if "error" in e]
    r["cpu_per_episode_s"] = {
        "host": round(phase["host_cpu_s"] / n, 3),
        "host_less_background": None if saturated else round(host_net / n, 3),
        "own": None if own is None else round(own / n, 3),
    }
    r["valid_episodes_per_hour"] = round(valid / phase["wall_s"] * 3600, 1)
    # What the host could sustain if CPU were the bound: all its CPUs over the CPU per episode
    # (the daemon's own account where there is one: other load on the host does not enter it).
    per = episode_cpu(r)
    cpus = os.cpu_count() or 1
    r["cpu_bound_episodes_per_hour"] = round(cpus * 3600 / per * valid / n, 1) if per else None
    by_phase = cpu_by_phase(r.get("phase_episodes") or [])
    if by_phase:
        r["cpu_by_phase_s"] = by_phase
    return r


def cpu_by_phase(episodes: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase, the CPU-seconds of the one-at-a-time episodes (those that reached it), and
    `episode`: their sum per episode that recorded every phase."""
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        values = [e["cpu_s"][phase] for e in episodes if phase in e.get("cpu_s", {})]
        if values:
            out[phase] = stats(values)
    whole = [sum(e["cpu_s"].values()) for e in episodes if set(e.get("cpu_s", {})) == set(PHASES)]
    if whole:
        out["episode"] = stats(whole)
    return out


def episode_cpu(path: dict[str, Any]) -> float | None:
    """CPU-seconds per episode: the daemon's own account where the host has one, else the
    host's /proc/stat delta less its background rate."""
    cpu = path["cpu_per_episode_s"]
    own = cpu.get("own")
    return own if own is not None else cpu.get("host_less_background")


def boot_path(boot: dict[str, Any], off: dict[str, Any], background: float) -> dict[str, Any]:
    """An episode that boots instead of restoring: the cold boot measured here, then the same
    setup (create on a task less a bare create), steps, gates, verify and destroy as the
    features-off path's episodes. CPU: the boot's, less background, plus that path's episode."""
    boot_wall = boot["cold_boot_s"]["p50"]
    setup = max(0.0, off["create_s"]["p50"] - off["bare_create_s"]["p50"])
    rest = off["episode_wall_s"]["p50"] - off["create_s"]["p50"]  # steps, gates, verify, destroy
    wall = boot_wall + setup + rest
    off_host = off["cpu_per_episode_s"]["host_less_background"]
    host_cpu = None
    if off_host is not None and background < SATURATED * (os.cpu_count() or 1):
        host_cpu = max(0.0, boot["cold_boot_host_cpu_s"]["p50"] - background * boot_wall)
        host_cpu += off_host
    own_boot = boot.get("cold_boot_own_cpu_s", {}).get("p50")
    own_off = off["cpu_per_episode_s"].get("own")
    own = None if own_boot is None or own_off is None else own_boot + own_off
    path: dict[str, Any] = {
        **boot,
        "create_s": {"p50": round(boot_wall + setup, 3)},
        "task_reset_s": {"p50": round(boot_wall + setup, 3)},
        "episode_wall_s": {"p50": round(wall, 3)},
        "cpu_per_episode_s": {
            "host_less_background": None if host_cpu is None else round(host_cpu, 3),
            "own": None if own is None else round(own, 3),
        },
    }
    cpu = episode_cpu(path)
    cpus = os.cpu_count() or 1
    valid_frac = off["valid_episodes"] / max(1, len(off["episodes"]))
    return {
        **path,
        "cpu_bound_episodes_per_hour": round(cpus * 3600 / cpu * valid_frac, 1) if cpu else None,
        "derived_from": "cold boots of this run + the features-off path's setup/steps/verify",
    }


def cpu_ratio(path: dict[str, Any], ref: dict[str, Any]) -> float | None:
    """CPU per episode of `path` over `ref`, like for like: both own accounts, else both host."""
    a, b = path["cpu_per_episode_s"], ref["cpu_per_episode_s"]
    key = "own" if a.get("own") is not None and b.get("own") is not None else "host_less_background"
    return round(a[key] / b[key], 2) if a.get(key) and b.get(key) else None


def ratios(paths: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each other path against drums: how many times longer / more CPU / fewer episodes."""
    ref = paths["drums"]
    out: dict[str, dict[str, float | None]] = {}

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    for name, p in paths.items():
        if name == "drums":
            continue
        out[name] = {
            "create_p50": ratio(p["create_s"]["p50"], ref["create_s"]["p50"]),
            "task_reset_p50": ratio(
                p.get("task_reset_s", {}).get("p50"), ref.get("task_reset_s", {}).get("p50")
            ),
            "verify_p50": ratio(
                p.get("verify_s", {}).get("p50"), ref.get("verify_s", {}).get("p50")
            ),
            "cpu_per_episode": cpu_ratio(p, ref),
            "cpu_bound_episodes_per_hour (drums / this)": ratio(
                ref["cpu_bound_episodes_per_hour"], p["cpu_bound_episodes_per_hour"]
            ),
        }
        if "valid_episodes_per_hour" in p:
            out[name]["valid_episodes_per_hour (drums / this)"] = ratio(
                ref["valid_episodes_per_hour"], p["valid_episodes_per_hour"]
            )
    return out


def render_table(res: dict[str, Any]) -> str:
    paths = res["paths"]
    names = list(paths)
    rows: list[tuple[str, list[str]]] = []

    def cell(p: dict[str, Any], key: str, stat: str, unit: str = "s", scale: float = 1.0) -> str:
        v = p.get(key, {}).get(stat) if isinstance(p.get(key), dict) else None
        if v is None:
            return "-"
        return f"{v * scale:.0f} ms" if unit == "ms" else f"{v:.3f} s"

    for label, key, stat, unit in (
        ("create on a task -> ready p50", "create_s", "p50", "s"),
        ("create on a task -> ready p99", "create_s", "p99", "s"),
        ("task reset p50", "task_reset_s", "p50", "s"),
        ("task reset p99", "task_reset_s", "p99", "s"),
        ("step + screenshot p50", "step_screenshot_s", "p50", "ms"),
        ("step + screenshot p99", "step_screenshot_s", "p99", "ms"),
        ("verify p50", "verify_s", "p50", "s"),
        ("verify p99", "verify_s", "p99", "s"),
        ("episode wall p50", "episode_wall_s", "p50", "s"),
    ):
        rows.append((label, [cell(paths[n], key, stat, unit, 1000.0) for n in names]))
    for label, key in (
        ("CPU-s / episode (host, less bg)", "host_less_background"),
        ("CPU-s / episode (own account)", "own"),
    ):
        vals = [paths[n]["cpu_per_episode_s"].get(key) for n in names]
        rows.append((label, ["-" if v is None else f"{v:.2f}" for v in vals]))
    phase_rows = [("episode", "CPU-s by phase p50, 1 at a time")]
    phase_rows += [(p, f"  {p.replace('_', ' ')}") for p in PHASES]
    if any(paths[n].get("cpu_by_phase_s") for n in names):
        for phase, label in phase_rows:
            vals = [paths[n].get("cpu_by_phase_s", {}).get(phase, {}).get("p50") for n in names]
            rows.append((label, ["-" if v is None else f"{v:.3f}" for v in vals]))
    rows.append(
        (
            "valid episodes / hour (measured)",
            [str(paths[n].get("valid_episodes_per_hour", "-")) for n in names],
        )
    )
    rows.append(
        (
            "valid episodes / hour (CPU bound)",
            [str(paths[n].get("cpu_bound_episodes_per_hour", "-")) for n in names],
        )
    )
    rows.append(
        (
            "valid / run",
            [
                f"{paths[n]['valid_episodes']}/{len(paths[n]['episodes'])}"
                if "episodes" in paths[n]
                else "-"
                for n in names
            ],
        )
    )
    w = max(len(label) for label, _ in rows)
    cw = max(14, *(len(n) for n in names))
    head = f"{'':<{w}}" + "".join(f"  {n:>{cw}}" for n in names)
    lines = [head, "-" * len(head)]
    lines += [f"{label:<{w}}" + "".join(f"  {c:>{cw}}" for c in cells) for label, cells in rows]
    lines.append("")
    for n in names:
        phase = paths[n].get("episodes_phase")
        if phase:
            note = " (saturated: no host figure)" if paths[n].get("host_saturated") else ""
            state = f", state_dir on {paths[n]['state_fs']}" if paths[n].get("state_fs") else ""
            lines.append(
                f"{n}: host busy {phase['background_cpu_per_s']:.2f} CPU/s before the episodes"
                f"{note}, load average after {phase['loadavg_end'][0]:.1f}{state}"
            )
    lines.append("ratios against drums (x times drums):")
    for name, rs in res["ratios"].items():
        lines.append(
            f"  {name}: " + ", ".join(f"{k} {'-' if v is None else v}" for k, v in rs.items())
        )
    return "\n".join(lines)
