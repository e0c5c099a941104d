"""Reset through a warm spare, before and after a change, in one run (issue 18, the spare p99).

Alternates blocks of claims between two source trees of drumsd (`--before-src`, e.g. an export
of main, and this checkout), each block a fresh Linux runtime on the office image with two spares
of its template and KSM on (as `drumsd bench` runs its spare phase), one reset every
`--interval` s. The blocks alternate so the host's load falls on both sides alike. Per claim it
records the wall time of the reset, whether a spare served it and, where the code times them,
the claim's steps (owner record, thaw, agent answer). Prints p50/p90/p99 and writes JSON.

    git archive <commit> drumsd/src sdk/src | tar -x -C /tmp/before
    .venv/bin/python docs/bench/spare_claims.py --before-src /tmp/before --out FILE.json
Root, CRIU and the office image (scripts/setup.sh).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def block(claims: int, interval: float, state: Path) -> None:
    """One block, in this process: print a JSON line per claim."""
    import shutil

    import trio
    from drumsd.bench.common import BENCH_LIMITS
    from drumsd.linux import mounts
    from drumsd.linux.image import find_image
    from drumsd.runtime.linux import LinuxRuntimeConfig, open_linux_runtime

    image = find_image("office", Path("/var/cache/drums"))
    state.mkdir(parents=True, exist_ok=True)

    async def run() -> None:
        cfg = LinuxRuntimeConfig(
            state_dir=state,
            criu=Path("/usr/local/sbin/criu"),
            ksm=True,
            ksm_pages_to_scan=5000,
            ksm_sleep_millisecs=10,
            spares_per_checkpoint=2,
        )
        async with open_linux_runtime(cfg) as rt:
            await rt.sweep([])
            ref = await rt.make_template(image.root, image.sha256, "claims", state / "template")
            rt.enable_spares(ref, BENCH_LIMITS)
            with trio.fail_after(120):
                while rt.spare_counts().get(ref.id, 0) < 2:  # noqa: ASYNC110 (polls the pool)
                    await trio.sleep(0.1)
            h = await rt.restore("claims-s", ref, BENCH_LIMITS)
            for _ in range(claims):
                await trio.sleep(interval)
                load = os.getloadavg()[0]
                t0 = time.monotonic()
                h = await rt.reset(h, ref, BENCH_LIMITS)
                row = {"s": round(time.monotonic() - t0, 4), "spare": h.extra.get("spare")}
                row["load1"] = load
                phases = h.extra.get("phases", {})
                row.update({k: v for k, v in phases.items() if k.startswith("claim_")})
                print(json.dumps(row), flush=True)
            await rt.destroy(h.slot_id)
            await rt.drop_spares(ref.id)

    try:
        trio.run(run)
    finally:
        for m in sorted(mounts.mounts_under(state), reverse=True):
            mounts.apply([mounts.MountOp("umount", m)])
        shutil.rmtree(state, ignore_errors=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summarize(rows: list[dict]) -> dict:
    s = [r["s"] for r in rows]
    out: dict = {
        "n": len(s),
        "p50": pct(s, 50),
        "p90": pct(s, 90),
        "p99": pct(s, 99),
        "max": max(s),
        "misses": sum(1 for r in rows if not r["spare"]),
        "load1_mean": round(sum(r["load1"] for r in rows) / len(rows), 1),
    }
    for k in ("claim_owner", "claim_thaw", "claim_agent"):
        v = [r[k] for r in rows if k in r]
        if v:
            out[k] = {"p50": pct(v, 50), "p99": pct(v, 99)}
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--before-src", type=Path, help="a tree with drumsd/src and sdk/src")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--claims", type=int, default=30, help="claims per block")
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=Path("spare-claims.json"))
    p.add_argument("--block", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    state = Path(f"/run/drums-spare-claims-{os.getpid()}")
    if args.block:
        block(args.claims, args.interval, state)
        return 0
    if args.before_src is None:
        p.error("--before-src is required (an export of the tree to compare against)")
    rows: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for side in ("before", "after"):
            env = dict(os.environ)
            if side == "before":
                env["PYTHONPATH"] = f"{args.before_src}/drumsd/src:{args.before_src}/sdk/src"
            else:
                env.pop("PYTHONPATH", None)
            argv = [sys.executable, str(HERE), "--block", "--claims", str(args.claims)]
            argv += ["--interval", str(args.interval)]
            out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            rows[side] += [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
            print(f"{side}: {len(rows[side])} claims", file=sys.stderr, flush=True)
    result = {side: summarize(r) for side, r in rows.items()}
    result["ratio_before_over_after"] = {
        q: round(result["before"][q] / result["after"][q], 2) for q in ("p50", "p90", "p99")
    }
    result["options"] = {"rounds": args.rounds, "claims": args.claims, "interval": args.interval}
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps({**result, "claims": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
