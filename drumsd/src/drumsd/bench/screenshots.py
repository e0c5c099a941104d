"""`drumsd bench --screenshots`: screenshot and step + screenshot cost, the path before issue 35
(Pillow's GetImage, a full resize and Pillow's encoders on every grab) against the new one
(Xvfb's framebuffer read in place, changed bands only, the banded PNG), on one real restored
desktop, in the same run.

Three kinds of step: `move` (the pointer moves; Xvfb's framebuffer, which screenshots read, does
not change), `type` (a character typed into the desktop's xterm, then erased: every step changes
one or two rows of text) and `page` (a double click on the xterm's title bar maximizes it, the next
one restores it: every step redraws most of the screen). For each, every variant runs the same
number of steps, interleaved round by round so load on the host falls on all of them alike:
  step only        the step without a screenshot: what every variant pays before its image
  plain            the path before: full-size PNG, Pillow's grab and encoder (`fresh`)
  png              full-size PNG, the new path (framebuffer, bands, change cache)
  png 1280         PNG scaled to 1280x720
  jpeg 1280 old    JPEG q80 at 1280x720, the path before (`fresh`)
  jpeg 1280        JPEG q80 at 1280x720, the new path
  jpeg 1280x800    JPEG q80 at 1280x800 (a model's screen size; issue 33's ratio)
  webp 1280        WebP q80 at 1280x720
  ... 1trip        the same, the screenshot taken in the step's own round trip (as the daemon does)
Per variant: wall p50/p99 of step + screenshot and of the screenshot alone, CPU per step (the
slot's processes plus this process, the client) and that CPU by process, the screenshot's own
CPU (the variant's less `step only`'s), image bytes, cache hits. Ratios are against `plain`, for
a variant with a `... old` twin against the twin, and issue 33's: `jpeg 1280x800` against `png`,
the full-size PNG of the same step kind in the same run (both on the new path).
"""

from __future__ import annotations

import os
import random
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from drumsd.bench.common import (
    BENCH_LIMITS,
    CACHE_ROOT,
    CRIU,
    Progress,
    bench_runtime,
    percentile,
    publish,
    stderr_progress,
)
from drumsd.core.seams import SlotHandle
from drumsd.guest.protocol import PNG_FULL, ShotSpec

# name: (spec (None: no screenshot), fresh (encode even an unchanged screen), one trip (the shot
# rides on the step))
JPEG_1280 = ShotSpec("jpeg", 80, 1280, 720)
STEP_ONLY = "step only"
VARIANTS: dict[str, tuple[ShotSpec | None, bool, bool]] = {
    STEP_ONLY: (None, False, False),
    "plain": (PNG_FULL, True, False),
    "png": (PNG_FULL, False, False),
    "png 1trip": (PNG_FULL, False, True),
    "png 1280": (ShotSpec("png", None, 1280, 720), False, False),
    "jpeg 1280 old": (JPEG_1280, True, False),
    "jpeg 1280": (JPEG_1280, False, False),
    "jpeg 1trip": (JPEG_1280, False, True),
    "jpeg 1280x800": (ShotSpec("jpeg", 80, 1280, 800), False, False),
    "webp 1280": (ShotSpec("webp", 80, 1280, 720), False, False),
}
TWINS = {
    "png": "plain",
    "png 1trip": "plain",
    "jpeg 1280": "jpeg 1280 old",
    "jpeg 1trip": "jpeg 1280 old",
}
TARGET_P50_S = 0.025
TARGET_P99_S = 0.080
# Issue 35, for a step that changes the screen (`type`): full PNG p50 <= 15 ms and <= 10 ms CPU,
# JPEG at 1280 <= 6 ms CPU; issue 33: JPEG at 1280x800 <= half the full-size PNG's CPU, the PNG
# being the new path's (`png`) on the same kind of step in the same run.
CHANGED_PNG_P50_S = 0.015
CHANGED_PNG_CPU_S = 0.010
CHANGED_JPEG_CPU_S = 0.006
JPEG_VS_PNG_CPU = 0.5
KINDS = ("move", "type", "page")
# The xterm's title bar as desktop-init places it (openbox, 1920x1080) and once maximized: a double
# click on it toggles the maximization, so each `page` step redraws most of the screen.
TITLE_RESTORED = (490, 48)
TITLE_MAXIMIZED = (960, 8)
SETTLE_S = 0.03  # after each step, before the slot's CPU is read


@dataclass(frozen=True)
class ShotBenchOptions:
    image: str = "office"
    cache_root: Path = CACHE_ROOT
    state_dir: Path = Path("/run/drums-bench")
    criu: Path = CRIU
    profile: str = "hardened"
    steps: int = 40
    out: Path = Path("bench-screenshots.json")


def slot_cpu_s(handle: SlotHandle) -> float:
    """CPU the slot's live processes used so far: cgroup v2's cpu.stat when there is one, else
    the sum of `slot_cpu_by_process`."""
    d = Path(handle.cgroups.get("cpu") or handle.cgroups["memory"])
    stat = d / "cpu.stat"
    if stat.exists():
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value) / 1e6
    return sum(slot_cpu_by_process(handle).values())


def slot_cpu_by_process(handle: SlotHandle) -> dict[str, float]:
    """CPU (s) the slot's live processes used so far, by process name (comm: the guest agent is
    `desktop-init`'s fork, the action worker `python3`): the run time of each thread of each
    member process (/proc/PID/task/TID/schedstat, ns; threads gone by now are not counted)."""
    d = Path(handle.cgroups.get("cpu") or handle.cgroups["memory"])
    by_name: dict[str, int] = {}
    for pid in (d / "cgroup.procs").read_text().split():
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            for task in os.scandir(f"/proc/{pid}/task"):
                with open(f"{task.path}/schedstat") as f:
                    by_name[name] = by_name.get(name, 0) + int(f.read().split()[0])
        except OSError:
            continue  # exited while we looked
    return {name: ns / 1e9 for name, ns in by_name.items()}


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 4),
        "p99": round(percentile(values, 99), 4),
        "n": len(values),
    }


async def run_screenshot_bench(
    opts: ShotBenchOptions, progress: Progress = print
) -> dict[str, Any]:
    from drumsd.linux.image import find_image
    from drumsd.runtime.linux import LinuxRuntimeConfig

    image = find_image(opts.image, opts.cache_root)
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    cfg = LinuxRuntimeConfig(
        state_dir=opts.state_dir, criu=opts.criu, profile=opts.profile, ksm=False
    )
    ck_dir = opts.state_dir / "checkpoints" / f"bench-shots-{uuid.uuid4().hex[:6]}"
    results: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "image": {"profile": image.profile, "sha256": image.sha256},
        "steps_per_variant": opts.steps,
        "variants": {
            name: {"spec": spec.to_request() if spec else None, "fresh": f, "one_trip": one}
            for name, (spec, f, one) in VARIANTS.items()
        },
    }
    async with bench_runtime(cfg) as rt:
        progress(f"template of {image.profile} (cold boot, quiesce, dump) ...")
        ref = await rt.make_template(image.root, image.sha256, "bench", ck_dir / "template")
        h = await rt.restore("bench-shots", ref, BENCH_LIMITS)
        try:
            for kind in KINDS:
                progress(f"{kind}: {opts.steps} rounds of {len(VARIANTS)} variants ...")
                results[kind] = await _measure(rt, h, kind, opts.steps)
        finally:
            await rt.destroy(h.slot_id)
    shutil.rmtree(ck_dir, ignore_errors=True)
    results["host"]["loadavg_end"] = os.getloadavg()
    for kind in KINDS:
        _ratios(results[kind])
    results["targets"] = {
        f"{kind} {name}": {
            "p50<=0.025": row["step_screenshot_s"]["p50"] <= TARGET_P50_S,
            "p99<=0.080": row["step_screenshot_s"]["p99"] <= TARGET_P99_S,
        }
        for kind in KINDS
        for name, row in results[kind].items()
    }
    typed = results["type"]
    results["targets_issue35"] = {
        "type png: step+shot p50 <= 15 ms": typed["png"]["step_screenshot_s"]["p50"]
        <= CHANGED_PNG_P50_S,
        "type png: CPU <= 10 ms": typed["png"]["cpu_per_step_s"] <= CHANGED_PNG_CPU_S,
        "type jpeg 1280: CPU <= 6 ms": typed["jpeg 1280"]["cpu_per_step_s"] <= CHANGED_JPEG_CPU_S,
        **{
            f"{kind} jpeg 1280x800 CPU <= 0.5x png (issue 33)": results[kind]["jpeg 1280x800"][
                "cpu_vs_png"
            ]
            <= JPEG_VS_PNG_CPU
            for kind in ("type", "page")
        },
    }
    return results


def _ratios(rows: dict[str, Any]) -> None:
    """Each row's ratios against `plain`, its `... old` twin, `png` (CPU) and its screenshot's own
    CPU: the row's less the same kind's `step only`."""
    plain, png, step = rows["plain"], rows["png"], rows[STEP_ONLY]
    for row in rows.values():
        row["ratio_p50_vs_plain"] = round(
            plain["step_screenshot_s"]["p50"] / row["step_screenshot_s"]["p50"], 2
        )
        row["ratio_cpu_vs_plain"] = round(
            plain["cpu_per_step_s"] / max(row["cpu_per_step_s"], 1e-6), 2
        )
        row["cpu_vs_png"] = round(row["cpu_per_step_s"] / max(png["cpu_per_step_s"], 1e-6), 2)
        row["shot_cpu_s"] = round(row["cpu_per_step_s"] - step["cpu_per_step_s"], 4)
    for name, twin in TWINS.items():
        row, old = rows[name], rows[twin]
        row["vs_old"] = {
            "old": twin,
            "p50": round(old["step_screenshot_s"]["p50"] / row["step_screenshot_s"]["p50"], 2),
            "cpu": round(old["cpu_per_step_s"] / max(row["cpu_per_step_s"], 1e-6), 2),
        }


def _action(kind: str, i: int) -> dict[str, Any]:
    if kind == "move":
        return {"type": "move", "x": random.randrange(200, 1700), "y": random.randrange(200, 900)}
    if kind == "type":  # a character, then its erasure: the screen changes on every step
        return (
            {"type": "type", "text": "x"} if i % 2 == 0 else {"type": "key", "keys": ["backspace"]}
        )
    x, y = TITLE_RESTORED if i % 2 == 0 else TITLE_MAXIMIZED  # maximize, then restore
    return {"type": "double_click", "x": x, "y": y}


async def _measure(rt: Any, h: SlotHandle, kind: str, steps: int) -> dict[str, Any]:
    rows: dict[str, dict[str, list[float]]] = {
        name: {
            k: [] for k in ("wall", "shot", "cpu", "bytes", "cached", "guest_grab", "guest_encode")
        }
        for name in VARIANTS
    }
    by_process: dict[str, dict[str, float]] = {name: {} for name in VARIANTS}
    names = list(VARIANTS)
    n = 0
    for _ in range(steps):
        random.shuffle(names)  # no variant always runs right after another
        for name in names:
            spec, fresh, one_trip = VARIANTS[name]
            action = _action(kind, n)
            n += 1
            procs0 = slot_cpu_by_process(h)
            cpu0 = slot_cpu_s(h)
            own0 = time.process_time()
            t0 = time.monotonic()
            shot = None
            if spec is None:
                await rt.step(h, action)
                t1 = t2 = time.monotonic()
            elif one_trip:
                outcome = await rt.step(h, action, spec)
                t2 = time.monotonic()
                shot = outcome.screenshot
                assert shot is not None
                t1 = t2 - shot.grab_s - shot.encode_s  # the shot's part: its time in the guest
            else:
                await rt.step(h, action)
                t1 = time.monotonic()
                shot = await rt.grab(h, spec, fresh=fresh)
                t2 = time.monotonic()
            own = time.process_time() - own0
            # The desktop's redraw may still be running: the slot's CPU is read once it settled,
            # so each step is charged with all the work it caused.
            await trio.sleep(SETTLE_S)
            cpu = slot_cpu_s(h) - cpu0 + own
            procs = by_process[name]
            for proc, used in slot_cpu_by_process(h).items():
                procs[proc] = procs.get(proc, 0.0) + used - procs0.get(proc, 0.0)
            procs["client (this process)"] = procs.get("client (this process)", 0.0) + own
            row = rows[name]
            row["wall"].append(t2 - t0)
            row["shot"].append(t2 - t1)
            row["cpu"].append(cpu)
            if shot is not None:
                row["guest_grab"].append(shot.grab_s)
                row["guest_encode"].append(shot.encode_s)
                row["bytes"].append(len(shot.data))
                row["cached"].append(float(shot.cached))
    out: dict[str, Any] = {}
    for name, row in rows.items():
        out[name] = {
            "step_screenshot_s": summary(row["wall"]),
            "screenshot_s": summary(row["shot"]),
            "cpu_per_step_s": round(sum(row["cpu"]) / len(row["cpu"]), 4),
            "cpu_per_step_by_process_s": {
                proc: round(used / steps, 5)
                for proc, used in sorted(by_process[name].items(), key=lambda kv: -kv[1])
                if used / steps >= 1e-5
            },
            "bytes_p50": int(percentile(row["bytes"], 50)) if row["bytes"] else 0,
            "cache_hits": int(sum(row["cached"])),
            "guest_grab_s_p50": round(percentile(row["guest_grab"], 50), 4)
            if row["guest_grab"]
            else 0.0,
            "guest_encode_s_p50": round(percentile(row["guest_encode"], 50), 4)
            if row["guest_encode"]
            else 0.0,
        }
    return out


def render_screenshot_table(r: dict[str, Any]) -> str:
    head = (
        f"{'step':<6}{'variant':<15}{'step+shot p50':>14}{'p99':>8}{'shot p50':>10}{'p99':>8}"
        f"{'CPU/step':>10}{'shot CPU':>10}{'x png':>7}{'KiB':>6}{'hits':>6}{'x plain':>9}"
        f"{'grab':>7}{'encode':>8}"
    )
    lines = [head, "-" * len(head)]
    for kind in KINDS:
        for name, row in r[kind].items():
            s, g = row["step_screenshot_s"], row["screenshot_s"]
            cpu_ms, kib = row["cpu_per_step_s"] * 1e3, row["bytes_p50"] / 1024
            lines.append(
                f"{kind:<6}{name:<15}{s['p50'] * 1e3:>12.1f}ms{s['p99'] * 1e3:>6.0f}ms"
                f"{g['p50'] * 1e3:>8.1f}ms{g['p99'] * 1e3:>6.0f}ms{cpu_ms:>8.1f}ms"
                f"{row['shot_cpu_s'] * 1e3:>8.1f}ms{row['cpu_vs_png']:>6.2f}x"
                f"{kib:>6.0f}{row['cache_hits']:>6}{row['ratio_p50_vs_plain']:>8.2f}x"
                f"{row['guest_grab_s_p50'] * 1e3:>5.1f}ms{row['guest_encode_s_p50'] * 1e3:>6.1f}ms"
            )
    lines.append("CPU per step by process (ms; agent = desktop-init, worker = python3):")
    for kind in KINDS:
        for name in (STEP_ONLY, "png", "jpeg 1280x800"):
            procs = r[kind][name]["cpu_per_step_by_process_s"]
            parts = ", ".join(f"{proc} {used * 1e3:.2f}" for proc, used in procs.items())
            lines.append(f"  {kind} {name}: {parts}")
    for kind in KINDS:
        for name, row in r[kind].items():
            if "vs_old" in row:
                v = row["vs_old"]
                lines.append(
                    f"{kind} {name} vs {v['old']}: {v['p50']:.2f}x faster p50, "
                    f"{v['cpu']:.2f}x less CPU"
                )
    p50, p99 = TARGET_P50_S * 1e3, TARGET_P99_S * 1e3
    lines.append(f"targets: step + screenshot p50 <= {p50:.0f} ms, p99 <= {p99:.0f} ms")
    for name, ok in r.get("targets_issue35", {}).items():
        lines.append(f"  {name}: {'met' if ok else 'MISSED'}")
    return "\n".join(lines)


def main_screenshot_bench(opts: ShotBenchOptions) -> int:
    results = trio.run(run_screenshot_bench, opts, stderr_progress)
    publish(results, render_screenshot_table(results), opts.out)
    return 0
