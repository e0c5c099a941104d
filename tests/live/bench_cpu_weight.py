"""A restore under CPU load with and without `restore_cpu_weight`, in one run on one runtime.

Two slots each spin a busy loop as the desktop user (each on its 1-vcpu quota: together they
hold both cores of a 2-core host), then restores of the base image are timed, alternating
between no restore weight (today's: the restoring slot weighs as much as each hog) and
`--weight` shares. Spares are off, so every round is a CRIU restore; each restored slot is
destroyed before the next. Prints p50 / mean of the restore's wall time (until its agent
answers) and of its CRIU phase, per setting. Usage (root, DRUMS_LIVE=1, the base image built):
    .venv/bin/python tests/live/bench_cpu_weight.py [--rounds 8] [--weight 16384]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import trio
from drumsd.core.seams import SlotLimits
from drumsd.linux import procfs
from drumsd.linux.image import find_image
from drumsd.linux.process_trees import cpu_seconds
from drumsd.runtime.linux import LinuxRuntimeConfig, open_linux_runtime

LIMITS = SlotLimits(vcpus=1.0, memory_mib=2048, pids_max=1024, tmpfs_mib=512)
HOG = "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &"


async def bench(rounds: int, weight: int, top: Path) -> dict[str, dict[str, list[float]]]:
    image = find_image("base", Path("/var/cache/drums"))
    config = LinuxRuntimeConfig(state_dir=top / "state", spares_per_checkpoint=0)
    (top / "state").mkdir()
    out: dict[str, dict[str, list[float]]] = {}
    async with open_linux_runtime(config) as rt:
        ck = await rt.make_template(image.root, image.sha256, "bench-w", top / "ck")
        hogs = [await rt.restore(f"hog{n}", ck, LIMITS) for n in range(2)]
        for hog in hogs:
            await rt.exec_user(hog, HOG, 10)
        await trio.sleep(2)
        t0 = time.monotonic()
        for i in range(rounds):
            for name, value in (("null", None), (str(weight), weight)):
                rt.restorer.config = dataclasses.replace(config, restore_cpu_weight=value)
                h = await rt.restore(f"w{i}", ck, LIMITS)
                got = out.setdefault(name, {"restore_s": [], "criu_s": []})
                got["restore_s"].append(h.restore_s)
                got["criu_s"].append(float(h.extra.get("phases", {}).get("criu", 0.0)))
                await rt.destroy(f"w{i}")
        spun = time.monotonic() - t0
        for n, hog in enumerate(hogs):  # what the hogs took of the CPU over the timed rounds
            ticks = sum(t for _, _, t in procfs.activity(rt.driver.pids(hog.cgroups)))
            print(f"hog{n}: {cpu_seconds(ticks):.1f} CPU s in {spun:.1f} s")
            await rt.destroy(f"hog{n}")
        await rt.sweep([])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--weight", type=int, default=16384)
    args = ap.parse_args()
    top = Path(tempfile.mkdtemp(prefix="drums-bench-w-", dir="/run"))
    try:
        out = trio.run(bench, args.rounds, args.weight, top)
    finally:
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
            if line.split()[4].startswith(str(top)):
                subprocess.run(["umount", "-l", line.split()[4]], check=False)
        shutil.rmtree(top, ignore_errors=True)
    for name, got in out.items():
        cells = ", ".join(
            f"{k} p50 {statistics.median(v):.3f} mean {statistics.fmean(v):.3f} max {max(v):.3f}"
            for k, v in got.items()
        )
        print(f"restore_cpu_weight={name} (n={len(got['restore_s'])}): {cells}")


if __name__ == "__main__":
    main()
