"""`drumsd bench episodes`: what a whole episode costs, through a real daemon and its API.

Scripted episodes over a task mix (by default the OSWorld-format tasks of examples/tasks/, one per
app of the office image), N at a time, each: create on a task -> S steps, each with its screenshot
in the same round trip -> verify -> destroy. Each path runs the same episodes in one run:

  drums            a daemon with today's defaults (every feature on)
  features off     a daemon with the switches of FEATURES turned off (the path before them):
                   those of issue 33 (the default), of issue 35, or all (--features-off)
  boot per episode a cold boot of the image (measured here, in this run) in place of the restore,
                   plus the same setup, steps and verify: what a VM-per-episode runtime pays

Reported per path: create-to-ready, task reset (a reset of a slot on its task: restore + setup),
step + screenshot, verify (p50 / p99), CPU-seconds per episode (host /proc/stat delta over the
episodes, less the host's background rate sampled just before; and the daemon's own processes
plus its slots' processes, which other load on the host does not touch), and valid episodes per
hour; ratios against the drums path. Then, on each daemon path, a few episodes one at a time
with the daemon's CPU read between phases (create, the steps, the gates' wait, verify, destroy):
where an episode's CPU goes. Work the daemon does in the background (a warm spare's refill, an
idle desktop's own ticks) is charged to whichever phase it overlaps. Prints a table and writes
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from drumsd.bench.common import (
    QUIET_WINDOW_S,
    Progress,
    add_host_args,
    bench_dir_lock,
    bench_runtime,
    clear_leftovers,
    progress_line,
    stopped_by_signals,
    was_interrupted,
)
from drumsd.bench.common import BenchError as BenchError
from drumsd.bench.episode_options import EpisodeBenchOptions
from drumsd.bench.episodes_host import (
    BenchDaemon as BenchDaemon,
)
from drumsd.bench.episodes_host import (
    CpuAccount as CpuAccount,
)
from drumsd.bench.episodes_host import (
    background_rate as background_rate,
)
from drumsd.bench.episodes_host import (
    host_busy_s as host_busy_s,
)
from drumsd.bench.episodes_host import (
    merge_config as merge_config,
)
from drumsd.bench.episodes_host import settle
from drumsd.bench.episodes_profile import profile_level
from drumsd.bench.episodes_report import (
    PHASES as PHASES,
)
from drumsd.bench.episodes_report import (
    SATURATED as SATURATED,
)
from drumsd.bench.episodes_report import (
    boot_path as boot_path,
)
from drumsd.bench.episodes_report import (
    cpu_ratio as cpu_ratio,
)
from drumsd.bench.episodes_report import (
    episode_cpu as episode_cpu,
)
from drumsd.bench.episodes_report import (
    ratios as ratios,
)
from drumsd.bench.episodes_report import (
    render_table as render_table,
)
from drumsd.bench.episodes_report import (
    stats as stats,
)
from drumsd.bench.episodes_report import (
    summarize_path as summarize_path,
)
from drumsd.bench.episodes_sampler import Sampler
from drumsd.bench.ramp import RampError, find_knee, level_row, parse_ramp, render_ramp_table


@dataclass(frozen=True)
class FeatureSwitch:
    """A feature the episode path gained, the issue it came with, and the config that switches
    it off."""

    name: str
    issue: int
    off: dict[str, Any]


# One line per feature: the `features off` daemon applies the `off` block of each feature of the
# issues chosen (--features-off), merged per block.
FEATURES: tuple[FeatureSwitch, ...] = (
    FeatureSwitch("resident_checkers", 33, {"tasks": {"resident_checkers": False}}),
    FeatureSwitch("task_checkpoints", 33, {"task_checkpoints": {"enabled": False}}),
    # every screenshot (a step's included): GetImage, Pillow's encoder, no change cache
    FeatureSwitch("screen_damage_bands", 35, {"linux": {"screen_grab": "full"}}),
    # a task checkpoint's capture: a full dump instead of a delta against the template
    FeatureSwitch("delta_saves", 35, {"save_delta_depth": 0}),
    # ksmd's boost after spare refills back to back (and forks)
    FeatureSwitch("ksm_boost", 35, {"ksm": {"boost_s": 0.0}}),
)
FEATURE_ISSUES = ("33", "35", "all")


def features_of(which: str) -> tuple[FeatureSwitch, ...]:
    """The features `--features-off which` switches off: those of one issue, or all."""
    if which not in FEATURE_ISSUES:
        raise BenchError(f"--features-off {which!r}: give one of {', '.join(FEATURE_ISSUES)}")
    return tuple(f for f in FEATURES if which == "all" or str(f.issue) == which)


# --- host and process CPU --------------------------------------------------------------------


# --- a daemon of our own ------------------------------------------------------------------------


def features_off(which: str = "all") -> dict[str, Any]:
    return merge_config({}, *(f.off for f in features_of(which)))


# --- the episodes --------------------------------------------------------------------------------


def task_mix(opts: EpisodeBenchOptions) -> list[str]:
    """Task ids of the mix: every task file of tasks_dir, or those whose id starts with one of
    opts.tasks."""
    d = opts.tasks_dir
    if not d.is_dir():
        raise BenchError(
            f"no task directory {d} (run from the repository, or pass --tasks-dir DIR "
            "with OSWorld-format task JSON files)"
        )
    ids = []
    for path in sorted(d.glob("*.json")):
        try:
            ids.append(str(json.loads(path.read_text())["id"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchError(f"{path} is not an OSWorld-format task (no id): {exc}") from exc
    if opts.tasks:
        chosen = [i for i in ids if any(i.startswith(p) for p in opts.tasks)]
        missing = [p for p in opts.tasks if not any(i.startswith(p) for i in ids)]
        if missing:
            raise BenchError(f"no task of {d} has an id starting with {', '.join(missing)}")
        ids = chosen
    if not ids:
        raise BenchError(f"{d} holds no task JSON files")
    return ids


def scripted_action(i: int) -> dict[str, Any]:
    """The episode's i-th step: pointer moves and scrolls over the middle of the screen (the
    scrolls change what documents show; nothing is typed, so the task's files stay as set up)."""
    if i % 2:
        return {"type": "scroll", "x": 960, "y": 540, "clicks": -1 if i % 4 == 1 else 1}
    return {"type": "move", "x": 400 + (i * 97) % 1100, "y": 250 + (i * 61) % 600}


class PhaseCpu:
    """CPU-seconds per phase of one episode, from a reading of the daemon's CPU taken at each
    phase's end (no reader: nothing recorded)."""

    def __init__(self, read: Callable[[], float | None] | None) -> None:
        self.read = read
        self.by_phase: dict[str, float] = {}
        self.last = read() if read else None

    def mark(self, phase: str) -> None:
        if self.read is None or self.last is None:
            return
        now = self.read()
        if now is not None:
            self.by_phase[phase] = round(now - self.last, 4)
            self.last = now


def run_episode(
    client: Any, task_id: str, steps: int, cpu: Callable[[], float | None] | None = None
) -> dict[str, Any]:
    """One episode: create -> steps -> gates -> verify -> destroy. Its record has each phase's
    wall, and the monotonic times a profile places it by: each step's start (`steps_at`) and the
    daemon's own time for it (`steps_daemon_s`), the other phases' intervals (`ops`)."""
    phases = PhaseCpu(cpu)
    ops: list[list[Any]] = []
    t0 = time.monotonic()
    env = client.create(task=task_id)
    create_s = time.monotonic() - t0
    ops.append(["create", t0, t0 + create_s])
    phases.mark("create")
    rec: dict[str, Any] = {
        "task": task_id,
        "create_s": create_s,
        "steps_s": [],
        "steps_at": [],
        "steps_daemon_s": [],
        "ops": ops,
    }
    try:
        for i in range(steps):
            t = time.monotonic()
            done = env.step(scripted_action(i), screenshot=True)
            rec["steps_s"].append(time.monotonic() - t)
            rec["steps_at"].append(t)
            rec["steps_daemon_s"].append(done.elapsed_s)
        phases.mark("steps")
        t = time.monotonic()
        env.wait_valid(timeout=60)
        rec["gates_wait_s"] = time.monotonic() - t
        ops.append(["gates_wait", t, t + rec["gates_wait_s"]])
        phases.mark("gates_wait")
        t = time.monotonic()
        result = env.verify(strict=False)
        rec["verify_s"] = time.monotonic() - t
        ops.append(["verify", t, t + rec["verify_s"]])
        phases.mark("verify")
        rec["valid"] = bool(result.valid and result.verdict == "valid")
        rec["score"] = result.score
        rec["audit_flags"] = list(result.audit.flags)
    except Exception as exc:  # an episode that fails counts as not valid, with its reason
        rec["valid"] = False
        rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        t = time.monotonic()
        env.close()
        rec["destroy_s"] = time.monotonic() - t
        ops.append(["destroy", t, t + rec["destroy_s"]])
        phases.mark("destroy")
    rec["wall_s"] = time.monotonic() - t0
    if phases.by_phase:
        rec["cpu_s"] = phases.by_phase
    return rec


def run_episodes(
    daemon: BenchDaemon,
    tasks: list[str],
    opts: EpisodeBenchOptions,
    cpu: Callable[[], float | None] | None = None,
) -> list[dict]:
    """opts.episodes episodes over the mix, opts.concurrency at a time, one client per thread;
    with `cpu`, each episode's phases are charged what that reading grew by (meant for one at a
    time, so no other episode's work lands in a phase)."""
    import drums

    todo: queue.Queue[str] = queue.Queue()
    for i in range(opts.episodes):
        todo.put(tasks[i % len(tasks)])
    done: list[dict[str, Any]] = []
    lock = threading.Lock()
    stopping = threading.Event()  # the run was stopped (Ctrl-C, SIGTERM): its daemon goes away

    def worker() -> None:
        with drums.connect(daemon.url, token=daemon.token) as client:
            while not stopping.is_set():
                try:
                    task_id = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    rec = run_episode(client, task_id, opts.steps, cpu)
                except Exception:
                    if stopping.is_set():
                        return  # the daemon stopped under the episode, not a bench failure
                    raise
                with lock:
                    done.append(rec)

    threads = [threading.Thread(target=worker) for _ in range(max(1, opts.concurrency))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stopping.set()
    return done


def run_task_resets(daemon: BenchDaemon, tasks: list[str], opts: EpisodeBenchOptions) -> list:
    """Per task: one slot on it, opts.task_resets resets (each restores and replays setup)."""
    import drums

    out: list[float] = []
    with drums.connect(daemon.url, token=daemon.token) as client:
        for task_id in tasks:
            with client.create(task=task_id) as env:
                for _ in range(opts.task_resets):
                    t0 = time.monotonic()
                    env.reset()
                    out.append(time.monotonic() - t0)
    return out


def run_bare_creates(daemon: BenchDaemon, n: int) -> list[float]:
    import drums

    out = []
    with drums.connect(daemon.url, token=daemon.token) as client:
        for _ in range(n):
            t0 = time.monotonic()
            env = client.create()
            out.append(time.monotonic() - t0)
            env.close()
    return out


def warm_up(
    name: str,
    daemon: BenchDaemon,
    tasks: list[str],
    opts: EpisodeBenchOptions,
    progress: Progress,
) -> None:
    """Short episodes, not counted: on the first task, or two on every task with warm_each_task.
    A task's first episode replays its setup and captures the task's checkpoint; its second
    restores that checkpoint, which starts the checkpoint's pool of warm spares (a pool is sized
    by its claims: without it, each task's first timed episode missed a spare and paid its
    restore and the pool's first refills: a ramp's 12 episodes one at a time read 1.00 CPU-s
    each, 0.72 with the pools started)."""
    warm_tasks = [*tasks, *tasks] if opts.warm_each_task else tasks[:1]
    progress(f"[{name}] warm-up: {len(warm_tasks)} episode(s), not counted ...")
    warm_opts = _replace(opts, episodes=len(warm_tasks), concurrency=1, steps=2)
    for warm in run_episodes(daemon, warm_tasks, warm_opts):
        if not warm.get("valid"):
            raise BenchError(
                f"[{name}] the warm-up episode on {warm.get('task')} was not valid: {warm}; "
                f"daemon log {daemon.log_path}:\n{daemon.log_tail()}"
            )


def run_path(
    name: str,
    overrides: dict[str, Any],
    tasks: list[str],
    opts: EpisodeBenchOptions,
    progress: Progress,
) -> dict[str, Any]:
    daemon = BenchDaemon.configure(name, opts, overrides)
    result: dict[str, Any] = {"config_overrides": overrides}
    ok = False
    try:
        progress(f"[{name}] daemon start + template of {opts.image} ...")
        result["template_ready_s"] = round(daemon.start(), 2)
        result["state_fs"] = daemon.state_fs
        warm_up(name, daemon, tasks, opts, progress)
        result["bare_create_s"] = stats(run_bare_creates(daemon, 3))
        progress(f"[{name}] background CPU for {opts.background_s:.0f} s ...")
        bg = background_rate(opts.background_s)
        progress(
            f"[{name}] {opts.episodes} episodes, {opts.concurrency} at a time, "
            f"{opts.steps} steps each ..."
        )
        sampler = _sampler(daemon, opts)
        host0, own0, t0 = host_busy_s(), daemon.cpu_s(), time.monotonic()
        eps = run_episodes(daemon, tasks, opts)
        wall = time.monotonic() - t0
        host_cpu, own1 = host_busy_s() - host0, daemon.cpu_s()
        if sampler is not None:
            result["profile_episodes"] = _profiled(eps, sampler)
        result["episodes_phase"] = {
            "wall_s": round(wall, 2),
            "host_cpu_s": round(host_cpu, 2),
            "background_cpu_per_s": round(bg, 3),
            "daemon_cpu_s": None if own0 is None or own1 is None else round(own1 - own0, 2),
            "loadavg_end": os.getloadavg(),
        }
        result["episodes"] = eps
        if opts.task_resets > 0:
            progress(f"[{name}] task reset x{opts.task_resets} per task ...")
            result["task_reset_s"] = stats(run_task_resets(daemon, tasks, opts))
        if opts.phase_episodes > 0 and daemon.cpu_s() is not None:
            progress(f"[{name}] {opts.phase_episodes} episodes one at a time, CPU by phase ...")
            one_at_a_time = _replace(opts, episodes=opts.phase_episodes, concurrency=1)
            sampler = _sampler(daemon, opts)
            result["phase_episodes"] = run_episodes(daemon, tasks, one_at_a_time, daemon.cpu_s)
            if sampler is not None:
                result["profile_phase_episodes"] = _profiled(result["phase_episodes"], sampler)
        ok = True
    finally:
        # Ctrl-C included: the daemon and its desktops never outlive the bench.
        if not ok:
            progress(f"[{name}] failed; daemon log kept: {daemon.log_path}")
        daemon.stop(keep_logs=opts.keep_logs or not ok)
    return summarize_path(result, opts)


def _replace(opts: EpisodeBenchOptions, **changes: Any) -> EpisodeBenchOptions:
    from dataclasses import replace

    return replace(opts, **changes)


def cold_boots(opts: EpisodeBenchOptions, progress: Progress) -> dict[str, Any]:
    """Cold boots of the image until its desktop is drawn and settled, wall and host CPU each."""
    import trio

    from drumsd.linux import mounts
    from drumsd.linux.image import find_image
    from drumsd.runtime.linux import LinuxRuntimeConfig

    image = find_image(opts.image, opts.cache_root)
    state = opts.state_root / "boot"
    clear_leftovers(state)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    walls: list[float] = []
    cpus: list[float] = []
    owns: list[float] = []
    account = CpuAccount("boot")

    async def boot_all() -> None:
        cfg = LinuxRuntimeConfig(state_dir=state, criu=opts.criu, ksm=False)
        async with bench_runtime(cfg) as rt:
            for i in range(opts.cold_boots):
                progress(f"[boot per episode] cold boot {i + 1}/{opts.cold_boots} ...")
                c0, own0 = host_busy_s(), account.usage_s()
                inst, boot_s = await rt.cold_boot(image.root.resolve(), "bench:episode-boot")
                t0 = time.monotonic()
                await rt.wait_instance_quiet(inst, QUIET_WINDOW_S, 120.0)
                walls.append(boot_s + max(0.0, time.monotonic() - t0 - QUIET_WINDOW_S))
                cpus.append(host_busy_s() - c0)
                own1 = account.usage_s()
                if own0 is not None and own1 is not None:
                    owns.append(own1 - own0)
                await rt.dispose_instance(inst)

    account.join()  # the boots' processes are this one's children: charged to the account
    try:
        trio.run(boot_all)
    finally:
        account.leave()
        account.remove()
        for m in sorted(mounts.mounts_under(state), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)
    return {
        "cold_boot_s": stats(walls),
        "cold_boot_host_cpu_s": stats(cpus),
        "cold_boot_own_cpu_s": stats(owns),
    }


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise BenchError("no MemAvailable in /proc/meminfo")


class MemLow:
    """The lowest MemAvailable seen while it runs (sampled every 0.5 s in a thread)."""

    def __init__(self) -> None:
        self.start = self.low = mem_available_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.low = min(self.low, mem_available_mib())

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        self.low = min(self.low, mem_available_mib())
        return self.start, self.low


def ramp_overrides(text: str) -> dict[str, Any]:
    """--ramp-config: a JSON object merged into the ramp daemon's config (one arm of an A/B)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BenchError(
            f"--ramp-config is not JSON ({exc}): give an object, e.g. "
            '\'{"spares": {"per_checkpoint": 4}}\''
        ) from exc
    if not isinstance(value, dict):
        raise BenchError(f"--ramp-config must be a JSON object of config keys, got {text!r}")
    from drumsd.core.config import Config

    try:
        Config.model_validate({"token_file": "/t", **value})
    except ValueError as exc:
        raise BenchError(f"--ramp-config is not a valid drumsd config block: {exc}") from exc
    return value


def _sampler(daemon: BenchDaemon, opts: EpisodeBenchOptions) -> Sampler | None:
    """With --profile, a sampler of the daemon's processes, started (None without)."""
    if not opts.profile:
        return None
    if daemon.account is None or daemon.account.dir is None or daemon.proc is None:
        raise BenchError(
            "--profile reads the daemon's cpuacct group: this host has no cgroup v1 cpuacct"
        )
    return Sampler(daemon.account.dir, daemon.proc.pid, opts.profile_interval_s).start()


def _profiled(eps: list[dict], sampler: Sampler) -> dict[str, Any]:
    """Stop `sampler` and place `eps` in its samples (episodes_profile.profile_level)."""
    samples = sampler.stop()
    out = profile_level(eps, samples)
    out["samples"] = len(samples)
    out["sampler_cpu_s"] = round(sampler.sampler_cpu_s, 3)
    out["cpu_by_command_s"] = sampler.top_commands()
    out["reaped_by_command_s"] = sampler.top_reapers()
    return out


def run_ramp(opts: EpisodeBenchOptions, tasks: list[str], progress: Progress) -> dict[str, Any]:
    """The density ramp on one daemon with today's defaults: at each level, `concurrency` busy
    episodes at once (ramp_rounds each), then the level's row; the knee from the rows. A level
    whose episodes all fail stops the ramp (the next ones would only fail more)."""
    overrides = ramp_overrides(opts.ramp_config)
    daemon = BenchDaemon.configure("ramp", opts, overrides)
    out: dict[str, Any] = {
        "levels": [],
        "rounds": opts.ramp_rounds,
        "config_overrides": overrides,
    }
    ok = False
    try:
        progress(f"[ramp] daemon start + template of {opts.image} ...")
        out["template_ready_s"] = round(daemon.start(), 2)
        out["state_fs"] = daemon.state_fs
        warm_up("ramp", daemon, tasks, opts, progress)
        for concurrency in opts.ramp:
            episodes = concurrency * opts.ramp_rounds
            progress(f"[ramp] {concurrency} at a time, {episodes} episodes ...")
            level = _replace(opts, episodes=episodes, concurrency=concurrency)
            # What the warm-up or the level before left running (spare refills of their
            # episodes, a new task checkpoint's probe) is done before this level's account
            # starts, and this level's own is counted until it is done too, less the rate at rest.
            before = settle(daemon.cpu_s)
            mem = MemLow()
            sampler = _sampler(daemon, opts)
            host0, own0, t0 = host_busy_s(), daemon.cpu_s(), time.monotonic()
            eps = run_episodes(daemon, tasks, level)
            wall = time.monotonic() - t0
            after = settle(daemon.cpu_s)
            host_cpu, own1 = host_busy_s() - host0, daemon.cpu_s()
            host_cpu -= after["host_rest_rate"] * after["waited_s"]
            own = None
            if own0 is not None and own1 is not None:
                own = own1 - own0 - after["rest_rate"] * after["waited_s"]
            row = level_row(concurrency, eps, wall, own, host_cpu, mem.stop())
            row["loadavg_end"] = os.getloadavg()
            row["settle"] = {"before": before, "after": after}
            if sampler is not None:
                row["profile"] = _profiled(eps, sampler)
            out["levels"].append(row)
            progress(
                f"[ramp] {concurrency}: {row['valid']}/{episodes} valid, step p99 "
                f"{row['step_screenshot_s']['p99']}, breaks: {row['broken'] or 'nothing'}"
            )
            if row["valid"] == 0:
                break
        ok = True
    finally:
        if not ok:
            progress(f"[ramp] failed; daemon log kept: {daemon.log_path}")
        daemon.stop(keep_logs=opts.keep_logs or not ok)
    out["knee"] = find_knee(out["levels"], os.cpu_count() or 1)
    return out


def run_episode_bench(opts: EpisodeBenchOptions, progress: Progress) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise BenchError("drumsd bench episodes runs real desktops: run it as root")
    tasks = task_mix(opts)
    # One run per state root: a second would remove and unmount the first's daemons' dirs.
    with bench_dir_lock(opts.state_root, "--state-root"):
        return _run_locked(opts, tasks, progress)


def _run_locked(opts: EpisodeBenchOptions, tasks: list[str], progress: Progress) -> dict[str, Any]:
    results: dict[str, Any] = {
        "host": {
            "cpus": os.cpu_count(),
            "kernel": os.uname().release,
            "loadavg_start": os.getloadavg(),
        },
        "tasks": tasks,
        "features": [asdict(f) for f in FEATURES],
        "features_off": [f.name for f in features_of(opts.features_off)],
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
    }
    if opts.ramp:  # the ramp alone: one daemon, today's defaults
        results["ramp"] = run_ramp(opts, tasks, progress)
        results["host"]["loadavg_end"] = os.getloadavg()
        return results
    paths: dict[str, dict[str, Any]] = {}
    paths["drums"] = run_path("drums", {}, tasks, opts, progress)
    off = features_off(opts.features_off)
    paths["features off"] = run_path("features-off", off, tasks, opts, progress)
    if not opts.skip_boot and opts.cold_boots > 0:
        bg = background_rate(opts.background_s)
        boot = cold_boots(opts, progress)
        paths["boot per episode"] = boot_path(boot, paths["features off"], bg)
    results["paths"] = paths
    results["ratios"] = ratios(paths)
    results["host"]["loadavg_end"] = os.getloadavg()
    return results


def add_episode_args(parser: argparse.ArgumentParser) -> None:
    d = EpisodeBenchOptions()
    add_host_args(parser, d.image, "image profile (default office)")
    parser.add_argument(
        "--tasks-dir",
        type=Path,
        default=d.tasks_dir,
        help="OSWorld-format task files of the mix (default examples/tasks: one per office app)",
    )
    parser.add_argument(
        "--task", action="append", default=[], help="only this task id (or prefix); repeatable"
    )
    parser.add_argument("--episodes", type=int, default=d.episodes, help="episodes per path")
    parser.add_argument("--concurrency", type=int, default=d.concurrency, help="N at a time")
    parser.add_argument("--steps", type=int, default=d.steps, help="steps per episode")
    parser.add_argument(
        "--phase-episodes",
        type=int,
        default=d.phase_episodes,
        help="episodes one at a time with the daemon's CPU read between phases (0: none)",
    )
    parser.add_argument(
        "--task-resets", type=int, default=d.task_resets, help="resets per task (0: none)"
    )
    parser.add_argument("--cold-boots", type=int, default=d.cold_boots)
    parser.add_argument("--skip-boot", action="store_true", help="leave out boot per episode")
    parser.add_argument(
        "--warm-each-task",
        action="store_true",
        help="warm up with two episodes of every task of the mix, not one of the first: each "
        "task's first episode replays its setup and captures its checkpoint, its second "
        "restores it and starts its warm spares, which the timed episodes then claim, as the "
        "rest of a long run does",
    )
    parser.add_argument(
        "--alive-after-s",
        type=float,
        default=d.alive_after_s,
        help="the daemons' alive_after_s (how long after ready the liveness gate is judged)",
    )
    parser.add_argument("--state-root", type=Path, default=d.state_root)
    parser.add_argument(
        "--state-on-disk",
        dest="state_tmpfs",
        action="store_false",
        help="leave each daemon's state_dir on the state root's filesystem (default: a tmpfs "
        "mounted there, as a deployment's state_dir is; a disk adds its writes, fsyncs and "
        "discards to every restore and teardown)",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the daemons' logs")
    parser.add_argument("--out", type=Path, default=d.out, help="JSON results file")
    parser.add_argument(
        "--ramp",
        default="",
        help="the density ramp instead of the paths: concurrency levels, e.g. 1,2,4,8,16,32 "
        "(each level runs --ramp-rounds episodes per concurrent worker; table and JSON give "
        "the knee where validity or step latency breaks)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the daemon's processes (every --profile-interval-s) and say, per ramp "
        "level (or, without --ramp, for each path's episodes and its one-at-a-time phase "
        "episodes), what the steps over 300 ms overlapped and who used the CPU, by process",
    )
    parser.add_argument("--profile-interval-s", type=float, default=d.profile_interval_s)
    parser.add_argument(
        "--ramp-config",
        default="",
        help="with --ramp: a JSON object merged into the ramp daemon's config (one arm of an "
        "A/B), e.g. '{\"restore_cpu_weight\": 64}'",
    )
    parser.add_argument(
        "--ramp-rounds", type=int, default=d.ramp_rounds, help="episodes per worker per level"
    )
    parser.add_argument(
        "--features-off",
        choices=FEATURE_ISSUES,
        default=d.features_off,
        help="whose features the `features off` path switches off: issue 33's (resident "
        "checkers, task checkpoints: the default), issue 35's (the screen's damage bands and "
        "change cache, delta saves, the KSM boost) or all",
    )


def main_episode_bench(args: argparse.Namespace) -> int:
    for name in ("episodes", "concurrency", "steps"):
        if getattr(args, name) < 1:
            print(f"drumsd bench episodes: --{name} must be at least 1", file=sys.stderr)
            return 2
    if args.task_resets < 0 or args.cold_boots < 0 or args.phase_episodes < 0:
        print(
            "drumsd bench episodes: --task-resets, --cold-boots and --phase-episodes are >= 0",
            file=sys.stderr,
        )
        return 2
    try:
        ramp = parse_ramp(args.ramp) if args.ramp else ()
    except RampError as exc:
        print(f"drumsd bench episodes: {exc}", file=sys.stderr)
        return 2
    if args.ramp_rounds < 1:
        print("drumsd bench episodes: --ramp-rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        ramp_overrides(args.ramp_config)
    except BenchError as exc:
        print(f"drumsd bench episodes: {exc}", file=sys.stderr)
        return 2
    if not 0.01 <= args.profile_interval_s <= 5:
        print("drumsd bench episodes: --profile-interval-s is between 0.01 and 5", file=sys.stderr)
        return 2
    # Every option of the command line is a field of the same name (the mix: --task).
    names = {f.name for f in fields(EpisodeBenchOptions)} - {"ramp"}
    values = {k: v for k, v in vars(args).items() if k in names}
    opts = EpisodeBenchOptions(**values, tasks=tuple(args.task), ramp=ramp)

    def progress(msg: str) -> None:
        progress_line(f"bench episodes: {msg}")

    try:
        with stopped_by_signals():
            results = run_episode_bench(opts, progress)
    except BenchError as exc:
        print(f"drumsd bench episodes: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        if not was_interrupted(exc):
            raise
        progress_line(
            "drumsd bench episodes: stopped; its daemons were stopped, their state unmounted"
        )
        return 130
    print(render_ramp_table(results["ramp"]) if "ramp" in results else render_table(results))
    args.out.write_text(json.dumps(results, indent=1))
    print(f"results written to {args.out}")
    return 0


__all__ = [
    "FEATURES",
    "FEATURE_ISSUES",
    "EpisodeBenchOptions",
    "FeatureSwitch",
    "add_episode_args",
    "features_of",
    "features_off",
    "main_episode_bench",
    "merge_config",
    "render_table",
    "run_episode_bench",
]
