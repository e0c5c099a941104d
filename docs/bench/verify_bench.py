"""Verify with resident checkers against a fresh checker process per call, same task, same run.

Two real daemons (base image) are started side by side, one with tasks.resident_checkers true and
one with it false; each gets one slot on the OSWorld task e0df059f (exact_match on a shell
command), solved. Then verifies alternate between them (resident, plain, resident, ...), so both
see the same host load. Per verify: wall time at the client, CPU of the daemon's process tree
(its own, its live descendants' and what reaped descendants left in cutime/cstime: the checker
processes, the resident worker and its children), host CPU from /proc/stat (other work on the
host included), and the score. The scores must agree: 1 on the solved slot, and 0 on a second
slot per daemon left undone (verified rounds/5 times each). Prints a table; writes JSON.

  DRUMS_LIVE=1 .venv/bin/python docs/bench/verify_bench.py [--rounds 30] [--out FILE]
(root, CRIU, the base image, the checker venv, /work/shared/osworld or DRUMS_OSWORLD)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "live"))
from live_daemon import http_client, start_live_daemon, stop_and_clean  # noqa: E402

TASK = "e0df059f-28a6-4169-924f-b9623e7184cc"
SOLVE = "mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"
OSWORLD = Path(os.environ.get("DRUMS_OSWORLD", "/work/shared/osworld"))
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its descendants, reaped ones included (cutime/cstime)."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICK
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def host_cpu_s() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # less idle, iowait
    return busy / TICK


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def open_slot(daemon, solved: bool = True) -> str:
    with http_client(daemon) as http:
        r = http.post("/v1/slots", json={"task": TASK})
        r.raise_for_status()
        sid = r.json()["id"]
        if solved:
            step = {"action": {"type": "execute", "command": SOLVE}}
            http.post(f"/v1/slots/{sid}/step", json=step).raise_for_status()
            done = {"action": {"type": "done"}}
            http.post(f"/v1/slots/{sid}/step", json=done).raise_for_status()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            gates = http.get(f"/v1/slots/{sid}/gates").json()["gates"]
            if all(g["status"] != "pending" for g in gates):
                return sid
            time.sleep(0.25)
    raise RuntimeError(f"slot {sid}: gates still pending after 60 s")


def one_verify(daemon, sid: str) -> dict[str, Any]:
    with http_client(daemon) as http:
        cpu0, host0, t0 = tree_cpu_s(daemon.proc.pid), host_cpu_s(), time.monotonic()
        r = http.post(f"/v1/slots/{sid}/verify", json={})
        wall = time.monotonic() - t0
        cpu, host = tree_cpu_s(daemon.proc.pid) - cpu0, host_cpu_s() - host0
    r.raise_for_status()
    body = r.json()
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "host_cpu_s": host,
        "score": body["score"],
        "checker_s": body["audit"]["checker_s"],
        "checker_error": body["checker_error"],
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for key in ("wall_s", "cpu_s", "host_cpu_s", "checker_s"):
        values = [r[key] for r in rows if r[key] is not None]
        out[key] = {
            "p50": statistics.median(values),
            "p99": pct(values, 0.99),
            "mean": statistics.fmean(values),
        }
    out["scores"] = sorted({r["score"] for r in rows}, key=str)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/bench/verify-resident.json")
    args = parser.parse_args()
    os.environ.setdefault("DRUMS_LIVE", "1")
    daemons: dict[str, Any] = {}
    dirs: dict[str, Path] = {}
    states: dict[str, Path] = {}
    try:
        for mode, resident in (("resident", True), ("plain", False)):
            dirs[mode] = Path(tempfile.mkdtemp(prefix=f"drums-verify-bench-{mode}-"))
            # As the live tests' shared daemons: a state dir the slots' users can traverse.
            states[mode] = Path(f"/run/drums-verify-bench-{mode}-{os.getpid()}")
            states[mode].mkdir(mode=0o755, exist_ok=True)
            states[mode].chmod(0o755)
            tasks = {"dirs": [str(OSWORLD)], "resident_checkers": resident}
            started = time.monotonic()
            daemons[mode] = start_live_daemon(
                dirs[mode], image="base", tasks=tasks, state_dir=str(states[mode])
            )
            print(f"{mode}: daemon ready in {time.monotonic() - started:.0f} s", flush=True)
        slots = {mode: open_slot(d) for mode, d in daemons.items()}
        unsolved = {mode: open_slot(d, solved=False) for mode, d in daemons.items()}
        with http_client(daemons["resident"]) as http:
            deadline = time.monotonic() + 300
            while not http.get("/v1/health").json()["pools"]["checkers"].get("ready"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the resident checker worker was not ready in 300 s")
                time.sleep(0.5)
        rows: dict[str, list[dict[str, Any]]] = {"resident": [], "plain": []}
        for n in range(args.warmup + args.rounds):
            for mode in ("resident", "plain"):
                row = one_verify(daemons[mode], slots[mode])
                if row["checker_error"] or row["score"] != 1.0:
                    raise RuntimeError(f"{mode} verify {n}: {row}")
                if n >= args.warmup:
                    rows[mode].append(row)
        # The same task left undone must score 0 on both paths.
        zeros: dict[str, list[float]] = {"resident": [], "plain": []}
        for _ in range(max(1, args.rounds // 5)):
            for mode in ("resident", "plain"):
                row = one_verify(daemons[mode], unsolved[mode])
                if row["checker_error"]:
                    raise RuntimeError(f"{mode} verify of the undone task: {row}")
                zeros[mode].append(row["score"])
        with http_client(daemons["resident"]) as http:
            checkers = http.get("/v1/health").json()["pools"]["checkers"]
    finally:
        for mode, daemon in daemons.items():
            stop_and_clean(daemon, states[mode], dirs[mode])
    result = {
        "task": TASK,
        "image": "base",
        "rounds": args.rounds,
        "host_load_1m_at_end": os.getloadavg()[0],
        "resident": summary(rows["resident"]),
        "plain": summary(rows["plain"]),
        "worker": checkers,
        "scores_undone": zeros,
        "rows": rows,
    }
    res, plain = result["resident"], result["plain"]
    result["ratios_plain_over_resident"] = {
        f"{key}_{q}": plain[key][q] / res[key][q] if res[key][q] else None
        for key in ("wall_s", "cpu_s", "host_cpu_s", "checker_s")
        for q in ("p50", "p99")
    }
    assert res["scores"] == plain["scores"] == [1.0], (res["scores"], plain["scores"])
    assert set(zeros["resident"]) == set(zeros["plain"]) == {0.0}, zeros
    print(f"\nverify of {TASK} (base image), {args.rounds} rounds alternating, same run")
    print(
        f"{'':>10} {'wall p50':>9} {'wall p99':>9} {'CPU p50':>8} {'CPU p99':>8} "
        f"{'host CPU p50':>13} {'checker_s p50':>14}"
    )
    for mode in ("resident", "plain"):
        s = result[mode]
        print(
            f"{mode:>10} {s['wall_s']['p50']:9.3f} {s['wall_s']['p99']:9.3f} "
            f"{s['cpu_s']['p50']:8.3f} {s['cpu_s']['p99']:8.3f} "
            f"{s['host_cpu_s']['p50']:13.3f} {s['checker_s']['p50']:14.3f}"
        )
    r = result["ratios_plain_over_resident"]
    print(
        f"{'ratio':>10} {r['wall_s_p50']:8.1f}x {r['wall_s_p99']:8.1f}x {r['cpu_s_p50']:7.1f}x "
        f"{r['cpu_s_p99']:7.1f}x {r['host_cpu_s_p50']:12.1f}x {r['checker_s_p50']:13.1f}x"
    )
    print(f"undone task: resident scores {zeros['resident']}, plain {zeros['plain']}")
    print(
        f"worker: rss {checkers.get('rss_mib')} MiB, calls {checkers.get('calls')}, "
        f"replaced {checkers.get('replaced')}, fresh-process fallbacks "
        f"{checkers.get('fallback_calls')}"
    )
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
