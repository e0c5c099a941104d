"""The osworld image beside office, measured in one run: cold boot, template (boot, quiesce,
dump), create (restore until the agent answers), reset (restore path) and idle memory per slot,
each image through the same runtime bench (drumsd.bench.runtime.run_bench), one after the other.

    .venv/bin/python tests/live/bench_osworld_image.py [--cache-root DIR] [--resets N]
        [--out FILE.json]

Prints a table with osworld's p50 over office's for each row and writes both runs to JSON.
Root, CRIU and both images built (`bash scripts/setup.sh office osworld`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trio
from drumsd.bench.runtime import BenchOptions, run_bench

ROWS = (
    ("cold boot", "cold_boot_s"),
    ("template (boot+quiesce+dump)", "template_s"),
    ("create (restore -> agent)", "create_s"),
    ("reset, restore path", "reset_s"),
)


def render(runs: dict[str, dict]) -> str:
    lines = [f"{'':<30} {'office p50':>11} {'osworld p50':>12} {'osworld p99':>12} {'ratio':>7}"]
    for label, key in ROWS:
        office, osworld = runs["office"].get(key), runs["osworld"].get(key)
        if not office or not osworld:
            continue
        ratio = osworld["p50"] / office["p50"] if office["p50"] else float("nan")
        lines.append(
            f"{label:<30} {office['p50']:>9.3f} s {osworld['p50']:>10.3f} s "
            f"{osworld['p99']:>10.3f} s {ratio:>6.2f}x"
        )
    mem = {name: r.get("memory", {}).get("per_slot_mib_no_ksm") for name, r in runs.items()}
    if all(mem.values()):
        lines.append(
            f"{'idle slot memory, no KSM':<30} {mem['office']:>7.1f} MiB {mem['osworld']:>8.1f} MiB"
            f" {'':>12} {mem['osworld'] / mem['office']:>6.2f}x"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-root", type=Path, default=Path("/var/cache/drums"))
    parser.add_argument("--state-dir", type=Path, default=Path("/run/drums-bench-images"))
    parser.add_argument("--resets", type=int, default=20)
    parser.add_argument("--idle-slots", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-osworld-image.json"))
    args = parser.parse_args()

    def progress(msg: str) -> None:
        print(f"bench: {msg}", file=sys.stderr, flush=True)

    runs: dict[str, dict] = {}
    for image in ("office", "osworld"):
        opts = BenchOptions(
            image=image,
            cache_root=args.cache_root,
            state_dir=args.state_dir / image,
            out=args.out,
            resets=args.resets,
            spare_resets=3,  # the bench always measures the spare path; kept short
            steps=5,
            cold_boots=1,
            branches=(),
            idle_slots=args.idle_slots,
            ksm_wait_s=0.0,
        )
        progress(f"image {image}")
        runs[image] = trio.run(run_bench, opts, progress)
    print(render(runs))
    args.out.write_text(json.dumps(runs, indent=1))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
