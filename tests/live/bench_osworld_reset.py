"""DesktopEnv.reset on drums beside the boot a VM revert stands for, measured in one run.

OSWorld's reset of a used env reverts the VM to its snapshot and starts the emulator again, then
runs the task's setup. drums' reset is a CRIU restore of the image's template checkpoint, then
the same setup. This runs, against one real daemon (base image):

- boot: daemon start until the base template is ready (a cold boot of the desktop from its image,
  then the checkpoint dump) - the work a per-reset boot would repeat;
- reset(task): `DesktopEnv.reset(task_config=e0df059f)`, N times, on one DesktopEnv, as OSWorld's
  run loop calls it (each includes the task's setup, the start gates and the first screenshot);
- reset(): the same without a task (restore, gates, screenshot);
- fork(1): a copy of the desktop mid-task, the drums extra.

The daemon runs with the alive_after_s a user gets (drumsd's default, 5 s) unless
--alive-after-s says otherwise (the live tests use 1.0). It prints a table and writes JSON with
medians and same-run ratios. Usage (root, DRUMS_LIVE=1):
    .venv/bin/python tests/live/bench_osworld_reset.py [--rounds 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import drums
from drums.osworld import DesktopEnv
from drumsd.core.config import Config
from live_daemon import start_live_daemon, stop_and_clean

TASK = Path("/work/shared/osworld/os/e0df059f-28a6-4169-924f-b9623e7184cc.json")


def timed(fn: object) -> float:
    start = time.monotonic()
    fn()  # type: ignore[operator]
    return time.monotonic() - start


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument("--out", default="docs/bench/osworld-reset.json")
    default_alive = Config.model_fields["alive_after_s"].default
    args.add_argument("--alive-after-s", type=float, default=default_alive)
    opts = args.parse_args()
    task = json.loads(TASK.read_text())
    root = Path(tempfile.mkdtemp(prefix="drums-resetbench-"))
    start = time.monotonic()
    daemon = start_live_daemon(root, alive_after_s=opts.alive_after_s)
    boot_s = time.monotonic() - start
    try:
        with drums.connect(daemon.url, token=daemon.token) as client:
            with DesktopEnv(client=client) as env:
                env.reset()  # warm the client and the restore path once, not counted
                with_task = [timed(lambda: env.reset(task_config=task)) for _ in range(opts.rounds)]
                bare = [timed(lambda: env.reset()) for _ in range(opts.rounds)]
                env.reset(task_config=task)
                env.step("pyautogui.click(960, 540)", pause=0)
                forks = []
                for _ in range(opts.rounds):
                    t0 = time.monotonic()
                    with env.fork(1) as copies:
                        copies[0].render()
                        forks.append(time.monotonic() - t0)
            assert client.list_envs() == [], "an env was left"
    finally:
        stop_and_clean(daemon, root / "state", root)
    med = {
        "reset_task_s": statistics.median(with_task),
        "reset_bare_s": statistics.median(bare),
        "fork1_s": statistics.median(forks),
    }
    result = {
        "rounds": opts.rounds,
        "alive_after_s": opts.alive_after_s,
        "task": task["id"],
        "boot_to_template_s": boot_s,
        "reset_task_s": with_task,
        "reset_bare_s": bare,
        "fork1_s": forks,
        "median": med,
        "ratio_boot_over_reset_task": boot_s / med["reset_task_s"],
        "ratio_boot_over_reset_bare": boot_s / med["reset_bare_s"],
    }
    print(f"{'figure (same run)':<48}{'median s':>10}{'boot / this':>13}")
    print(f"{'boot: daemon start to template ready (1 run)':<48}{boot_s:>10.2f}{'1.0':>13}")
    for label, key in (
        ("DesktopEnv.reset(task_config=e0df059f)", "reset_task_s"),
        ("DesktopEnv.reset() (no task)", "reset_bare_s"),
        ("DesktopEnv.fork(1) + screenshot", "fork1_s"),
    ):
        print(f"{label:<48}{med[key]:>10.2f}{boot_s / med[key]:>13.1f}")
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
