"""`drumsd bench episodes --profile`: what the slow steps of a level waited behind. Pure.

Inputs: the level's episode records (run_episode's, with their monotonic times: each step's
start, its wall and the daemon's own time for it, and the other phases' intervals) and the
sampler's samples (episodes_sampler: every ~0.1 s the CPU each kind of process used since the
sample before, and what was in flight then: CRIU restores and dumps, desktops in their first
seconds after a restore or a thaw). For each step: the other episodes' phases it overlapped,
what was in flight, the CPU each kind of process used over its window, and the split of its
wall into the daemon's part (the handler: guest round trip, the action, grab and encode) and the
rest (the client, HTTP, the daemon's event loop before the handler, the slot's lock). Then the
slow steps (over a threshold, 300 ms by default, the knee's) against all steps of the level.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SLOW_STEP_S = 0.300
# The other episodes' phases a step can overlap, as run_episode records them in rec["ops"].
OP_KINDS = ("create", "gates_wait", "verify", "destroy")
TOP_SLOW = 10


@dataclass(frozen=True)
class Sample:
    """What the sampler read at `t` (monotonic): CPU-seconds per kind of process since the
    sample before (`cpu`), and how many of each thing were in flight at `t` (`inflight`)."""

    t: float
    cpu: Mapping[str, float]
    inflight: Mapping[str, int] = field(default_factory=dict)
    # CPU-seconds per "<kind>: <command>" since the sample before (the processes the sampler saw)
    commands: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    """One step: its episode, index, start (monotonic), wall and the daemon's time for it."""

    episode: int
    index: int
    start: float
    wall_s: float
    daemon_s: float | None

    @property
    def end(self) -> float:
        return self.start + self.wall_s


def step_windows(episodes: Sequence[Mapping[str, Any]]) -> list[Window]:
    """Every step of the level's episodes that recorded its start (run_episode's steps_at)."""
    out = []
    for e, rec in enumerate(episodes):
        starts = rec.get("steps_at") or []
        daemon = rec.get("steps_daemon_s") or []
        for i, (start, wall) in enumerate(zip(starts, rec.get("steps_s") or [], strict=False)):
            out.append(Window(e, i, start, wall, daemon[i] if i < len(daemon) else None))
    return out


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def cpu_in(
    samples: Sequence[Sample], start: float, end: float, by_command: bool = False
) -> dict[str, float]:
    """CPU-seconds per kind of process (or per "<kind>: <command>" with by_command) over
    [start, end]: each sample's interval (from the sample before) counted in proportion to its
    overlap with the window."""
    out: dict[str, float] = {}
    for prev, cur in itertools.pairwise(samples):
        span = cur.t - prev.t
        part = overlap(prev.t, cur.t, start, end)
        if span <= 0 or part <= 0:
            continue
        for kind, cpu in (cur.commands if by_command else cur.cpu).items():
            out[kind] = out.get(kind, 0.0) + cpu * part / span
    return out


def inflight_in(samples: Sequence[Sample], start: float, end: float) -> dict[str, int]:
    """The most of each thing in flight at any sample within the window, or at the first
    sample after it when none fell inside (a short window between two samples)."""
    inside = [s for s in samples if start <= s.t <= end]
    if not inside:
        inside = [s for s in samples if s.t > end][:1]
    out: dict[str, int] = {}
    for s in inside:
        for kind, n in s.inflight.items():
            if n > 0:
                out[kind] = max(out.get(kind, 0), n)
    return out


def ops_during(
    episodes: Sequence[Mapping[str, Any]], w: Window, kinds: Iterable[str] = OP_KINDS
) -> dict[str, int]:
    """How many of the other episodes were in each phase at some point of the step's window."""
    wanted = set(kinds)
    out: dict[str, int] = {}
    for e, rec in enumerate(episodes):
        if e == w.episode:
            continue
        for kind, start, end in rec.get("ops") or []:
            if kind in wanted and overlap(start, end, w.start, w.end) > 0:
                out[kind] = out.get(kind, 0) + 1
    return out


def first_wave_end(episodes: Sequence[Mapping[str, Any]]) -> float | None:
    """When the level's first episode ended (its destroy's end): the steps before it ran while
    the level's first creates, all started at once, were still settling."""
    ends = [op[2] for rec in episodes for op in rec.get("ops") or [] if op[0] == "destroy"]
    return min(ends) if ends else None


def level_start(episodes: Sequence[Mapping[str, Any]]) -> float | None:
    starts = [op[1] for rec in episodes for op in rec.get("ops") or [] if op[0] == "create"]
    return min(starts) if starts else None


def step_profile(
    episodes: Sequence[Mapping[str, Any]],
    samples: Sequence[Sample],
    w: Window,
    t0: float | None = None,
    wave_end: float | None = None,
) -> dict[str, Any]:
    """One step's window: its wall split, when it started in the level (`at_s`, from `t0`) and
    whether in the first wave (before `wave_end`), the other episodes' phases it overlapped,
    what was in flight, CPU per kind of process (CPU-seconds over the window)."""
    cpu = cpu_in(samples, w.start, w.end)
    return {
        "episode": w.episode,
        "step": w.index,
        "at_s": None if t0 is None else round(w.start - t0, 3),
        "first_wave": wave_end is not None and w.start < wave_end,
        "wall_s": round(w.wall_s, 4),
        "daemon_s": None if w.daemon_s is None else round(w.daemon_s, 4),
        "outside_daemon_s": None if w.daemon_s is None else round(w.wall_s - w.daemon_s, 4),
        "others_in": ops_during(episodes, w),
        "inflight": inflight_in(samples, w.start, w.end),
        "cpu_s": {k: round(v, 4) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
    }


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def group_summary(profiles: Sequence[Mapping[str, Any]], kinds: Iterable[str]) -> dict[str, Any]:
    """Over a group of step profiles: the share that overlapped each other phase and each thing
    in flight, medians of the wall split, and the median CPU rate (CPU-s per second of window,
    i.e. cores busy) of each kind of process."""
    n = len(profiles)
    if not n:
        return {"n": 0}
    overlapped: dict[str, float] = {}
    for key in ("others_in", "inflight"):
        for kind in sorted({k for p in profiles for k in p[key]}):
            overlapped[kind] = round(sum(1 for p in profiles if p[key].get(kind)) / n, 3)
    rates = {
        kind: _median([p["cpu_s"].get(kind, 0.0) / p["wall_s"] for p in profiles if p["wall_s"]])
        for kind in kinds
    }
    daemon = [p["daemon_s"] for p in profiles if p["daemon_s"] is not None]
    first_steps = sum(1 for p in profiles if p["step"] == 0)
    outside = [p["outside_daemon_s"] for p in profiles if p["outside_daemon_s"] is not None]
    return {
        "n": n,
        "wall_s_p50": _median([p["wall_s"] for p in profiles]),
        "daemon_s_p50": _median(daemon),
        "outside_daemon_s_p50": _median(outside),
        "share_first_wave": round(sum(1 for p in profiles if p.get("first_wave")) / n, 3),
        "share_first_step": round(first_steps / n, 3),
        "share_overlapping": overlapped,
        "cores_busy_p50": {k: v for k, v in rates.items() if v},
    }


def _rounded(cpu: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 5e-4}


def level_cpu(
    episodes: Sequence[Mapping[str, Any]], samples: Sequence[Sample]
) -> dict[str, dict[str, Any]]:
    """Where the level's CPU went, per kind of process and per "<kind>: <command>", over the
    whole sampled level and split at the end of its first wave (the creates started at once):
    CPU-seconds and the wall of each part. Divide by the level's episodes for a per-episode
    account by role."""
    if len(samples) < 2:
        return {}
    start, end = samples[0].t, samples[-1].t
    wave = first_wave_end(episodes)
    parts = {"all": (start, end)}
    if wave is not None and start < wave < end:
        parts["first_wave"] = (start, wave)
        parts["rest"] = (wave, end)
    return {
        name: {
            "wall_s": round(b - a, 3),
            "by_kind_s": _rounded(cpu_in(samples, a, b)),
            "by_command_s": _rounded(cpu_in(samples, a, b, by_command=True)),
        }
        for name, (a, b) in parts.items()
    }


# What the sampler reads that is not the daemon's own account (its cpuacct group)
NOT_OWN = ("ksmd", "client", "host other", "psi cpu some")


def episode_cpu(episodes: Sequence[Mapping[str, Any]], samples: Sequence[Sample]) -> dict[str, Any]:
    """Each episode's CPU inside its own window (its create's start to its destroy's end), the
    way the one-at-a-time phase episodes count it: p50 and mean over the episodes of the own
    account's part (all kinds but NOT_OWN) and of each kind, and the share of the level's own
    CPU that fell in no episode's window (between episodes). Meant for one at a time: with
    several at once the windows overlap and count the same CPU more than once."""
    spans = []
    for rec in episodes:
        ops = rec.get("ops") or []
        if ops:
            spans.append((min(o[1] for o in ops), max(o[2] for o in ops)))
    if not spans or len(samples) < 2:
        return {"n": 0}
    per = [cpu_in(samples, a, b) for a, b in spans]
    own = [sum(v for k, v in c.items() if k not in NOT_OWN) for c in per]
    kinds = sorted({k for c in per for k in c})
    level = cpu_in(samples, samples[0].t, samples[-1].t)
    level_own = sum(v for k, v in level.items() if k not in NOT_OWN)
    inside = 0.0
    for a, b in _union(spans):
        inside += sum(v for k, v in cpu_in(samples, a, b).items() if k not in NOT_OWN)
    return {
        "n": len(per),
        "own_s": {"p50": _median(own), "mean": round(statistics.fmean(own), 4)},
        "own_s_each": [round(x, 3) for _, x in sorted(zip(spans, own, strict=True))],
        "by_kind_s_each": [
            _rounded(c) for _, c in sorted(zip(spans, per, strict=True), key=lambda sc: sc[0])
        ],
        "by_kind_s_p50": {k: _median([c.get(k, 0.0) for c in per]) for k in kinds},
        "by_kind_s_mean": {
            k: round(statistics.fmean(c.get(k, 0.0) for c in per), 4) for k in kinds
        },
        "level_own_s": round(level_own, 3),
        "level_own_outside_episodes_s": round(max(0.0, level_own - inside), 3),
    }


def _union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def profile_level(
    episodes: Sequence[Mapping[str, Any]],
    samples: Sequence[Sample],
    slow_s: float = SLOW_STEP_S,
    top: int = TOP_SLOW,
) -> dict[str, Any]:
    """The level's slow steps (wall > slow_s) against all its steps, the slowest `top` one
    by one, and where its CPU went (level_cpu)."""
    t0, wave = level_start(episodes), first_wave_end(episodes)
    profiles = [step_profile(episodes, samples, w, t0, wave) for w in step_windows(episodes)]
    kinds = sorted({k for s in samples for k in s.cpu})
    slow = [p for p in profiles if p["wall_s"] > slow_s]
    return {
        "slow_step_s": slow_s,
        "all_steps": group_summary(profiles, kinds),
        "slow_steps": group_summary(slow, kinds),
        "slowest": sorted(slow, key=lambda p: -p["wall_s"])[:top],
        "cpu": level_cpu(episodes, samples),
        "episode_cpu": episode_cpu(episodes, samples),
    }


def render_profile(concurrency: int, prof: Mapping[str, Any]) -> list[str]:
    """A few lines per level: slow steps against all, what they overlapped, who used the CPU."""
    slow, every = prof["slow_steps"], prof["all_steps"]
    lines = [
        f"  {concurrency} at a time: {slow['n']} of {every['n']} steps over "
        f"{prof['slow_step_s'] * 1e3:.0f} ms"
    ]
    if not slow["n"]:
        return lines
    lines.append(
        f"    wall p50 slow {slow['wall_s_p50']} s (daemon {slow['daemon_s_p50']}, outside "
        f"{slow['outside_daemon_s_p50']}) vs all {every['wall_s_p50']} s (daemon "
        f"{every['daemon_s_p50']}, outside {every['outside_daemon_s_p50']})"
    )
    lines.append(
        f"    an episode's first step (slow / all): {slow['share_first_step']:.0%}/"
        f"{every['share_first_step']:.0%}; in the level's first wave (before its first "
        f"episode ended): {slow['share_first_wave']:.0%}/{every['share_first_wave']:.0%}"
    )
    share = slow["share_overlapping"]
    base = every["share_overlapping"]
    lines.append(
        "    overlapping (slow / all): "
        + ", ".join(f"{k} {v:.0%}/{base.get(k, 0):.0%}" for k, v in share.items())
    )
    busy = slow["cores_busy_p50"]
    base_busy = every["cores_busy_p50"]
    top = sorted(busy.items(), key=lambda kv: -kv[1])[:8]
    lines.append(
        "    cores busy p50 (slow / all): "
        + ", ".join(f"{k} {v:.2f}/{base_busy.get(k, 0):.2f}" for k, v in top)
    )
    return lines
