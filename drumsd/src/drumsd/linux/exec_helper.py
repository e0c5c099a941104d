"""The exec helper: joins a slot's cgroups (and opts into KSM), then execs criu or stage 1. As
CRIU's action script of a `netns_fast` restore (`-L`) it brings lo up in the new net namespace.

A Python `preexec_fn` is unsafe in a threaded daemon, so the joining happens in a tiny program that
runs between fork and the real exec. Restored or booted tasks inherit the cgroups and the
`PR_SET_MEMORY_MERGE` flag. It is C compiled once into the cache dir; without a C compiler an
equivalent `python -S -c` (about 15 ms slower) stands in.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

C_SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <unistd.h>

static void join(const char *procs) {
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || dprintf(fd, "%d\n", getpid()) < 0) {
        fprintf(stderr, "drums-exec: cannot join cgroup %s: %m\n", procs);
        _exit(126);
    }
    close(fd);
}

/* CRIU's setup-namespaces action of a restore with --empty-ns net: lo up in the restored tree's
   fresh net namespace, before its sockets are restored (no `ip`, no iptables-restore). */
static int lo_up(void) {
    const char *action = getenv("CRTOOLS_SCRIPT_ACTION"), *pid = getenv("CRTOOLS_INIT_PID");
    if (!action || strcmp(action, "setup-namespaces")) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/ns/net", pid ? pid : "0");
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET)) {
        fprintf(stderr, "drums-exec: cannot enter %s: %m\n", path);
        return 1;
    }
    struct ifreq req = {0};
    strcpy(req.ifr_name, "lo");
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &req)) goto fail;
    req.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &req)) goto fail;
    return 0;
fail:
    fprintf(stderr, "drums-exec: lo up in %s: %m\n", path);
    return 1;
}

int main(int argc, char **argv) {
    int i = 1, ksm = 0;
    /* CRIU execs an action script with no arguments (-L: the same by hand). */
    if ((argc == 1 && getenv("CRTOOLS_SCRIPT_ACTION")) || (argc == 2 && !strcmp(argv[1], "-L")))
        return lo_up();
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        if (!strcmp(argv[i], "-k")) { ksm = 1; continue; }
        if (!strcmp(argv[i], "-c") && i + 1 < argc) { join(argv[++i]); continue; }
        if (!strcmp(argv[i], "-u") && i + 1 < argc) {
            /* Act as host id N for file creation, keeping capabilities (overlay on idmapped
               layers must be mounted by an id the upper layer maps). */
            unsigned id = (unsigned)strtoul(argv[++i], NULL, 10);
            if (prctl(PR_SET_SECUREBITS, 1 << 2 /* SECBIT_NO_SETUID_FIXUP */, 0, 0, 0)) {
                fprintf(stderr, "drums-exec: securebits: %m\n");
                return 126;
            }
            setfsgid(id);
            setfsuid(id);
            continue;
        }
        if (!strcmp(argv[i], "-M") && i + 2 < argc) {
            if (mount("drums-root", argv[i + 1], "overlay", 0, argv[i + 2])) {
                fprintf(stderr, "drums-exec: overlay on %s (%s): %m\n", argv[i + 1], argv[i + 2]);
                return 125;
            }
            i += 2;
            continue;
        }
        fprintf(stderr,
                "usage: drums-exec -L | [-k] [-u id] [-M dir opts] [-c procs]... [-- prog]\n");
        return 2;
    }
    if (i >= argc) return 0;
    if (ksm && prctl(67 /* PR_SET_MEMORY_MERGE */, 1, 0, 0, 0) != 0)
        fprintf(stderr, "drums-exec: PR_SET_MEMORY_MERGE failed: %m (KSM off for this slot)\n");
    execv(argv[i], argv + i);
    fprintf(stderr, "drums-exec: exec %s: %m\n", argv[i]);
    return 127;
}
"""

PY_SOURCE = (
    "import os,sys,ctypes\n"
    "L=ctypes.CDLL(None,use_errno=True);a=sys.argv[1:];i=0;k=0\n"
    "while i<len(a) and a[i]!='--':\n"
    " if a[i]=='-k':k=1;i+=1\n"
    " elif a[i]=='-u':L.prctl(28,4,0,0,0);L.setfsgid(int(a[i+1]));L.setfsuid(int(a[i+1]));i+=2\n"
    " elif a[i]=='-M':\n"
    "  if L.mount(b'drums-root',a[i+1].encode(),b'overlay',0,a[i+2].encode()):sys.exit(125)\n"
    "  i+=3\n"
    " else:\n"
    "  f=os.open(a[i+1],os.O_WRONLY);os.write(f,b'%d\\n'%os.getpid());os.close(f);i+=2\n"
    "if i>=len(a):sys.exit(0)\n"
    "if k:L.prctl(67,1,0,0,0)\n"
    "os.execv(a[i+1],a[i+1:])\n"
)


def ensure_exec_helper(cache_dir: Path) -> Path | None:
    """Compile the helper into `cache_dir` (keyed by its source hash); None without a compiler."""
    digest = hashlib.sha256(C_SOURCE.encode()).hexdigest()[:12]
    binary = cache_dir / f"drums-exec-{digest}"
    if binary.exists():
        return binary
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    cache_dir.mkdir(parents=True, exist_ok=True)
    src = cache_dir / f"drums-exec-{digest}.c"
    src.write_text(C_SOURCE)
    tmp = binary.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.run([cc, "-O2", "-o", str(tmp), str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {src} failed: {proc.stderr.strip()}")
    os.replace(tmp, binary)
    return binary


def helper_argv(
    helper: Path | None, procs_files: Sequence[Path], ksm: bool, command: Sequence[str]
) -> list[str]:
    """argv that joins `procs_files`, sets KSM if asked, then execs `command` (absolute path)."""
    opts: list[str] = ["-k"] if ksm else []
    for f in procs_files:
        opts += ["-c", str(f)]
    prefix = [str(helper)] if helper else [sys.executable, "-S", "-c", PY_SOURCE]
    return [*prefix, *opts, "--", *command]


def lo_up_script(helper: Path | None) -> str | None:
    """CRIU's `--action-script` of a `netns_fast` restore (execed with no arguments): lo up in
    the new net namespace at setup-namespaces, nothing at the other actions. None without the
    compiled helper (CRIU runs a path, not a command line): such a host restores plainly."""
    return str(helper) if helper else None


def overlay_as_argv(helper: Path | None, fsuid: int, target: Path, options: str) -> list[str]:
    """argv that mounts an overlay at `target` acting as host id `fsuid` (then exits)."""
    prefix = [str(helper)] if helper else [sys.executable, "-S", "-c", PY_SOURCE]
    return [*prefix, "-u", str(fsuid), "-M", str(target), options]
