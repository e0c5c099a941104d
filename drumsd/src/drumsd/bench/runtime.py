"""`drumsd bench`: how fast and how dense the Linux runtime is on this host, against a cold boot.

Measures, on real restored desktops: the cold boot a boot-per-episode system pays (the baseline),
create, reset p50/p99 (restore path, and through warm spares), branch of 4 and 8 (wall until every
child's agent answers), step + screenshot round trips, memory per idle slot without and with KSM,
and how many idle slots fit within the admission limits. Prints a table and writes JSON.
"""

# Small /proc and cgroup reads stay inline (microseconds).
# ruff: noqa: ASYNC110

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from drumsd.bench.common import (
    BENCH_LIMITS,
    CACHE_ROOT,
    CRIU,
    KSM_DIR,
    QUIET_WINDOW_S,
    BenchError,
    Progress,
    add_host_args,
    bench_dir_lock,
    bench_runtime,
    fork_breakdown,
    host_facts,
    ksm_saved_mib,
    meminfo_mib,
    progress_line,
    slot_anon_mib,
    state_on_tmpfs,
    stderr_progress,
    stopped_by_signals,
    summarize,
    was_interrupted,
)
from drumsd.bench.forks import ForkBenchOptions, main_fork_bench, parse_queues
from drumsd.bench.saves import SaveBenchOptions, main_save_bench
from drumsd.bench.screenshots import ShotBenchOptions, main_screenshot_bench
from drumsd.core.seams import SlotLimits


@dataclass(frozen=True)
class BenchOptions:
    image: str = "base"
    cache_root: Path = CACHE_ROOT
    state_dir: Path = Path("/run/drums-bench")
    criu: Path = CRIU
    profile: str = "hardened"
    apps: Sequence[str] = ()
    out: Path = Path("bench.json")
    resets: int = 50
    spare_resets: int = 30
    spare_interval_s: float = 0.5
    steps: int = 50
    cold_boots: int = 3
    branches: Sequence[int] = (4, 8)
    idle_slots: int = 8
    ksm_wait_s: float = 90.0
    limits: SlotLimits = BENCH_LIMITS
    min_available_mib: int = 4096
    min_available_pct: float = 8.0


def slots_that_fit(
    available_mib: float,
    total_mib: float,
    per_slot_mib: float,
    min_available_mib: int,
    min_available_pct: float,
) -> int:
    """Idle slots admission would still accept: memory above the reserve, over the cost of one."""
    reserve = max(min_available_mib, total_mib * min_available_pct / 100)
    if per_slot_mib <= 0:
        return 0
    return max(0, int((available_mib - reserve) // per_slot_mib))


def render_fork_phases(r: dict[str, Any]) -> str:
    """One line per fork width: dump, restore wall, per child, then the children's phases."""
    lines = []
    for n, f in r.get("fork_phases", {}).items():
        kids = " ".join(f"{k} {v['p50']:.3f}" for k, v in f["child_phases_s"].items())
        dump, wall, per = (f[k]["p50"] for k in ("dump_s", "restore_wall_s", "per_child_s"))
        lines.append(
            f"fork of {n}: dump {dump:.3f} s + restores {wall:.3f} s = {per:.3f} s per child; "
            f"a child's phases p50 (s): {kids}"
        )
    return "\n".join(lines)


def render_table(r: dict[str, Any]) -> str:
    cold = r["cold_boot_s"]["p50"]
    rows: list[tuple[str, str, str]] = [("cold boot (baseline)", f"{cold:.3f} s", "1x")]
    if "template_s" in r:
        rows.append(("template (boot+quiesce+dump)", f"{r['template_s']['p50']:.3f} s", ""))

    def line(name: str, key: str, stat: str = "p50") -> None:
        if key in r:
            v = r[key][stat]
            rows.append((f"{name} {stat}", f"{v:.3f} s", f"{cold / v:.0f}x faster" if v else "-"))

    line("create (restore -> agent)", "create_s")
    line("reset, restore path", "reset_s")
    line("reset, restore path", "reset_s", "p99")
    if "restore_cpu_s" in r:
        rows.append(
            (
                "CPU per restore (criu + tree) p50",
                f"{r['restore_cpu_s']['p50']:.3f} s",
                "independent of host load",
            )
        )
    line("reset, warm spare", "reset_spare_s")
    line("reset, warm spare", "reset_spare_s", "p99")
    for n in r.get("branch", {}):
        v = r["branch"][n]["p50"]
        rows.append(
            (
                f"branch of {n} (all answer) p50",
                f"{v:.3f} s",
                f"{int(n) * cold / v:.1f}x faster than {n} cold boots",
            )
        )
    line("step + screenshot", "step_screenshot_s")
    line("step + screenshot", "step_screenshot_s", "p99")
    mem = r.get("memory", {})
    if mem:
        rows.append(("idle slot memory, no KSM", f"{mem['per_slot_mib_no_ksm']:.1f} MiB", ""))
        if "per_slot_mib_ksm" in mem:
            rows.append(("idle slot memory, KSM", f"{mem['per_slot_mib_ksm']:.1f} MiB", ""))
        rows.append(
            (
                "idle slots that fit (admission)",
                str(mem["slots_fit_no_ksm"]),
                f"KSM: {mem.get('slots_fit_ksm', '-')}",
            )
        )
    w = max(len(a) for a, _, _ in rows)
    return "\n".join(f"{a:<{w}}  {b:>12}  {c}" for a, b, c in rows)


async def run_bench(opts: BenchOptions, progress: Progress = print) -> dict[str, Any]:
    from drumsd.linux.image import find_image
    from drumsd.runtime.linux import LinuxRuntimeConfig

    image = find_image(opts.image, opts.cache_root)
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    # KSM off (the daemon's default is on): these figures are measured without merging.
    base_cfg = LinuxRuntimeConfig(
        state_dir=opts.state_dir, criu=opts.criu, profile=opts.profile, ksm=False
    )
    results: dict[str, Any] = {
        "host": host_facts(opts.state_dir),
        "image": {"profile": image.profile, "sha256": image.sha256},
        "slot_profile": opts.profile,
        "apps": list(opts.apps),
        "options": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in asdict(opts).items()
            if k != "limits"
        },
    }
    lim = opts.limits
    ck_dir = opts.state_dir / "checkpoints" / f"bench-{uuid.uuid4().hex[:6]}"

    async with bench_runtime(base_cfg) as rt:
        progress(f"cold boot x{opts.cold_boots} of image {image.profile} ...")
        boots = []
        for _ in range(opts.cold_boots):
            inst, boot_s = await rt.cold_boot(image.root.resolve(), "bench:cold", opts.apps)
            # A boot-per-episode system waits until the desktop is drawn and settled: add the
            # time until the tree is quiet (less the quiet window itself).
            t0 = time.monotonic()
            await rt.wait_instance_quiet(inst, QUIET_WINDOW_S, 120.0)
            boots.append(boot_s + max(0.0, time.monotonic() - t0 - QUIET_WINDOW_S))
            await rt.dispose_instance(inst)
        results["cold_boot_s"] = summarize(boots)

        progress("template (cold boot, quiesce, dump) ...")
        t0 = time.monotonic()
        ref = await rt.make_template(
            image.root, image.sha256, "bench", ck_dir / "template", apps=opts.apps
        )
        results["template_s"] = summarize([time.monotonic() - t0])
        meta = json.loads((ref.dir / "meta.json").read_text())
        results["template_dump_s"] = meta.get("dump_s")

        progress("create x5 ...")
        creates = []
        for i in range(5):
            t0 = time.monotonic()
            h = await rt.restore(f"bench-c{i}", ref, lim)
            creates.append(time.monotonic() - t0)
            await rt.destroy(h.slot_id)
        results["create_s"] = summarize(creates)

        progress(f"reset x{opts.resets} (restore path) ...")
        h = await rt.restore("bench-r", ref, lim)
        resets: list[float] = []
        cpu: list[float] = []
        for _ in range(opts.resets):
            t0 = time.monotonic()
            h = await rt.reset(h, ref, lim)
            resets.append(time.monotonic() - t0)
            cpu.append(float(h.extra["phases"].get("restore_cpu", 0.0)))
        results["reset_s"] = summarize(resets)
        results["restore_cpu_s"] = summarize(cpu)

        progress(f"step + screenshot x{opts.steps} ...")
        rtts = []
        for _ in range(opts.steps):
            x, y = random.randrange(200, 1700), random.randrange(200, 900)
            t0 = time.monotonic()
            await rt.step(h, {"type": "move", "x": x, "y": y})
            await rt.screenshot(h)
            rtts.append(time.monotonic() - t0)
        results["step_screenshot_s"] = summarize(rtts)

        results["branch"] = {}
        for n in opts.branches:
            progress(f"branch of {n} x3 ...")
            walls, dumps, phases = [], [], []
            for k in range(3):
                t0 = time.monotonic()
                pre = await rt.capture(h, f"bench-pre-{n}-{k}", ck_dir / f"pre-{n}-{k}")
                dumps.append(time.monotonic() - t0)
                t0 = time.monotonic()
                kids = await rt.fork(h, pre, [f"bench-b{n}-{k}-{i}" for i in range(n)], lim)
                walls.append(time.monotonic() - t0)
                phases += [kid.extra.get("phases", {}) for kid in kids]
                for kid in kids:
                    await rt.destroy(kid.slot_id)
            results["branch"][str(n)] = summarize(walls)
            results.setdefault("fork_phases", {})[str(n)] = fork_breakdown(n, dumps, walls, phases)
        await rt.destroy(h.slot_id)

        progress(f"memory of {opts.idle_slots} idle slots, no KSM ...")
        idle = [await rt.restore(f"bench-m{i}", ref, lim) for i in range(opts.idle_slots)]
        await trio.sleep(3)
        per_slot = [slot_anon_mib(s) for s in idle]
        for s in idle:
            await rt.destroy(s.slot_id)
        mem: dict[str, Any] = {"per_slot_mib_no_ksm": round(statistics.fmean(per_slot), 1)}
        results["memory"] = mem

    if KSM_DIR.is_dir():
        cfg = LinuxRuntimeConfig(
            state_dir=opts.state_dir,
            criu=opts.criu,
            ksm=True,
            profile=opts.profile,
            ksm_pages_to_scan=5000,
            ksm_sleep_millisecs=10,
            spares_per_checkpoint=2,
        )
        async with bench_runtime(cfg) as rt:
            progress(
                f"memory of {opts.idle_slots} idle slots with KSM (up to "
                f"{opts.ksm_wait_s:.0f} s to merge) ..."
            )
            saved0 = ksm_saved_mib()
            idle = [await rt.restore(f"bench-k{i}", ref, lim) for i in range(opts.idle_slots)]
            last, stable_since = -1.0, time.monotonic()
            deadline = time.monotonic() + opts.ksm_wait_s
            while time.monotonic() < deadline and time.monotonic() - stable_since < 10:
                await trio.sleep(2)
                now = ksm_saved_mib()
                if abs(now - last) > 2:
                    last, stable_since = now, time.monotonic()
            # A merged page stays charged to one slot's memcg and leaves the others', so the
            # sum of the slots' charges is the real cost of the group.
            total = sum(slot_anon_mib(s) for s in idle)
            mem["ksm_saved_mib"] = round(max(0.0, ksm_saved_mib() - saved0), 1)
            mem["ksm_merge_wait_s"] = round(time.monotonic() - deadline + opts.ksm_wait_s, 1)
            mem["per_slot_mib_ksm"] = round(total / len(idle), 1)
            for s in idle:
                await rt.destroy(s.slot_id)

            progress(
                f"reset x{opts.spare_resets} through warm spares "
                f"(one per {opts.spare_interval_s} s) ..."
            )
            rt.enable_spares(ref, lim)
            with trio.fail_after(120):
                while rt.spare_counts().get(ref.id, 0) < cfg.spares_per_checkpoint:
                    await trio.sleep(0.1)
            h = await rt.restore("bench-s", ref, lim)
            spare, hits = [], 0
            steps: dict[str, list[float]] = {}
            for _ in range(opts.spare_resets):
                await trio.sleep(opts.spare_interval_s)
                t0 = time.monotonic()
                h = await rt.reset(h, ref, lim)
                spare.append(time.monotonic() - t0)
                hits += bool(h.extra.get("spare"))
                for name, value in h.extra.get("phases", {}).items():
                    if name.startswith("claim_"):
                        steps.setdefault(name, []).append(float(value))
            results["reset_spare_s"] = summarize(spare)
            results["reset_spare_hits"] = hits
            # Where a claim's time goes (owner record, thaw, agent answer): the spare p99.
            results["reset_spare_steps_s"] = {k: summarize(v) for k, v in steps.items()}
            await rt.destroy(h.slot_id)
            await rt.drop_spares(ref.id)

    info = meminfo_mib()
    for key, cost in (("no_ksm", mem["per_slot_mib_no_ksm"]), ("ksm", mem.get("per_slot_mib_ksm"))):
        if cost:
            mem[f"slots_fit_{key}"] = slots_that_fit(
                info["MemAvailable"],
                info["MemTotal"],
                cost,
                opts.min_available_mib,
                opts.min_available_pct,
            )
    results["host"]["loadavg_end"] = os.getloadavg()
    cold = results["cold_boot_s"]["p50"]
    results["ratios_vs_cold_boot"] = {
        "create": round(cold / results["create_s"]["p50"], 1),
        "reset_p50": round(cold / results["reset_s"]["p50"], 1),
        **(
            {"reset_spare_p50": round(cold / results["reset_spare_s"]["p50"], 1)}
            if "reset_spare_s" in results
            else {}
        ),
    }
    results["targets"] = {
        "reset_p50<=0.20": results["reset_s"]["p50"] <= 0.20,
        "reset_p99<=0.50": results["reset_s"]["p99"] <= 0.50,
        "branch8<=1.2": results["branch"].get("8", {}).get("p50", 99) <= 1.2,
        "step_screenshot_p50<=0.080": results["step_screenshot_s"]["p50"] <= 0.080,
    }
    shutil.rmtree(ck_dir, ignore_errors=True)
    # The runtime keeps checkpoint images on its own tmpfs across runs; the bench's are done.
    from drumsd.linux import mounts

    for m in mounts.mounts_under(opts.state_dir / "images"):
        mounts.apply([mounts.MountOp("umount", m)])
    shutil.rmtree(opts.state_dir / "images", ignore_errors=True)
    return results


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    d = BenchOptions()
    add_host_args(parser, d.image, "image profile or directory")
    parser.add_argument("--state-dir", type=Path, default=d.state_dir)
    parser.add_argument(
        "--state-on-disk",
        action="store_false",
        dest="state_tmpfs",
        help="leave --state-dir on its own filesystem (default: a tmpfs mounted there for the "
        "run, as a deployment's state_dir is; a disk adds its writes, fsyncs and discards to "
        "every dump, restore and teardown)",
    )
    parser.add_argument(
        "--profile",
        choices=("hardened", "trusted", "both"),
        default=d.profile,
        help="slot isolation profile to measure; both: hardened, then trusted, "
        "side by side in one run",
    )
    parser.add_argument(
        "--app",
        action="append",
        default=[],
        help="a command the desktop starts before the checkpoint "
        "(e.g. 'libreoffice --calc --norestore'); repeatable",
    )
    parser.add_argument("--out", type=Path, default=d.out, help="JSON results file")
    parser.add_argument("--resets", type=int, default=d.resets)
    parser.add_argument("--spare-resets", type=int, default=d.spare_resets)
    parser.add_argument(
        "--spare-interval-s",
        type=float,
        default=d.spare_interval_s,
        help="pause between resets through a warm spare (the claim rate)",
    )
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--idle-slots", type=int, default=d.idle_slots)
    parser.add_argument("--ksm-wait-s", type=float, default=d.ksm_wait_s)
    parser.add_argument(
        "--screenshots",
        action="store_true",
        help="only screenshots: plain PNG against cached/scaled/jpeg/webp, move and type steps, "
        "in one run (--steps rounds; JSON to --out)",
    )
    forks = ForkBenchOptions()
    parser.add_argument(
        "--forks",
        action="store_true",
        help="only forks: a fork of --fork-width children of one live desktop (--app to open "
        "one), KSM's scan boost off and on interleaved, --fork-rounds each; wall until all "
        "answer and memory --fork-settle-s later (JSON to --out)",
    )
    parser.add_argument(
        "--track-writes",
        action="store_true",
        help="--forks and --saves with linux.track_writes on: restored trees armed for write "
        "tracking (its cost on a fork; a delta save dumped tracked instead of compared)",
    )
    parser.add_argument("--fork-width", type=int, default=forks.width)
    parser.add_argument("--fork-rounds", type=int, default=forks.rounds)
    parser.add_argument("--fork-settle-s", type=float, default=forks.settle_s)
    parser.add_argument(
        "--fork-queue",
        type=fork_queues,
        default=(),
        help="compare restore queue widths instead of the boost (e.g. 2,4: "
        "max_concurrent_restores per mode, the boost on in each, rounds interleaved)",
    )
    parser.add_argument(
        "--fork-warm",
        action="store_true",
        help="compare the parent's screen encoded before its prefork is dumped (the daemon's "
        "way: the children inherit the image) against not, instead of the boost (on in both; "
        "a fresh parent each round)",
    )
    parser.add_argument(
        "--fork-tracking",
        action="store_true",
        help="compare children armed for write tracking (linux.track_writes) against not, "
        "instead of the boost (on in both; rounds interleaved)",
    )
    saves = SaveBenchOptions()
    parser.add_argument(
        "--saves",
        action="store_true",
        help="only saves: a desktop restored from a saved state changes one document, then "
        "is saved full and as what changed (save_delta_depth), --save-rounds each, interleaved; "
        "bytes, save wall and restore walls of each (JSON to --out; --app opens the document's "
        "app, e.g. --image office --app 'libreoffice --calc --norestore')",
    )
    parser.add_argument("--save-rounds", type=int, default=saves.rounds)
    parser.add_argument(
        "--save-no-ksm",
        action="store_true",
        help="--saves with KSM off: ksmd's merges count as writes to write tracking, so a "
        "merged desktop's tracked save writes more",
    )


def fork_queues(text: str) -> tuple[int, ...]:
    """`--fork-queue`, its error as argparse's usage message."""
    try:
        return parse_queues(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main_bench(args: argparse.Namespace) -> int:
    """`drumsd bench`: the state dir on a tmpfs for the run unless --state-on-disk."""
    try:
        with (
            stopped_by_signals(),
            bench_dir_lock(args.state_dir, "--state-dir"),
            state_on_tmpfs(args.state_dir, args.state_tmpfs),
        ):
            return _run_bench(args)
    except BenchError as exc:
        print(f"drumsd bench: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        if not was_interrupted(exc):
            raise
        progress_line(f"drumsd bench: stopped; its desktops killed, {args.state_dir} unmounted")
        return 130


def _run_bench(args: argparse.Namespace) -> int:
    if args.screenshots:
        return main_screenshot_bench(
            ShotBenchOptions(
                image=args.image,
                cache_root=args.cache_root,
                state_dir=args.state_dir,
                criu=args.criu,
                profile="hardened" if args.profile == "both" else args.profile,
                steps=max(2, args.steps),
                out=args.out,
            )
        )
    if args.forks:
        return main_fork_bench(
            ForkBenchOptions(
                image=args.image,
                cache_root=args.cache_root,
                state_dir=args.state_dir,
                criu=args.criu,
                profile="hardened" if args.profile == "both" else args.profile,
                apps=tuple(args.app),
                width=max(2, args.fork_width),
                rounds=max(1, args.fork_rounds),
                settle_s=max(1.0, args.fork_settle_s),
                queues=args.fork_queue,
                warm=args.fork_warm,
                out=args.out,
                track_writes=args.track_writes,
                tracking=args.fork_tracking,
            )
        )
    if args.saves:
        return main_save_bench(
            SaveBenchOptions(
                image=args.image,
                cache_root=args.cache_root,
                state_dir=args.state_dir,
                criu=args.criu,
                profile="hardened" if args.profile == "both" else args.profile,
                apps=tuple(args.app),
                rounds=max(1, args.save_rounds),
                out=args.out,
                ksm=not args.save_no_ksm,
                track_writes=args.track_writes,
            )
        )
    profiles = ("hardened", "trusted") if args.profile == "both" else (args.profile,)

    progress = stderr_progress
    runs: dict[str, dict[str, Any]] = {}
    for profile in profiles:
        opts = BenchOptions(
            image=args.image,
            cache_root=args.cache_root,
            state_dir=args.state_dir,
            criu=args.criu,
            profile=profile,
            apps=tuple(args.app),
            out=args.out,
            resets=max(1, args.resets),
            spare_resets=args.spare_resets,
            spare_interval_s=max(0.0, args.spare_interval_s),
            steps=max(1, args.steps),
            idle_slots=max(1, args.idle_slots),
            ksm_wait_s=args.ksm_wait_s,
        )
        progress(f"profile {profile}")
        runs[profile] = trio.run(run_bench, opts, progress)
        print(f"\nprofile: {profile}")
        print(render_table(runs[profile]))
        print(render_fork_phases(runs[profile]))
    if len(runs) > 1:
        print("\n" + render_profiles(runs))
    results = runs[profiles[0]] if len(runs) == 1 else {"profiles": runs}
    args.out.write_text(json.dumps(results, indent=1))
    print(f"results written to {args.out}")
    return 0 if all(all(r["targets"].values()) for r in runs.values()) else 1


def render_profiles(runs: dict[str, dict[str, Any]]) -> str:
    """Hardened beside trusted: the p50 of each operation and the cost of hardening."""
    keys = [
        ("create", "create_s"),
        ("reset, restore path", "reset_s"),
        ("reset, warm spare", "reset_spare_s"),
        ("step + screenshot", "step_screenshot_s"),
        ("CPU per restore", "restore_cpu_s"),
    ]
    names = list(runs)
    head = f"{'p50':<24}" + "".join(f"{n:>12}" for n in names) + f"{'ratio':>8}"
    lines = [head, "-" * len(head)]
    for label, key in keys:
        vals = [runs[n].get(key, {}).get("p50") for n in names]
        if any(v is None for v in vals):
            continue
        ratio = f"{vals[0] / vals[1]:.2f}" if len(vals) == 2 and vals[1] else ""
        lines.append(f"{label:<24}" + "".join(f"{v:>11.3f}s" for v in vals) + f"{ratio:>8}")
    for n in sorted({k for r in runs.values() for k in r.get("branch", {})}, key=int):
        vals = [runs[p].get("branch", {}).get(n, {}).get("p50") for p in names]
        if any(v is None for v in vals):
            continue
        ratio = f"{vals[0] / vals[1]:.2f}" if len(vals) == 2 and vals[1] else ""
        lines.append(
            f"{'branch of ' + n:<24}" + "".join(f"{v:>11.3f}s" for v in vals) + f"{ratio:>8}"
        )
    return "\n".join(lines)


__all__ = [
    "BenchOptions",
    "add_bench_args",
    "main_bench",
    "render_table",
    "run_bench",
    "slots_that_fit",
    "summarize",
]
