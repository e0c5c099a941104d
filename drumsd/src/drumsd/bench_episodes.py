"""`drumsd bench episodes`: what a whole episode costs, through a real daemon and its API.

Scripted episodes over a task mix (by default the OSWorld-format tasks of examples/tasks/, one per
app of the office image), N at a time, each: create on a task -> S steps, each with its screenshot
in the same round trip -> verify -> destroy. Each path runs the same episodes in one run:

  drums            a daemon with today's defaults (every feature on)
  features off     a daemon with every switch of FEATURES turned off (the path before them)
  boot per episode a cold boot of the image (measured here, in this run) in place of the restore,
                   plus the same setup, steps and verify: what a VM-per-episode runtime pays

Reported per path: create-to-ready, task reset (a reset of a slot on its task: restore + setup),
step + screenshot, verify (p50 / p99), CPU-seconds per episode (host /proc/stat delta over the
episodes, less the host's background rate sampled just before; and the daemon's own processes
plus its slots' processes, which other load on the host does not touch), and valid episodes per
hour; ratios against the drums path. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from drumsd.bench import Progress, add_host_args, percentile


@dataclass(frozen=True)
class FeatureSwitch:
    """A feature the episode path gained, and the config that switches it off."""

    name: str
    off: dict[str, Any]


# One line per feature: the `features off` daemon applies every `off` block (merged per block).
FEATURES: tuple[FeatureSwitch, ...] = (
    FeatureSwitch("resident_checkers", {"tasks": {"resident_checkers": False}}),
    FeatureSwitch("task_checkpoints", {"task_checkpoints": {"enabled": False}}),
)


@dataclass(frozen=True)
class EpisodeBenchOptions:
    image: str = "office"
    cache_root: Path = Path("/var/cache/drums")
    criu: Path = Path("/usr/local/sbin/criu")
    tasks_dir: Path = Path("examples/tasks")
    tasks: Sequence[str] = ()  # task ids (or id prefixes) of tasks_dir; empty = all of them
    episodes: int = 12  # per path
    concurrency: int = 2
    steps: int = 20
    task_resets: int = 3  # per task, per path
    cold_boots: int = 3  # office boots vary (1.2 s to 6 s seen): a median of 3
    skip_boot: bool = False
    alive_after_s: float = 1.0
    background_s: float = 3.0
    state_root: Path = Path("/run/drums-bench-episodes")
    out: Path = Path("bench-episodes.json")
    keep_logs: bool = False


# --- host and process CPU --------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def host_busy_s() -> float:
    """CPU-seconds the whole host has been busy (all CPUs): /proc/stat's first line less idle
    and iowait."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


class CpuAccount:
    """A cgroup v1 cpuacct group that a daemon (or this process) and everything it starts stay
    in: drumsd moves slots into its own cpu, memory, freezer ... groups but not cpuacct, and CRIU
    restores with --manage-cgroups=ignore, so the desktops, their setup commands and the
    checkers are charged here, exited ones included. Other load on the host is not."""

    def __init__(self, name: str) -> None:
        self.dir: Path | None = None
        root = _cpuacct_root()
        if root is not None:
            self.dir = root / f"drums-bench-{name}-{os.getpid()}"
            self.dir.mkdir(exist_ok=True)

    def join(self, pid: int = 0) -> None:
        """Move `pid` (0: the calling process) into the group; safe in a preexec_fn."""
        if self.dir is not None:
            (self.dir / "cgroup.procs").write_text(str(pid or os.getpid()))

    def leave(self, pid: int = 0) -> None:
        if self.dir is not None:
            (self.dir.parent / "cgroup.procs").write_text(str(pid or os.getpid()))

    def usage_s(self) -> float | None:
        if self.dir is None:
            return None
        return int((self.dir / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        if self.dir is not None:
            try:
                self.dir.rmdir()
            except OSError:
                pass  # still holds a straggler; an empty group costs nothing


def _cpuacct_root() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and "cpuacct" in parts[3].split(","):
            return Path(parts[1])
    return None


def background_rate(seconds: float) -> float:
    """Host CPU-seconds per second while this bench does nothing (other load, idle daemons)."""
    if seconds <= 0:
        return 0.0
    b0, t0 = host_busy_s(), time.monotonic()
    time.sleep(seconds)
    return (host_busy_s() - b0) / (time.monotonic() - t0)


SATURATED = 0.9  # background CPU per second, as a share of the host's CPUs


def stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 4),
        "p99": round(percentile(values, 99), 4),
        "mean": round(sum(values) / len(values), 4),
    }


# --- a daemon of our own ------------------------------------------------------------------------


def merge_config(base: dict[str, Any], *overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with each override applied; a dict value merges into the block of the same name."""
    out = json.loads(json.dumps(base))
    for override in overrides:
        for key, value in override.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge_config(out[key], value)
            else:
                out[key] = value
    return out


def features_off() -> dict[str, Any]:
    return merge_config({}, *(f.off for f in FEATURES))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class BenchDaemon:
    """`drumsd serve` in a directory of its own (state on /run, as in production)."""

    name: str
    dir: Path
    config: dict[str, Any]
    url: str = ""
    token: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=Path)
    account: CpuAccount | None = None

    @classmethod
    def configure(
        cls, name: str, opts: EpisodeBenchOptions, overrides: dict[str, Any]
    ) -> BenchDaemon:
        d = opts.state_root / name
        shutil.rmtree(d, ignore_errors=True)
        (d / "state").mkdir(parents=True, mode=0o755)
        d.chmod(0o755)
        (d / "state").chmod(0o755)
        token = secrets.token_hex(24)
        token_file = d / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        port = _free_port()
        base = {
            "listen": f"127.0.0.1:{port}",
            "token_file": str(token_file),
            "state_dir": str(d / "state"),
            "journal_dir": str(d / "journal"),
            "forgotten_dir": str(d / "forgotten"),
            "images_dir": str(opts.cache_root / "images"),
            "default_image": opts.image,
            "criu": str(opts.criu),
            "alive_after_s": opts.alive_after_s,
            "tasks": {"dirs": [str(opts.tasks_dir.resolve())]},
            # The bench sizes its own load; admission keeps only a floor that fits a small host.
            "admission": {
                "min_available_mib": 1024,
                "min_available_pct": 2,
                "min_state_free_mib": 256,
            },
        }
        config = merge_config(base, overrides)
        return cls(name, d, config, f"http://127.0.0.1:{port}", token, log_path=d / "drumsd.log")

    def start(self, template_limit_s: float = 300.0) -> float:
        """Start it and wait for the image's template checkpoint; returns the seconds taken."""
        import httpx

        config_path = self.dir / "drumsd.json"
        config_path.write_text(json.dumps(self.config, indent=1))
        t0 = time.monotonic()
        self.account = CpuAccount(self.name)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "drumsd.cli", "serve", "--config", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=self.account.join,  # before exec: nothing it starts escapes
            )
        deadline = t0 + template_limit_s
        image = self.config["default_image"]
        headers = {"Authorization": f"Bearer {self.token}"}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(
                    f"drumsd ({self.name}) exited {self.proc.returncode} before its template "
                    f"was ready; its log {self.log_path} ends:\n{self.log_tail()}"
                )
            try:
                body = httpx.get(self.url + "/v1/checkpoints", headers=headers, timeout=2).json()
                if any(
                    cp.get("kind") == "template" and cp.get("image") == image
                    for cp in body.get("checkpoints", [])
                ):
                    return time.monotonic() - t0
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.25)
        raise BenchError(
            f"drumsd ({self.name}) had no template of image {image!r} within "
            f"{template_limit_s:.0f} s; its log {self.log_path} ends:\n{self.log_tail()}"
        )

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def cpu_s(self) -> float | None:
        """CPU of the daemon, its slots, their setup and its checkers so far (None: no cgroup
        v1 cpuacct on this host)."""
        return self.account.usage_s() if self.account is not None else None

    def stop(self, keep_logs: bool) -> None:
        """Destroy what is left, stop the daemon (SIGTERM, then SIGKILL after 60 s), unmount
        what its runtime keeps mounted under its state dir, remove the dir."""
        import httpx

        from drumsd.linux import mounts

        if self.proc is not None and self.proc.poll() is None:
            try:
                headers = {"Authorization": f"Bearer {self.token}"}
                with httpx.Client(base_url=self.url, headers=headers, timeout=60) as http:
                    for slot in http.get("/v1/slots").json().get("slots", []):
                        http.delete(f"/v1/slots/{slot['id']}")
            except (httpx.HTTPError, ValueError):
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for target in sorted(mounts.mounts_under(self.dir), reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)
        if self.account is not None:
            self.account.remove()
        if keep_logs:
            shutil.rmtree(self.dir / "state", ignore_errors=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class BenchError(RuntimeError):
    """The bench could not run (what failed and where to look)."""


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


def run_episode(client: Any, task_id: str, steps: int) -> dict[str, Any]:
    t0 = time.monotonic()
    env = client.create(task=task_id)
    create_s = time.monotonic() - t0
    rec: dict[str, Any] = {"task": task_id, "create_s": create_s, "steps_s": []}
    try:
        for i in range(steps):
            t = time.monotonic()
            env.step(scripted_action(i), screenshot=True)
            rec["steps_s"].append(time.monotonic() - t)
        t = time.monotonic()
        env.wait_valid(timeout=60)
        rec["gates_wait_s"] = time.monotonic() - t
        t = time.monotonic()
        result = env.verify(strict=False)
        rec["verify_s"] = time.monotonic() - t
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
    rec["wall_s"] = time.monotonic() - t0
    return rec


def run_episodes(daemon: BenchDaemon, tasks: list[str], opts: EpisodeBenchOptions) -> list[dict]:
    """opts.episodes episodes over the mix, opts.concurrency at a time, one client per thread."""
    import drums

    todo: queue.Queue[str] = queue.Queue()
    for i in range(opts.episodes):
        todo.put(tasks[i % len(tasks)])
    done: list[dict[str, Any]] = []
    lock = threading.Lock()

    def worker() -> None:
        with drums.connect(daemon.url, token=daemon.token) as client:
            while True:
                try:
                    task_id = todo.get_nowait()
                except queue.Empty:
                    return
                rec = run_episode(client, task_id, opts.steps)
                with lock:
                    done.append(rec)

    threads = [threading.Thread(target=worker) for _ in range(max(1, opts.concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
        progress(f"[{name}] warm-up episode (not counted) ...")
        warm = run_episodes(daemon, tasks[:1], _replace(opts, episodes=1, concurrency=1, steps=2))
        if not warm[0].get("valid"):
            raise BenchError(
                f"[{name}] the warm-up episode on {tasks[0]} was not valid: {warm[0]}; "
                f"daemon log {daemon.log_path}:\n{daemon.log_tail()}"
            )
        result["bare_create_s"] = stats(run_bare_creates(daemon, 3))
        progress(f"[{name}] background CPU for {opts.background_s:.0f} s ...")
        bg = background_rate(opts.background_s)
        progress(
            f"[{name}] {opts.episodes} episodes, {opts.concurrency} at a time, "
            f"{opts.steps} steps each ..."
        )
        host0, own0, t0 = host_busy_s(), daemon.cpu_s(), time.monotonic()
        eps = run_episodes(daemon, tasks, opts)
        wall = time.monotonic() - t0
        host_cpu, own1 = host_busy_s() - host0, daemon.cpu_s()
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
    return r


def episode_cpu(path: dict[str, Any]) -> float | None:
    """CPU-seconds per episode: the daemon's own account where the host has one, else the
    host's /proc/stat delta less its background rate."""
    cpu = path["cpu_per_episode_s"]
    own = cpu.get("own")
    return own if own is not None else cpu.get("host_less_background")


def cold_boots(opts: EpisodeBenchOptions, progress: Progress) -> dict[str, Any]:
    """Cold boots of the image until its desktop is drawn and settled, wall and host CPU each."""
    import trio

    from drumsd.bench import QUIET_WINDOW_S
    from drumsd.linux import mounts
    from drumsd.linux.image import find_image
    from drumsd.runtime.linux import LinuxRuntimeConfig, open_linux_runtime

    image = find_image(opts.image, opts.cache_root)
    state = opts.state_root / "boot"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    walls: list[float] = []
    cpus: list[float] = []
    owns: list[float] = []
    account = CpuAccount("boot")

    async def boot_all() -> None:
        async with open_linux_runtime(LinuxRuntimeConfig(state_dir=state, criu=opts.criu)) as rt:
            await rt.sweep([])
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
            lines.append(
                f"{n}: host busy {phase['background_cpu_per_s']:.2f} CPU/s before the episodes"
                f"{note}, load average after {phase['loadavg_end'][0]:.1f}"
            )
    lines.append("ratios against drums (x times drums):")
    for name, rs in res["ratios"].items():
        lines.append(
            f"  {name}: " + ", ".join(f"{k} {'-' if v is None else v}" for k, v in rs.items())
        )
    return "\n".join(lines)


def run_episode_bench(opts: EpisodeBenchOptions, progress: Progress) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise BenchError("drumsd bench episodes runs real desktops: run it as root")
    tasks = task_mix(opts)
    opts.state_root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "host": {
            "cpus": os.cpu_count(),
            "kernel": os.uname().release,
            "loadavg_start": os.getloadavg(),
        },
        "tasks": tasks,
        "features": [asdict(f) for f in FEATURES],
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
    }
    paths: dict[str, dict[str, Any]] = {}
    paths["drums"] = run_path("drums", {}, tasks, opts, progress)
    paths["features off"] = run_path("features-off", features_off(), tasks, opts, progress)
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
        "--task-resets", type=int, default=d.task_resets, help="resets per task (0: none)"
    )
    parser.add_argument("--cold-boots", type=int, default=d.cold_boots)
    parser.add_argument("--skip-boot", action="store_true", help="leave out boot per episode")
    parser.add_argument(
        "--alive-after-s",
        type=float,
        default=d.alive_after_s,
        help="the daemons' alive_after_s (how long after ready the liveness gate is judged)",
    )
    parser.add_argument("--state-root", type=Path, default=d.state_root)
    parser.add_argument("--keep-logs", action="store_true", help="keep the daemons' logs")
    parser.add_argument("--out", type=Path, default=d.out, help="JSON results file")


def main_episode_bench(args: argparse.Namespace) -> int:
    for name in ("episodes", "concurrency", "steps"):
        if getattr(args, name) < 1:
            print(f"drumsd bench episodes: --{name} must be at least 1", file=sys.stderr)
            return 2
    if args.task_resets < 0 or args.cold_boots < 0:
        print("drumsd bench episodes: --task-resets and --cold-boots are >= 0", file=sys.stderr)
        return 2
    # Every option of the command line is a field of the same name (the mix: --task).
    names = {f.name for f in fields(EpisodeBenchOptions)}
    values = {k: v for k, v in vars(args).items() if k in names}
    opts = EpisodeBenchOptions(**values, tasks=tuple(args.task))

    def progress(msg: str) -> None:
        print(f"bench episodes: {msg}", file=sys.stderr, flush=True)

    try:
        results = run_episode_bench(opts, progress)
    except BenchError as exc:
        print(f"drumsd bench episodes: {exc}", file=sys.stderr)
        return 1
    print(render_table(results))
    args.out.write_text(json.dumps(results, indent=1))
    print(f"results written to {args.out}")
    return 0


__all__ = [
    "FEATURES",
    "EpisodeBenchOptions",
    "FeatureSwitch",
    "add_episode_args",
    "features_off",
    "main_episode_bench",
    "merge_config",
    "render_table",
    "run_episode_bench",
]
