"""Stage 1: pid 1 of a cold-booted slot, before the desktop's own init.

Run as `python -m drumsd.linux.stage1 --root R ...`: it enters an identity-mapped user namespace
(ids stay the host's, but criu gets every capability over the tree, including the
CAP_SYS_RESOURCE this kind of VM withholds from root and criu needs to read the desktop user's
rlimits) and new mount, pid, net, ipc and uts namespaces, never with a parent-death signal: a
slot must outlive a daemon crash so a restarted daemon can adopt it. As pid 1 it makes the mounts
private, mounts proc, devpts and tmpfs /dev/shm and /tmp, pivots into the overlay root, brings lo
up, closes every inherited fd and execs the desktop init. Nothing of the host (mounts, fds) stays
in the tree, which is what lets CRIU dump it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from drumsd.guest import protocol
from drumsd.linux import mounts, procview, syscalls, sysinfo_preload

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
    p.add_argument(
        "--init-arg",
        action="append",
        default=[],
        help="an argument for the desktop init (repeat; use --init-arg=--app)",
    )
    p.add_argument("--log", default=protocol.INIT_LOG_PATH, help="inside the slot")
    p.add_argument(
        "--uid-base",
        type=int,
        default=None,
        help="hardened: map in-slot ids 0..65535 to host ids from this base",
    )
    p.add_argument(
        "--no-userns",
        action="store_true",
        help="no user namespace: /dev becomes a tmpfs with mknod'ed nodes",
    )
    p.add_argument(
        "--procview",
        default=None,
        help="bind this LXCFS mount's /proc files over the slot's (config procview_dir)",
    )
    p.add_argument(
        "--sysinfo-lib",
        default=None,
        help="host path of the sysinfo() library to preload in the slot (with --procview)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the mount plan and exit")
    return p.parse_args(argv)


IDENTITY_MAP = "0 0 4294967295\n"
NS_FLAGS = (
    syscalls.CLONE_NEWNS
    | syscalls.CLONE_NEWPID
    | syscalls.CLONE_NEWNET
    | syscalls.CLONE_NEWIPC
    | syscalls.CLONE_NEWUTS
)


def _wait_and_exit(pid: int) -> None:
    """An ancestor of the slot init: wait for the child, exit with its status (never returns)."""
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def enter_namespaces(userns: bool, id_map: str = IDENTITY_MAP) -> None:
    """Return in pid 1 of fresh mount/pid/net/ipc/uts namespaces (inside a fresh identity-mapped
    user namespace when `userns`); the ancestors wait and exit with its status. No parent-death
    signal anywhere: the slot outlives a daemon crash."""
    if userns:
        ready_r, ready_w = os.pipe()
        mapped_r, mapped_w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(ready_r)
            os.close(mapped_w)
            syscalls.unshare(syscalls.CLONE_NEWUSER)
            os.write(ready_w, b"u")
            if os.read(mapped_r, 1) != b"m":
                os._exit(111)
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
        else:
            os.close(ready_w)
            os.close(mapped_r)
            os.read(ready_r, 1)
            # No newuidmap here: the (privileged) parent writes the maps itself.
            with open(f"/proc/{child}/uid_map", "w") as f:
                f.write(id_map)
            with open(f"/proc/{child}/gid_map", "w") as f:
                f.write(id_map)
            os.write(mapped_w, b"m")
            _wait_and_exit(child)
    syscalls.unshare(NS_FLAGS)
    init = os.fork()
    if init != 0:
        _wait_and_exit(init)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    userns = not args.no_userns
    # In a user namespace every path is resolved from inside the root: enter it as host root.
    root = "." if userns else args.root
    plan = mounts.plan_stage1(root, args.tmpfs_mib, userns=userns)
    if args.procview:
        plan = procview.with_binds(plan, Path(args.procview), root)
    if args.dry_run:
        print(mounts.render(plan))
        return 0
    # Read on the host side, as host root: the slot's root cannot see this path after the pivot.
    sysinfo_lib = Path(args.sysinfo_lib).read_bytes() if args.sysinfo_lib else None
    if userns:
        os.chdir(args.root)
    if os.getpid() != 1:
        id_map = IDENTITY_MAP if args.uid_base is None else f"0 {args.uid_base} 65536\n"
        enter_namespaces(userns=not args.no_userns, id_map=id_map)
    os.setsid()  # the session leader must be inside the pid namespace for CRIU
    mounts.apply(plan)
    if sysinfo_lib is not None:
        sysinfo_preload.install("", sysinfo_lib)
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
    os.execve(args.init, [args.init, *args.init_arg], SLOT_ENV)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
