"""Where a step's CPU goes, by process (README, issue 35): one daemon per variant (damage, full,
damage-noboost: `python docs/bench/step_cpu_by_process.py damage damage-noboost full` as root,
from the repository, OUT=file.json), one episode per task one at a time, the CPU (utime+stime
from /proc/<pid>/stat) of every process on the host read before and after the 20 steps (each with
its screenshot), grouped: the slot's processes (by the daemon's cgroup: the app, the guest agent,
Xvfb), the daemon, this client, ksmd; other processes apart. The first round of episodes captures
the task checkpoints and is not counted."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from drumsd.bench.episode_options import EpisodeBenchOptions
from drumsd.bench.episodes import scripted_action, task_mix
from drumsd.bench.episodes_host import BenchDaemon

TICK = os.sysconf("SC_CLK_TCK")
APPS = ("soffice", "gimp", "chrom", "xterm", "nautilus", "evince", "gedit")


def snapshot() -> dict[int, tuple[str, float]]:
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        try:
            cg = next(
                (
                    line.split(":", 2)[2]
                    for line in (d / "cgroup").read_text().splitlines()
                    if ":pids:" in line
                ),
                "",
            )
        except OSError:
            cg = ""
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        f = stat[stat.rindex(")") + 2 :].split()
        out[(int(d.name), f[19])] = (f"{comm}|{cg}|{cmd[:200]}", (int(f[11]) + int(f[12])) / TICK)
    return out


SLOT = {"id": ""}


def category(name: str, pid: int, daemon_pid: int) -> str:
    comm, cg, cmd = name.split("|", 2)
    if comm == "ksmd":
        return "ksmd"
    if pid == os.getpid():
        return "client (this script)"
    if pid == daemon_pid:
        return "daemon"
    if not SLOT["id"] or SLOT["id"] not in cg:
        return "other (not this daemon's slots)"
    if comm == "desktop-init" and "/opt/drums/guest/desktop-init" in cmd:
        return "guest agent (desktop-init's fork) + init"
    if comm == "ksmd":
        return "ksmd"
    if comm == "Xvfb":
        return "Xvfb"
    if "/opt/drums/guest/agent" in cmd:
        return "guest agent"
    if "/opt/drums/guest/worker" in cmd:
        return "action worker"
    if any(a in comm.lower() or a in cmd.lower()[:80] for a in APPS):
        return "app"
    return f"other:{comm}"


def delta(a, b, daemon_pid):
    by = defaultdict(float)
    for key, (name, cpu) in b.items():
        base = a.get(key)
        d = cpu - (base[1] if base is not None else 0.0)
        if d > 0:
            cat = category(name, key[0], daemon_pid)
            by[cat if base is not None else f"new: {cat}"] += d
    return dict(by)


def main() -> None:
    import drums

    steps = 20
    opts = EpisodeBenchOptions(state_root=Path("/run/h7-stepprof"))
    tasks = task_mix(opts)
    results = {"loadavg_start": os.getloadavg(), "steps": steps, "runs": {}}
    variants = {
        "damage": {},
        "full": {"linux": {"screen_grab": "full"}},
        "damage-noboost": {"ksm": {"boost_s": 0.0}},
    }
    for grab in sys.argv[1:] or ["damage", "full"]:
        daemon = BenchDaemon.configure(f"prof-{grab}", opts, variants[grab])
        rows = []
        try:
            print(f"{grab}: template ...", flush=True)
            daemon.start()
            import hashlib

            state = Path(daemon.config["state_dir"]).resolve()
            SLOT["id"] = "/drums-" + hashlib.sha256(str(state).encode()).hexdigest()[:8] + "/"
            with drums.connect(daemon.url, token=daemon.token) as client:
                for rnd in range(2):  # round 0: the task checkpoint's capture; round 1 measured
                    for task in tasks:
                        env = client.create(task=task)
                        try:
                            for i in range(2):
                                env.step(scripted_action(i), screenshot=True)
                            time.sleep(1.0)
                            a, t0 = snapshot(), time.monotonic()
                            shots = []
                            for i in range(steps):
                                t = time.monotonic()
                                env.step(scripted_action(i), screenshot=True)
                                shots.append(time.monotonic() - t)
                            wall = time.monotonic() - t0
                            b = snapshot()
                        finally:
                            env.close()
                        if rnd == 1:
                            d = delta(a, b, daemon.proc.pid)
                            rows.append(
                                {
                                    "task": task,
                                    "wall_s": round(wall, 3),
                                    "cpu_s": d,
                                    "step_p50_ms": round(sorted(shots)[steps // 2] * 1000, 1),
                                }
                            )
                            top = sorted(d.items(), key=lambda kv: -kv[1])[:8]
                            print(
                                grab,
                                task[:10],
                                round(wall, 2),
                                {k: round(v, 3) for k, v in top},
                                flush=True,
                            )
        finally:
            daemon.stop(keep_logs=False)
        results["runs"][grab] = rows
    results["loadavg_end"] = os.getloadavg()
    Path(os.environ.get("OUT", "step-cpu-by-process.json")).write_text(
        json.dumps(results, indent=1)
    )


if __name__ == "__main__":
    main()
