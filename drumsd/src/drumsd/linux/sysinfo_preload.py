"""`sysinfo(2)` from the slot's /proc view (config `procview_dir`): a small library preloaded in
every process of a slot (`/etc/ld.so.preload` in its root) answers `sysinfo()`,
`sysconf(_SC_PHYS_PAGES/_SC_AVPHYS_PAGES)` and `get_phys_pages()`/`get_avphys_pages()` from the
slot's own /proc/meminfo, uptime and loadavg (LXCFS's, bound there by stage 1), where a file system
cannot reach a system call. It answers from /proc only while /proc/meminfo is a FUSE file (the
view); otherwise, and when a read fails, it returns the kernel's figures unchanged.

Why not eBPF: rewriting the caller's struct from the kernel needs `bpf_probe_write_user`, which a
kernel in lockdown (integrity, forced by this host's build and the default under Secure Boot on
common distributions) refuses to any program ("program of this type cannot use helper
bpf_probe_write_user#36", seen here on 6.18). A statically linked program, or one that makes the
system call itself (Go), still reads the host's figures.

Stage 1 writes the library into the template's root, so every checkpoint made from it holds it
(in its upper layer) and restores, forks and saved states keep it with no step of their own. It is
C compiled once into the cache dir, keyed by its source's hash, like the exec helper.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

# Inside the slot.
LIB_PATH = "/usr/lib/drums/libdrums-sysinfo.so"
PRELOAD_FILE = "/etc/ld.so.preload"

C_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/vfs.h>
#include <unistd.h>

#define FUSE_SUPER_MAGIC 0x65735546

static ssize_t slurp(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    ssize_t r = 0;
    while (got < size - 1 && (r = read(fd, buf + got, size - 1 - got)) > 0) got += (size_t)r;
    close(fd);
    buf[got] = 0;
    return r < 0 ? -1 : (ssize_t)got;
}

static unsigned long long number(const char **p) {
    unsigned long long v = 0;
    while (**p == ' ' || **p == '\t') (*p)++;
    while (**p >= '0' && **p <= '9') v = v * 10 + (unsigned long long)(*(*p)++ - '0');
    return v;
}

/* "Key:   123 kB" at a line start, in bytes; -1 when absent. */
static long long kb_field(const char *text, const char *key) {
    size_t n = strlen(key);
    const char *line = text;
    while (line && *line) {
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            const char *p = line + n + 1;
            return (long long)(number(&p) * 1024ULL);
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    return -1;
}

/* "12.34" as 1/65536 fixed point (the kernel's loads), or whole seconds rounded up. */
static unsigned long long fixed(const char **p, int shift) {
    unsigned long long whole = number(p), frac = 0, scale = 1;
    if (**p == '.') {
        (*p)++;
        while (**p >= '0' && **p <= '9') {
            if (scale < 1000000) {
                frac = frac * 10 + (unsigned long long)(**p - '0');
                scale *= 10;
            }
            (*p)++;
        }
    }
    if (shift) return (whole << shift) + (frac << shift) / scale;
    return whole + (frac ? 1 : 0);
}

static void from_view(struct sysinfo *info) {
    struct statfs fs;
    char buf[4096];
    if (statfs("/proc/meminfo", &fs) != 0 || fs.f_type != FUSE_SUPER_MAGIC) return;
    if (slurp("/proc/meminfo", buf, sizeof buf) <= 0) return;
    long long total = kb_field(buf, "MemTotal"), free_ = kb_field(buf, "MemFree");
    if (total <= 0 || free_ < 0) return;
    long long shared = kb_field(buf, "Shmem"), buffers = kb_field(buf, "Buffers");
    long long swap = kb_field(buf, "SwapTotal"), swap_free = kb_field(buf, "SwapFree");
    info->mem_unit = 1;
    info->totalram = (unsigned long)total;
    info->freeram = (unsigned long)free_;
    info->sharedram = shared > 0 ? (unsigned long)shared : 0;
    info->bufferram = buffers > 0 ? (unsigned long)buffers : 0;
    info->totalswap = swap > 0 ? (unsigned long)swap : 0;
    info->freeswap = swap_free > 0 ? (unsigned long)swap_free : 0;
    info->totalhigh = 0;
    info->freehigh = 0;
    if (slurp("/proc/uptime", buf, sizeof buf) > 0) {
        const char *p = buf;
        info->uptime = (long)fixed(&p, 0);
    }
    if (slurp("/proc/loadavg", buf, sizeof buf) > 0) {
        const char *p = buf;
        for (int i = 0; i < 3; i++) info->loads[i] = (unsigned long)fixed(&p, SI_LOAD_SHIFT);
        number(&p);
        if (*p == '/') {
            p++;
            unsigned long long procs = number(&p);
            info->procs = (unsigned short)(procs > 0xffff ? 0xffff : procs);
        }
    }
}

int sysinfo(struct sysinfo *info) {
    long r = syscall(SYS_sysinfo, info);
    if (r == 0) {
        int saved = errno;
        from_view(info);
        errno = saved;
    }
    return (int)r;
}

static long pages(int avail) {
    struct sysinfo info;
    if (sysinfo(&info) != 0) return -1;
    long size = getpagesize();
    unsigned long long bytes = (unsigned long long)(avail ? info.freeram : info.totalram);
    return (long)(bytes * info.mem_unit / (unsigned long long)size);
}

long get_phys_pages(void) { return pages(0); }
long get_avphys_pages(void) { return pages(1); }

long sysconf(int name) {
    static long (*real)(int);
    if (name == _SC_PHYS_PAGES) return pages(0);
    if (name == _SC_AVPHYS_PAGES) return pages(1);
    if (!real) real = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
    return real ? real(name) : -1;
}
"""

DIGEST = hashlib.sha256(C_SOURCE.encode()).hexdigest()[:12]


class SysinfoLibError(RuntimeError):
    """The library cannot be built: the message says what is missing and what to do."""


def ensure_lib(cache_dir: Path) -> Path:
    """The library compiled into `cache_dir` (keyed by its source's hash), built if absent."""
    lib = cache_dir / f"libdrums-sysinfo-{DIGEST}.so"
    if lib.exists():
        return lib
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SysinfoLibError(
            "procview_dir is set but there is no C compiler to build the sysinfo() library; "
            "`apt-get install gcc` (scripts/prepare-host.sh does) or set procview_dir: null"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    src = cache_dir / f"libdrums-sysinfo-{DIGEST}.c"
    src.write_text(C_SOURCE)
    tmp = lib.with_suffix(f".tmp{os.getpid()}")
    argv = [cc, "-O2", "-shared", "-fPIC", "-Wall", "-o", str(tmp), str(src), "-ldl"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SysinfoLibError(f"compiling {src} failed: {proc.stderr.strip()[-500:]}")
    tmp.chmod(0o755)
    os.replace(tmp, lib)
    return lib


def preload_text(existing: str) -> str:
    """/etc/ld.so.preload with the library listed once (other entries kept)."""
    lines = [ln for ln in existing.splitlines() if ln.strip() and ln.strip() != LIB_PATH]
    return "\n".join([*lines, LIB_PATH]) + "\n"


def install(root: str, lib_bytes: bytes) -> None:
    """Stage 1, inside the slot (after pivot_root): write the library and list it in
    /etc/ld.so.preload, so every process the desktop init starts loads it."""
    lib = Path(root + LIB_PATH)
    lib.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    lib.write_bytes(lib_bytes)
    lib.chmod(0o755)
    preload = Path(root + PRELOAD_FILE)
    try:
        existing = preload.read_text()
    except FileNotFoundError:
        existing = ""
    preload.write_text(preload_text(existing))
    preload.chmod(0o644)
