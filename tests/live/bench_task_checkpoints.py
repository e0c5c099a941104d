"""Task env reset and create-on-a-task with a hot task checkpoint, against replayed setup, in
one run on one real daemon (`office` image).

For each task, two variants go through the same daemon one after the other:
- cached: the task as written; its first create replays the setup and captures the task
  checkpoint, a first reset restores it (which turns on its warm spares), then the timed rounds;
- replayed: the same task with `"drums": {"cache_setup": false}`: its setup steps run every
  episode (today's path, and what a daemon with task_checkpoints.enabled=false does).
and, as the floor both compare with, a bare desktop of the same image (no task): its reset and
create are the restore path alone (spare claim, start gates), which task checkpoints cannot
beat. Timed through the SDK, as a trainer calls it: `env.reset()` on one env, N times, and
`client.create(task=...)` N times (each env destroyed after, not timed). Between rounds the
bench waits `--pause` seconds, the agent's episode, during which the spare pool refills.

Prints a table (p50 / p99, replayed over cached) and writes JSON. Usage (root, DRUMS_LIVE=1):
    .venv/bin/python tests/live/bench_task_checkpoints.py [--rounds 20] [--pause 1.0]
        [--task examples/tasks/calc.json ...] [--out docs/bench/task-checkpoints.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import drums
from live_daemon import start_live_daemon, stop_and_clean

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TASKS = [REPO / "examples/tasks/calc.json", REPO / "examples/tasks/files.json"]


def pct(samples: list[float], q: float) -> float:
    """Nearest rank: the smallest sample with at least q of the samples at or below it."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50": statistics.median(samples),
        "p99": pct(samples, 0.99),
        "mean": statistics.fmean(samples),
        "max": max(samples),
    }


def wait_spare(client: Any, checkpoint: str, limit_s: float = 60.0) -> float:
    """Seconds until the checkpoint's pool has a parked spare (or the limit)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        pools = client.health().model_dump().get("pools") or {}
        size = (pools.get("spares") or {}).get("checkpoints", {}).get(checkpoint, {}).get("size")
        if size:
            return time.monotonic() - t0
        time.sleep(0.2)
    return limit_s


def run_variant(
    client: Any, task: dict[str, Any] | None, rounds: int, pause: float, want: str | None
) -> dict[str, Any]:
    resets: list[float] = []
    creates: list[float] = []
    setups: set[str | None] = set()
    source: dict[str, Any] = {"task": task} if task is not None else {"image": "office"}
    with client.create(**source) as env:  # the first: replays (and captures when cached)
        first_setup = env.slot.task_setup
        env.reset()  # a cached variant's first restore: its spares start here
        checkpoint = env.slot.checkpoint
        spare_wait = wait_spare(client, checkpoint) if want == "cached" else None
        for _ in range(rounds):
            time.sleep(pause)
            t0 = time.monotonic()
            slot = env.reset()
            resets.append(time.monotonic() - t0)
            setups.add(slot.task_setup)
    for _ in range(rounds):
        time.sleep(pause)
        t0 = time.monotonic()
        env = client.create(**source)
        creates.append(time.monotonic() - t0)
        setups.add(env.slot.task_setup)
        env.close()
    assert setups == {want}, f"episodes were {setups}, not all {want}"
    return {
        "first_create_setup": first_setup,
        "checkpoint": checkpoint,
        "spare_ready_after_s": spare_wait,
        "reset_s": resets,
        "create_s": creates,
        "reset": summary(resets),
        "create": summary(creates),
    }


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--rounds", type=int, default=20)
    args.add_argument("--pause", type=float, default=1.0)
    args.add_argument("--task", action="append", type=Path)
    args.add_argument("--out", default="docs/bench/task-checkpoints.json")
    opts = args.parse_args()
    paths = opts.task or DEFAULT_TASKS
    root = Path(tempfile.mkdtemp(prefix="drums-tkbench-"))
    daemon = start_live_daemon(root, image="office")
    results: dict[str, Any] = {}
    try:
        with drums.connect(daemon.url, token=daemon.token) as client:
            results["bare"] = {
                "task": None,
                "bare": run_variant(client, None, opts.rounds, opts.pause, None),
            }
            for path in paths:
                task = json.loads(path.read_text())
                never = copy.deepcopy(task)
                never.setdefault("drums", {})["cache_setup"] = False
                cached = run_variant(client, task, opts.rounds, opts.pause, "cached")
                replayed = run_variant(client, never, opts.rounds, opts.pause, "replayed")
                results[path.name] = {"task": task["id"], "cached": cached, "replayed": replayed}
            metrics = client.metrics().model_dump(mode="json")
            assert client.list_envs() == [], "an env was left"
    finally:
        stop_and_clean(daemon, root / "state", root)
    print(
        f"{'task / figure (same run)':<40}{'cached p50':>11}{'p99':>8}"
        f"{'replayed p50':>14}{'p99':>8}{'ratio p50':>11}"
    )
    for what in ("reset", "create"):
        b = results["bare"]["bare"][what]
        print(f"{'bare desktop (no task) ' + what:<40}{b['p50']:>11.3f}{b['p99']:>8.3f}")
    for name, r in results.items():
        if name == "bare":
            continue
        for what in ("reset", "create"):
            c, p = r["cached"][what], r["replayed"][what]
            r[f"ratio_{what}_p50"] = p["p50"] / c["p50"]
            r[f"ratio_{what}_p99"] = p["p99"] / c["p99"]
            print(
                f"{name + ' ' + what:<40}{c['p50']:>11.3f}{c['p99']:>8.3f}"
                f"{p['p50']:>14.3f}{p['p99']:>8.3f}{r[f'ratio_{what}_p50']:>11.1f}"
            )
    out = {
        "rounds": opts.rounds,
        "pause_s": opts.pause,
        "targets": {"reset_p50_s": 0.05, "reset_p99_s": 0.15, "create_hot_p50_s": 0.1},
        "tasks": results,
        "daemon_metrics": metrics,
    }
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
