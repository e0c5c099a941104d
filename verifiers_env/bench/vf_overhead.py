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


# One tool call's path, in order: the model's reply leaves vf-eval's interception server, the
# harness's chat program gets it and calls the tool server over MCP, which pulls the rollout
# state, steps the desktop (with its screenshot), builds the result, pushes the state, answers;
# the chat program builds the next model request and vf-eval's interception server starts the
# next model call. Marks a harness does not make (the `null` harness is verifiers' own program)
# fold into the neighbouring segment.
CHAIN = [
    ("call_end", None),
    ("reply", "interception -> chat program (model reply)"),
    ("mcp_start", "chat program: reply -> MCP call"),
    ("pull_start", "MCP call -> tool server (harness side)"),
    ("pull_end", "state pull (tool server -> vf-eval)"),
    ("stepped", "step + screenshot (daemon)"),
    ("built", "tool result built"),
    ("push_start", "tool server: result -> push"),
    ("push_end", "state push (tool server -> vf-eval)"),
    ("mcp_end", "tool server -> chat program (MCP result)"),
    ("request_start", "chat program: next request built"),
    ("next_call_start", "request -> interception -> next model call"),
]


def read_marks(path: Path) -> dict[str, list[dict[str, Any]]]:
    """DRUMS_PROFILE's marks by name, in time order."""
    marks: dict[str, list[dict[str, Any]]] = {}
    if path.exists():
        for line in sorted(
            (json.loads(x) for x in path.read_text().splitlines()), key=lambda m: m["t"]
        ):
            marks.setdefault(line["what"], []).append(line)
    return marks


def segments(calls: list[dict[str, Any]], marks: dict[str, list[dict]], n: int) -> list[dict]:
    """Per tool call i (answering model call i), the time between consecutive marks of CHAIN;
    a segment after a missing mark holds the missing one's time too."""

    def mark(name: str, i: int) -> float | None:
        found = marks.get(name, [])
        return found[i]["t"] if len(found) > i else None

    out = []
    for i in range(n):
        at = {name: mark(name, i) for name, _ in CHAIN}
        at["call_end"] = calls[i]["time"]["end"]
        at["request_start"] = mark("request_start", i + 1)  # mark 0 is the first request
        at["next_call_start"] = calls[i + 1]["time"]["start"]
        row: dict[str, float] = {}
        last: float | None = None
        for name, label in CHAIN:
            t = at.get(name)
            if t is None:
                continue
            if last is not None and label is not None:
                row[label] = t - last
            last = t
        out.append(row)
    return out


def run_vf_eval(
    url: str,
    token_file: Path,
    task: str,
    clicks: int,
    work: Path,
    *,
    harness: str = "null",
    src: Path | None = None,
    flags: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    from drums_verifiers.testing.mock_policy import MockPolicy

    work.mkdir(parents=True, exist_ok=True)
    script = [{"tool": "computer_click", "arguments": click(i)} for i in range(clicks)]
    policy = MockPolicy({"default": [*script, {"tool": "computer_done", "arguments": {}}]})
    port = policy.serve()
    records = work / "records.jsonl"
    profile = work / "profile.jsonl"
    exe = Path(sys.executable).with_name("vf-eval")
    cmd = [
        str(exe), "drums-verifiers", "-m", "mock-policy", "-r", "1",
        "--client.base-url", f"http://127.0.0.1:{port}/v1", "--client.api-key-var", "BENCH_KEY",
        "--env.agent.harness.id", harness, "--env.agent.runtime.type", "subprocess",
        "--no-push", "--no-rich", "-o", str(work / "out"),
        "--env.taskset.task-ids", json.dumps([task]),
        "--env.taskset.task.daemon.url", url, "--env.taskset.task.daemon.token-file",
        str(token_file), "--env.taskset.task.max-turns", str(clicks + 2), *flags,
    ]  # fmt: skip
    env = {**os.environ, "BENCH_KEY": "unused", "DRUMS_RECORD": str(records),
           "DRUMS_PROFILE": str(profile)}  # fmt: skip
    if src is not None:  # an older drums_verifiers ahead of the installed one (--before-src)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
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

    marks = read_marks(profile)
    per_call = segments(calls, marks, len(gaps))
    labels = [label for _, label in CHAIN if label and any(label in r for r in per_call)]
    t = line["drums"]["timings"]
    return {
        "harness": harness,
        "src": str(src) if src else None,
        "flags": list(flags),
        "wall_s": round(wall, 3),
        "turns": line["drums"]["turns"],
        "create_s": t.get("create"),
        "wait_valid_s": t.get("wait_valid"),
        "first_screenshot_s": t.get("first_screenshot"),
        "tool_desktop_s": [round(x, 4) for x in t.get("tool_calls", [])],
        "tool_round_trip_s": [round(x, 4) for x in gaps],
        "segments_median_s": {k: median([r[k] for r in per_call if k in r]) for k in labels},
        "segments_s": per_call,
        "segments_calls": {k: sum(1 for r in per_call if k in r) for k in labels},
        "screenshot_chars": [m.get("image_chars") for m in marks.get("mcp_end", [])],
        "verify_s": t.get("verify", []),
        "close_s": next((m["close_s"] for m in marks.get("closed", [])), None),
        "vf_setup_s": span("setup"),
        "vf_agent_s": span("agent"),
        "vf_finalize_s": span("finalize"),
    }


def run_sdk(
    url: str, token_file: Path, task: str, clicks: int, shot: dict[str, Any] | None
) -> dict[str, Any]:
    import drums

    out: dict[str, Any] = {"step_screenshot_s": [], "step_then_observe_s": [], "shot": shot}
    if shot:
        out["step_shot_options_s"] = []
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
                if shot:
                    t0 = time.monotonic()
                    env.step({"type": "click", **click(i)}, screenshot=shot)
                    out["step_shot_options_s"].append(round(time.monotonic() - t0, 4))
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


def pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several rounds of one variant as one: the lists joined, the single values listed (the
    table shows medians); the per-call segments recomputed over every call."""
    if len(results) == 1:
        return results[0]
    out: dict[str, Any] = {"rounds": len(results)}
    for key, value in results[0].items():
        if isinstance(value, list):
            out[key] = [x for r in results for x in r.get(key) or []]
        elif isinstance(value, int | float) or value is None:
            out[key] = [r.get(key) for r in results if r.get(key) is not None]
        elif key != "segments_median_s":
            out[key] = value
    per_call = [row for r in results for row in r.get("segments_s", [])]
    if per_call:
        labels = [label for _, label in CHAIN if label and any(label in c for c in per_call)]
        out["segments_median_s"] = {k: median([c[k] for c in per_call if k in c]) for k in labels}
        out["segments_calls"] = {k: sum(1 for c in per_call if k in c) for k in labels}
    return out


def med(v: Any) -> Any:
    return median(v) if isinstance(v, list) else v


def print_table(header: list[str], rows: list[tuple[str, list[Any]]]) -> None:
    width = max(16, *(len(h) for h in header[1:]))
    print(f"{header[0]:44}" + "".join(f" {h:>{width}}" for h in header[1:]))
    for name, values in rows:
        cells = "".join(f" {'-' if v is None else str(v):>{width}}" for v in values)
        print(f"{name:44}{cells}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--token-file", type=Path)
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--clicks", type=int, default=5)
    parser.add_argument(
        "--harness", action="append", help="null (verifiers' own; default) and/or drums-verifiers"
    )
    parser.add_argument(
        "--before-src",
        type=Path,
        help="a directory holding an older drums_verifiers package (e.g. `git archive main "
        "verifiers_env/src | tar -x -C /tmp/before`, then /tmp/before/verifiers_env/src): each "
        "harness also runs with it, before the current code, in the same run",
    )
    parser.add_argument(
        "--flags", default="", help="extra vf-eval flags for the current code's runs (one string)"
    )
    parser.add_argument(
        "--sdk-shot",
        type=json.loads,
        help='screenshot options for a second SDK step, e.g. \'{"format": "jpeg"}\'',
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternate the variants N times")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "vf-overhead.json")
    args = parser.parse_args(argv)
    harnesses = args.harness or ["null"]
    work = Path(tempfile.mkdtemp(prefix="vf-bench-"))
    live = None
    if not args.url:
        sys.path[:0] = [str(REPO / "tests" / "live"), str(REPO / "tests" / "integration")]
        from live_daemon import start_live_daemon

        osworld = REPO.parent / "shared" / "osworld"
        live = start_live_daemon(work / "d", image="base", tasks={"dirs": [str(osworld)]})
        args.url, args.token_file = live.url, live.dir / "token"
    rounds: list[tuple[str, dict[str, Any]]] = []
    sdks: list[dict[str, Any]] = []
    try:
        # Rounds alternate the variants (and the SDK) so that each sees the same foreign load.
        for r in range(args.rounds):
            for harness in harnesses:
                if args.before_src:
                    rounds.append((f"before/{harness}", run_vf_eval(
                        args.url, args.token_file, args.task, args.clicks,
                        work / f"before-{harness}-{r}", harness=harness, src=args.before_src,
                    )))  # fmt: skip
                rounds.append((f"after/{harness}" if args.before_src else harness, run_vf_eval(
                    args.url, args.token_file, args.task, args.clicks,
                    work / f"after-{harness}-{r}", harness=harness, flags=args.flags.split(),
                )))  # fmt: skip
            sdks.append(run_sdk(args.url, args.token_file, args.task, args.clicks, args.sdk_shot))
    finally:
        if live is not None:
            from live_daemon import stop_and_clean

            stop_and_clean(live, work / "d" / "state")
    raw = args.out.with_suffix(".rounds.json")  # kept whatever the report below does
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps({"rounds": rounds, "sdk": sdks}, indent=1) + "\n")
    runs = {name: pooled([v for n, v in rounds if n == name]) for name, _ in rounds}
    sdk = pooled(sdks)
    base = median(sdk["step_screenshot_s"])
    ratios = {
        name: round(med(vf["tool_round_trip_s"]) / base, 3) if base else None
        for name, vf in runs.items()
    }
    if sdk.get("step_shot_options_s"):
        shot = median(sdk["step_shot_options_s"])
        ratios.update(
            {f"{n} over sdk shot options": round(med(vf["tool_round_trip_s"]) / shot, 3)
             for n, vf in runs.items()}
        )  # fmt: skip
    names = list(runs)

    def row(label: str, key: str | None, sdk_value: Any = None) -> tuple[str, list[Any]]:
        values = [med(v[key]) if key else None for v in runs.values()]
        return label, [*values, sdk_value]

    for v in runs.values():
        v["screenshot_chars_median"] = med([c for c in v["screenshot_chars"] if c])
    print_table(
        ["what (seconds, median of the calls)", *names, "SDK alone"],
        [
            row("create (incl. task setup)", "create_s", med(sdk["create_s"])),
            row("validity wait", "wait_valid_s", med(sdk["wait_valid_s"])),
            row("first screenshot", "first_screenshot_s", med(sdk["first_screenshot_s"])),
            row("tool call, round trip", "tool_round_trip_s", base),
            row("tool call, on the desktop", "tool_desktop_s", base),
            row("SDK step with --sdk-shot options", None, med(sdk.get("step_shot_options_s"))),
            row("SDK step, then observe", None, med(sdk["step_then_observe_s"])),
            row("verify", "verify_s", med(sdk["verify_s"])),
            row("close", "close_s", med(sdk["close_s"])),
            row("vf-eval setup span", "vf_setup_s"),
            row("vf-eval agent span", "vf_agent_s"),
            row("vf-eval wall", "wall_s"),
            row("screenshot data URL, characters", "screenshot_chars_median"),
        ],
    )
    print()
    labels = [label for _, label in CHAIN if label]

    def cell(v: dict[str, Any], label: str) -> str | None:
        value, calls = v["segments_median_s"].get(label), v["segments_calls"].get(label)
        if value is None:
            return None
        return f"{value} ({calls})" if calls != max(v["segments_calls"].values()) else str(value)

    print_table(
        ["one tool call's path (seconds, median)", *names],
        [
            (label, [cell(v, label) for v in runs.values()])
            for label in labels
            if any(label in v["segments_median_s"] for v in runs.values())
        ],
    )
    print()
    for name, value in ratios.items():
        print(f"ratio tool round trip / SDK step+screenshot, {name}: {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"task": args.task, "clicks": args.clicks, "vf_eval": runs, "sdk": sdk,
              "ratios": ratios, "host_cpus": os.cpu_count(),
              "load_avg": os.getloadavg()}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
