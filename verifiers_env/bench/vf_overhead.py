"""Per-rollout overhead of drums-verifiers on a real drumsd, against the SDK doing the same work.

One run, two halves on the same daemon and task:
1. `vf-eval drums-verifiers` (null harness, `drums` tools, a scripted policy): one rollout of
   `--clicks` clicks and `computer_done`. Its record gives create, gate wait, first screenshot,
   each tool call's desktop time (inside the tool server) and verify; its trace gives each tool
   call's round trip as the harness saw it (from the end of one model call to the start of the
   next: the scripted policy answers at once, so the gap is the tool call) and verifiers' spans.
2. The SDK alone: create, wait_valid, observe, the same clicks as `step(screenshot=True)` and as
   `step` + `observe` (two round trips, what the tool did before), verify, close.

Prints a table and writes JSON with the same-run ratios (tool round trip / SDK step+screenshot).
Needs a daemon (`--url`, `--token-file`), or DRUMS_LIVE=1 and root to start one here with the
shared OSWorld tasks (tests/live/live_daemon.py), which it stops and cleans afterwards.

Run: python verifiers_env/bench/vf_overhead.py [--url U --token-file F] [--clicks 5] [--out J]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TASK = "e0df059f-28a6-4169-924f-b9623e7184cc"


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def click(i: int) -> dict[str, Any]:
    return {"x": 200 + 10 * i, "y": 200 + 10 * i}


def run_vf_eval(url: str, token_file: Path, task: str, clicks: int, work: Path) -> dict[str, Any]:
    from drums_verifiers.testing.mock_policy import MockPolicy

    script = [{"tool": "computer_click", "arguments": click(i)} for i in range(clicks)]
    policy = MockPolicy({"default": [*script, {"tool": "computer_done", "arguments": {}}]})
    port = policy.serve()
    records = work / "records.jsonl"
    exe = Path(sys.executable).with_name("vf-eval")
    cmd = [
        str(exe), "drums-verifiers", "-m", "mock-policy", "-r", "1",
        "--client.base-url", f"http://127.0.0.1:{port}/v1", "--client.api-key-var", "BENCH_KEY",
        "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess",
        "--no-push", "--no-rich", "-o", str(work / "out"),
        "--env.taskset.task-ids", json.dumps([task]),
        "--env.taskset.task.daemon.url", url, "--env.taskset.task.daemon.token-file",
        str(token_file), "--env.taskset.task.max-turns", str(clicks + 2),
    ]  # fmt: skip
    env = {**os.environ, "BENCH_KEY": "unused", "DRUMS_RECORD": str(records)}
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    finally:
        policy.close()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"vf-eval failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    (line,) = [json.loads(x) for x in records.read_text().splitlines() if x.strip()]
    (traces_file,) = sorted((work / "out").rglob("traces.jsonl"))[-1:]
    (episode,) = [json.loads(x) for x in traces_file.read_text().splitlines() if x.strip()]
    (trace,) = episode["traces"]
    if not trace["ok"] or line["drums"]["verdict"] != "valid":
        raise SystemExit(f"the rollout did not end valid: {line}")
    calls = trace.get("calls") or []
    gaps = [
        calls[i + 1]["time"]["start"] - calls[i]["time"]["end"]
        for i in range(len(calls) - 1)
        if calls[i]["time"]["end"] and calls[i + 1]["time"]["start"]
    ]
    timing = trace.get("timing", {})

    def span(name: str) -> float | None:
        s = timing.get(name) or {}
        return round(s["end"] - s["start"], 4) if s.get("end") and s.get("start") else None

    t = line["drums"]["timings"]
    return {
        "wall_s": round(wall, 3),
        "turns": line["drums"]["turns"],
        "create_s": t.get("create"),
        "wait_valid_s": t.get("wait_valid"),
        "first_screenshot_s": t.get("first_screenshot"),
        "tool_desktop_s": [round(x, 4) for x in t.get("tool_calls", [])],
        "tool_round_trip_s": [round(x, 4) for x in gaps],
        "verify_s": t.get("verify", []),
        "vf_setup_s": span("setup"),
        "vf_agent_s": span("agent"),
        "vf_finalize_s": span("finalize"),
    }


def run_sdk(url: str, token_file: Path, task: str, clicks: int) -> dict[str, Any]:
    import drums

    out: dict[str, Any] = {"step_screenshot_s": [], "step_then_observe_s": []}
    with drums.connect(url=url, token_file=str(token_file)) as client:
        t0 = time.monotonic()
        env = client.create(task=task, idle_timeout_s=300)
        out["create_s"] = round(time.monotonic() - t0, 4)
        try:
            t0 = time.monotonic()
            env.wait_valid(timeout=120)
            out["wait_valid_s"] = round(time.monotonic() - t0, 4)
            t0 = time.monotonic()
            env.observe()
            out["first_screenshot_s"] = round(time.monotonic() - t0, 4)
            for i in range(clicks):
                t0 = time.monotonic()
                env.step({"type": "click", **click(i)}, screenshot=True)
                out["step_screenshot_s"].append(round(time.monotonic() - t0, 4))
                t0 = time.monotonic()
                env.step({"type": "click", **click(i)})
                env.observe()
                out["step_then_observe_s"].append(round(time.monotonic() - t0, 4))
            t0 = time.monotonic()
            env.verify(strict=False)
            out["verify_s"] = [round(time.monotonic() - t0, 4)]
        finally:
            t0 = time.monotonic()
            env.close()
            out["close_s"] = round(time.monotonic() - t0, 4)
    return out


def table(vf: dict[str, Any], sdk: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    def med(v: Any) -> Any:
        return median(v) if isinstance(v, list) else v

    return [
        ("create (incl. task setup)", vf["create_s"], sdk["create_s"]),
        ("validity wait", vf["wait_valid_s"], sdk["wait_valid_s"]),
        ("first screenshot", vf["first_screenshot_s"], sdk["first_screenshot_s"]),
        ("tool call, round trip (median)", med(vf["tool_round_trip_s"]),
         med(sdk["step_screenshot_s"])),
        ("tool call, on the desktop (median)", med(vf["tool_desktop_s"]),
         med(sdk["step_screenshot_s"])),
        ("SDK step, then observe (median)", None, med(sdk["step_then_observe_s"])),
        ("verify", med(vf["verify_s"]), med(sdk["verify_s"])),
        ("close", None, sdk["close_s"]),
        ("vf-eval setup / agent / finalize span",
         f"{vf['vf_setup_s']} / {vf['vf_agent_s']} / {vf['vf_finalize_s']}", None),
        ("vf-eval wall", vf["wall_s"], None),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--token-file", type=Path)
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--clicks", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "vf-overhead.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vf-bench-"))
    live = None
    if not args.url:
        sys.path[:0] = [str(REPO / "tests" / "live"), str(REPO / "tests" / "integration")]
        from live_daemon import start_live_daemon

        osworld = REPO.parent / "shared" / "osworld"
        live = start_live_daemon(work / "d", image="base", tasks={"dirs": [str(osworld)]})
        args.url, args.token_file = live.url, live.dir / "token"
    try:
        vf = run_vf_eval(args.url, args.token_file, args.task, args.clicks, work)
        sdk = run_sdk(args.url, args.token_file, args.task, args.clicks)
    finally:
        if live is not None:
            from live_daemon import stop_and_clean

            stop_and_clean(live, work / "d" / "state")
    rows = table(vf, sdk)
    rt, base = median(vf["tool_round_trip_s"]), median(sdk["step_screenshot_s"])
    ratios = {
        "tool_round_trip_over_sdk_step_screenshot": round(rt / base, 3) if rt and base else None,
        "tool_round_trip_over_sdk_step_then_observe": round(
            rt / median(sdk["step_then_observe_s"]), 3
        )
        if rt
        else None,
    }
    print(f"{'what (seconds, one run)':40} {'vf-eval rollout':>22} {'SDK alone':>10}")
    for name, a, b in rows:
        print(f"{name:40} {'-' if a is None else a!s:>22} {'-' if b is None else b!s:>10}")
    for name, value in ratios.items():
        print(f"ratio {name}: {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"task": args.task, "clicks": args.clicks, "vf_eval": vf, "sdk": sdk,
              "ratios": ratios, "host_cpus": os.cpu_count()}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
