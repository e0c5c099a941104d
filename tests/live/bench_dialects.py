"""Dialect steps on one real desktop, in one run (issue 33's two measures):

1. batch: a step of 10 OpenAI actions (one request, one screenshot after) against a step of one
   action, and against 10 one-action steps; wall time per step, p50 / p90;
2. screenshot: step + screenshot with a full-size PNG (1920x1080, the default) against a 1280x800
   JPEG (the model's size), the screen changed before every step (a key typed into the xterm) so
   every image is encoded; CPU per step = the slot's cgroup (guest: input, grab, encode) + the
   daemon process + this client (decode of the response), and wall time.

Prints a table and writes JSON. Usage (root, DRUMS_LIVE=1):
    .venv/bin/python tests/live/bench_dialects.py [--rounds 30] [--out docs/bench/dialects.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import drums
from live_daemon import start_live_daemon, stop_and_clean

MODEL = (1280, 800)
TEN = [{"type": "move", "x": 100 + 40 * i, "y": 500} for i in range(9)] + [
    {"type": "keypress", "keys": ["SHIFT"]}
]


CGROUPS = Path("/sys/fs/cgroup/cpu")  # v1 here (no cpuacct per slot): sum the processes' CPU


def daemon_groups(before: set[Path]) -> list[Path]:
    return [p for p in CGROUPS.glob("drums-*") if p not in before]


def process_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(groups: list[Path], daemon_pid: int) -> float:
    """The daemon's slots' processes (Xvfb, the guest agent and worker...), the daemon, and this
    client (decoding the response)."""
    pids = {
        int(pid)
        for group in groups
        for procs in group.rglob("cgroup.procs")
        for pid in procs.read_text().split()
    }
    return sum(process_cpu_s(p) for p in pids | {daemon_pid}) + time.process_time()


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def timed(rounds: int, one: Callable[[int], Any]) -> list[float]:
    out = []
    for i in range(rounds):
        t0 = time.perf_counter()
        one(i)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="drums-bench-dialects-"))
    before = set(CGROUPS.glob("drums-*"))
    daemon = start_live_daemon(root)
    report: dict[str, Any] = {"rounds": args.rounds, "model_screen": list(MODEL)}
    try:
        with drums.connect(daemon.url, token=daemon.token) as client, client.create() as env:
            shot = {"format": "jpeg", "quality": 80}

            def step(calls: list[dict]) -> Any:
                return env.step(calls, dialect="openai", screen=MODEL, screenshot=shot)

            step(TEN)  # warm: worker, keyboard, encoder
            # Interleaved, so load from the host's other work falls on both alike.
            one: list[float] = []
            batch: list[float] = []
            for _ in range(args.rounds):
                one += timed(1, lambda i: step(TEN[:1]))
                batch += timed(1, lambda i: step(TEN))

            def ten_steps(i: int) -> None:
                for call in TEN:
                    step([call])

            separate = timed(max(3, args.rounds // 3), ten_steps)
            report["batch"] = {
                name: {"p50_s": round(pct(v, 0.5), 4), "p90_s": round(pct(v, 0.9), 4), "n": len(v)}
                for name, v in (("one_action", one), ("batch_of_10", batch),
                                ("ten_single_steps", separate))
            }  # fmt: skip
            report["batch"]["ratio_batch_over_one_p50"] = round(pct(batch, 0.5) / pct(one, 0.5), 2)

            # Screenshots: the xterm gets a key each step, so the screen differs every time.
            env.step({"type": "click", "x": 300, "y": 200})
            cgroup = daemon_groups(before)
            assert cgroup, f"no new drums-* cgroup under {CGROUPS}"
            assert daemon.proc is not None
            shots: dict[str, Any] = {}
            for name, options in (
                ("png_full", True),
                ("jpeg_1280x800", {"format": "jpeg", "quality": 80, "width": 1280, "height": 800}),
            ):
                press = {"type": "type", "text": "x"}
                env.step(press, screenshot=options)
                cpu0, walls, cached = cpu_s(cgroup, daemon.proc.pid), [], 0
                for _ in range(args.rounds):
                    time.sleep(0.05)  # the xterm repaints the last key: the frame is new
                    t0 = time.perf_counter()
                    result = env.step(press, screenshot=options)
                    data = result.screenshot_bytes()
                    walls.append(time.perf_counter() - t0)
                    assert data
                    cached += bool(result.screenshot_cached)
                cpu = (cpu_s(cgroup, daemon.proc.pid) - cpu0) / args.rounds
                shots[name] = {
                    "cpu_per_step_s": round(cpu, 4),
                    "wall_p50_s": round(pct(walls, 0.5), 4),
                    "bytes": len(data),
                    "cached": cached,
                    "size": [result.screenshot_width, result.screenshot_height],
                }
            shots["ratio_jpeg_over_png_cpu"] = round(
                shots["jpeg_1280x800"]["cpu_per_step_s"] / shots["png_full"]["cpu_per_step_s"], 2
            )
            report["screenshot"] = shots
    finally:
        stop_and_clean(daemon, root)

    b, s = report["batch"], report["screenshot"]
    print(f"{'batch (openai, jpeg 1280x800 after)':<40} {'p50 s':>8} {'p90 s':>8}")
    for name in ("one_action", "batch_of_10", "ten_single_steps"):
        print(f"{name:<40} {b[name]['p50_s']:>8.4f} {b[name]['p90_s']:>8.4f}")
    print(f"batch of 10 / one action (p50): {b['ratio_batch_over_one_p50']}")
    print(f"\n{'step + screenshot':<40} {'CPU s':>8} {'wall s':>8} {'bytes':>9}")
    for name in ("png_full", "jpeg_1280x800"):
        r = s[name]
        print(f"{name:<40} {r['cpu_per_step_s']:>8.4f} {r['wall_p50_s']:>8.4f} {r['bytes']:>9}")
    print(f"jpeg 1280x800 / full png CPU: {s['ratio_jpeg_over_png_cpu']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
