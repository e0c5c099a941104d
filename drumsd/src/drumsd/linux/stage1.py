"""Stage 1: pid 1 of a cold-booted slot, before the desktop's own init.

Run as `unshare --pid --fork --mount --net --ipc --uts --propagation private python -m
drumsd.linux.stage1 --root R ...` (never `--kill-child`: a slot must outlive a daemon crash so a
restarted daemon can adopt it). It makes the slot's mounts private, mounts proc, a minimal /dev and
/tmp, pivots into the overlay root, brings lo up, closes every inherited fd and execs the desktop
init. Nothing of the host (mounts, fds) stays in the tree, which is what lets CRIU dump it.
"""

from __future__ import annotations

import argparse
import os
import sys

from drumsd.linux import mounts, syscalls

DESKTOP_INIT = "/opt/drums/guest/desktop-init"
SLOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "xterm",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="drums-stage1")
    p.add_argument("--root", required=True, help="the slot's overlay root, host path")
    p.add_argument("--tmpfs-mib", type=int, default=1024)
    p.add_argument("--hostname", default="drums")
    p.add_argument("--init", default=DESKTOP_INIT)
    p.add_argument("--log", default="/var/log/desktop-init.log", help="inside the slot")
    p.add_argument("--dry-run", action="store_true", help="print the mount plan and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    plan = mounts.plan_stage1(args.root, args.tmpfs_mib)
    if args.dry_run:
        print(mounts.render(plan))
        return 0
    if os.getpid() != 1:
        print("stage1 must run as pid 1 of a new pid namespace (unshare --pid --fork)",
              file=sys.stderr)
        return 2
    os.setsid()  # the session leader must be inside the pid namespace for CRIU
    mounts.apply(plan)
    syscalls.sethostname(args.hostname)
    syscalls.link_up("lo")
    os.closerange(3, 65536)
    null = os.open("/dev/null", os.O_RDONLY)
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.execve(args.init, [args.init], SLOT_ENV)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
