"""Try CRIU lazy restore (userfaultfd) on the office template: restores with --lazy-pages and a
`criu lazy-pages` daemon beside each, against plain restores, alternating, in one run (issue 18).
Patches `drumsd.linux.criu.restore_argv` in this process only; writes /tmp/h-bench/lazy.json.
Root, CRIU and the office image. On this host every lazy restore failed (docs/runtime.md)."""

import json
import shlex
import sys
import time
from pathlib import Path

import trio
from drumsd.bench.common import BENCH_LIMITS
from drumsd.linux import criu, mounts
from drumsd.linux.image import find_image
from drumsd.runtime.linux import LinuxRuntimeConfig, open_linux_runtime

STATE = Path("/run/h-bench-lazy")
CRIU = Path("/usr/local/sbin/criu")
plain_argv = criu.restore_argv
LAZY = {"on": False}


def lazy_argv(criu_path, images, work, root, pidfile, **kw):
    argv = plain_argv(criu_path, images, work, root, pidfile, **kw)
    if not LAZY["on"]:
        return argv
    argv = [*argv, "--lazy-pages"]
    lp = [str(criu_path), "lazy-pages", "-D", str(images), "-W", str(work), "-o", "lazy.log", "-v4"]
    script = f"{shlex.join(lp)} & sleep 0.2; exec {shlex.join(argv)}"
    return ["/bin/sh", "-c", script]


criu.restore_argv = lazy_argv


async def main():
    image = find_image("office", Path("/var/cache/drums"))
    cfg = LinuxRuntimeConfig(state_dir=STATE, criu=CRIU, spares_per_checkpoint=0, ksm=False)
    out = {"plain": [], "lazy": []}
    async with open_linux_runtime(cfg) as rt:
        await rt.sweep([])
        ref = await rt.make_template(image.root, image.sha256, "lazy", STATE / "ck")
        for rnd in range(3):
            for mode in ("plain", "lazy"):
                LAZY["on"] = mode == "lazy"
                t0 = time.monotonic()
                try:
                    h = await rt.restore(f"lz-{mode}-{rnd}", ref, BENCH_LIMITS)
                except Exception as exc:
                    print(mode, "FAILED", exc, flush=True)
                    out[mode].append({"error": str(exc)[:2000]})
                    continue
                dt = time.monotonic() - t0
                shot = await rt.screenshot(h)
                row = {"s": round(dt, 3), "phases": h.extra["phases"], "shot_bytes": len(shot)}
                print(mode, json.dumps(row), flush=True)
                out[mode].append(row)
                await rt.destroy(h.slot_id)
    for m in sorted(mounts.mounts_under(STATE), reverse=True):
        mounts.apply([mounts.MountOp("umount", m)])
    return out


STATE.mkdir(parents=True, exist_ok=True)
result = trio.run(main)
Path(sys.argv[1] if len(sys.argv) > 1 else "lazy.json").write_text(json.dumps(result, indent=1))
