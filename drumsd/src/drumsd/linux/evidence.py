"""Gate evidence read from /proc and the slot's upper layer, with the parsing kept pure.

The runtime reports raw facts (mountinfo lines, pids, namespace inodes); the gates need them in a
comparable form: a mount table as `"<mount point> <fstype>"` entries, the mount table a slot must
have (derived from the same stage-1 plan that built the template), a manifest of an upper layer
to compare the restored copy against the checkpoint's snapshot, process names and host uids.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from drumsd.linux import beneath, sparse
from drumsd.linux.mounts import plan_stage1
from drumsd.linux.procview import expected_mounts as procview_mounts

# Written by the restored tree itself before the first gate read: the guest agent's log (every
# ping appends) and the devpts ptmx node that criu's restore recreates in the upper layer.
# Never part of the state an agent or a checker sees.
VOLATILE_UPPER = ("run/drums/log/*", "dev/ptmx")


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str
    options: str


def parse_mountinfo_line(line: str) -> Mount:
    """One /proc/<pid>/mountinfo line (proc(5)): fields, optional fields, '-', fstype, source."""
    head, sep, tail = line.partition(" - ")
    if not sep:
        raise ValueError(f"not a mountinfo line: {line!r}")
    fields, rest = head.split(), tail.split()
    return Mount(
        mount_point=_unescape(fields[4]),
        fstype=rest[0],
        source=_unescape(rest[1]) if len(rest) > 1 else "",
        options=fields[5],
    )


def _unescape(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 4 <= len(text) and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def mount_entries(lines: Iterable[str]) -> list[str]:
    """mountinfo lines -> sorted "<mount point> <fstype>" (ids and options change per restore)."""
    entries = []
    for line in lines:
        if line.strip():
            m = parse_mountinfo_line(line)
            entries.append(f"{m.mount_point} {m.fstype}")
    return sorted(entries)


def expected_slot_mounts(root_fstype: str = "overlay", *, procview: bool = False) -> list[str]:
    """The mount table of a restored slot: its root plus what stage 1 mounted before pivot_root
    (criu restores exactly the template's table, and the template was booted by that plan), and
    the /proc view's binds when it is on."""
    root = "/drums-slot-root"
    entries = {f"/ {root_fstype}", *(procview_mounts() if procview else ())}
    for op in plan_stage1(root, 64):
        if op.kind == "mount" and op.fstype and op.target.startswith(root + "/"):
            entries.add(f"{op.target[len(root) :]} {op.fstype}")
    return sorted(entries)


# --- upper layer manifests -----------------------------------------------------------------------


def upper_manifest(root: Path, volatile: Sequence[str] = VOLATILE_UPPER) -> dict[str, str]:
    """relative path -> signature (type, mode, owner, size, content hash or link target, overlay
    xattrs), skipping `volatile` globs. Owners are as stored on disk (in-slot ids).

    A live upper is the desktop user's to change while it is read: it is walked beneath `root`
    by directory fds, no link followed anywhere, and a file is hashed only if what was opened
    (O_NOFOLLOW, O_NONBLOCK) is the regular file that was listed (issue 39, D4)."""
    out: dict[str, str] = {}
    for rel_dir, dirs, others, dir_fd in beneath.walk_beneath(root, ""):
        for name in sorted(dirs + others):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if any(fnmatch.fnmatchcase(rel, g) for g in volatile):
                continue
            try:
                out[rel] = _signature(dir_fd, name)
            except FileNotFoundError:
                continue  # removed or replaced while walking: the caller compares again later
    return out


def _signature(dir_fd: int, name: str) -> str:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    parts = [f"{st.st_mode:o}", str(st.st_uid), str(st.st_gid)]
    if stat.S_ISLNK(st.st_mode):
        parts.append("->" + os.readlink(name, dir_fd=dir_fd))
    elif stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            raise FileNotFoundError(name) from exc  # replaced by a link or gone
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or now.st_ino != st.st_ino:
                raise FileNotFoundError(name)  # replaced since it was listed
            sparse.hash_file(fd, st.st_size, h)  # a hole is not read: see linux/sparse.py
        finally:
            os.close(fd)
        parts += [str(st.st_size), h.hexdigest()]
    elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        parts.append(f"dev={os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
    # The directory's fd pins where `name` is looked up; the name itself is not followed.
    path = f"/proc/self/fd/{dir_fd}/{name}"
    try:
        for attr in sorted(os.listxattr(path, follow_symlinks=False)):
            if attr.startswith("trusted.overlay.opaque"):
                parts.append(f"{attr}={os.getxattr(path, attr, follow_symlinks=False)!r}")
    except OSError:
        pass
    return " ".join(parts)


def manifest_diff(have: Mapping[str, str], want: Mapping[str, str]) -> dict[str, list[str]]:
    """Entries added, removed or changed in `have` compared to `want`."""
    return {
        "added": sorted(set(have) - set(want)),
        "removed": sorted(set(want) - set(have)),
        "changed": sorted(k for k in set(have) & set(want) if have[k] != want[k]),
    }


def split_written_since(
    diff: Mapping[str, list[str]], root: Path, since: float
) -> tuple[dict[str, list[str]], list[str]]:
    """(the diff without entries touched at or after `since`, those entries). Added and changed
    entries are judged by their own inode, removed ones by their parent directory (a removal
    changes it); when that is gone too (a removed subtree, or an added temp file removed since
    the manifest was read), by the nearest ancestor still there.

    "Touched" is the later of mtime and ctime: a rename keeps a file's mtime (an app rotating
    its files would look old) and so does `cp -p`, but both set ctime to now. The copy of the
    snapshot into the slot's upper sets every ctime at copy time, so `since` must be taken after
    that copy (e.g. when criu starts): a change made to the copy before then stays a mismatch."""
    kept: dict[str, list[str]] = {}
    written: list[str] = []
    for kind, paths in diff.items():
        kept[kind] = []
        for rel in paths:
            probe = root / rel if kind != "removed" else (root / rel).parent
            recent = _touched_at(_nearest_existing(root, probe)) >= since
            (written if recent else kept[kind]).append(rel)
    return kept, sorted(written)


# (inode, path as the mapping process sees it) of the files a tree maps shared and writable
SharedMaps = frozenset[tuple[int, str]]


def parse_shared_writable_maps(text: str) -> set[tuple[int, str]]:
    """(inode, path) of each `rw-s`/`-w-s` file mapping in a /proc/<pid>/maps text; a deleted
    file's mapping (its path ends " (deleted)") and anonymous or special ones are left out."""
    out = set()
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or len(fields[1]) < 4:
            continue
        perms, inode, path = fields[1], fields[4], fields[5]
        if perms[1] != "w" or perms[3] != "s" or not path.startswith("/") or inode == "0":
            continue
        if path.endswith(" (deleted)"):
            continue
        out.add((int(inode), path))
    return out


def shared_writable_maps(pids: Iterable[int]) -> SharedMaps:
    """The files the processes `pids` map shared and writable (a process gone, or whose maps
    cannot be read, adds none)."""
    out: set[tuple[int, str]] = set()
    for pid in pids:
        text = read_text(f"/proc/{pid}/maps")
        if text:
            out |= parse_shared_writable_maps(text)
    return frozenset(out)


def split_mapped(
    diff: Mapping[str, list[str]], root: Path, maps: SharedMaps
) -> tuple[dict[str, list[str]], list[str]]:
    """(the diff without the changed files of `root` that `maps` holds, those files). A file is
    held when a mapping has its inode (the overlay shows an upper file's own inode number) and
    a path that ends with its path under `root` (a mapping's path is as its process sees it:
    from the slot's root)."""
    by_inode: dict[int, list[str]] = {}
    for inode, path in maps:
        by_inode.setdefault(inode, []).append(path)
    kept = {kind: list(paths) for kind, paths in diff.items()}
    held: list[str] = []
    for rel in diff.get("changed", []):
        try:
            st = (root / rel).lstat()
        except OSError:
            continue
        paths = by_inode.get(st.st_ino, [])
        if stat.S_ISREG(st.st_mode) and any(p.endswith(f"/{rel}") for p in paths):
            held.append(rel)
    if held:
        kept["changed"] = [rel for rel in kept["changed"] if rel not in held]
    return kept, sorted(held)


def _touched_at(p: Path) -> float:
    try:
        st = p.lstat()
    except OSError:
        return float("-inf")  # removed between the two reads: no proof the tree did it
    return max(st.st_mtime, st.st_ctime)


def _nearest_existing(root: Path, p: Path) -> Path:
    while p != root and not os.path.lexists(p):
        p = p.parent
    return p


def manifest_sha256(manifest: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for rel in sorted(manifest):
        h.update(f"{rel}\0{manifest[rel]}\n".encode())
    return h.hexdigest()


# --- processes ----------------------------------------------------------------------------------


def parse_uid_map(text: str) -> list[tuple[int, int, int]]:
    nums = [int(x) for x in text.split()]
    return [tuple(nums[i : i + 3]) for i in range(0, len(nums) - 2, 3)]  # type: ignore[misc]


def parse_status_uids(text: str) -> tuple[int, ...]:
    """The Uid: line of /proc/<pid>/status (real, effective, saved, fs) as the reader sees them."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            return tuple(int(x) for x in line.split()[1:])
    return ()


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None  # the process is gone (or going): the caller treats it as absent


def proc_names(pids: Iterable[int]) -> dict[str, str]:
    """{pid: comm} of the processes still there (str keys: the record is JSON)."""
    out = {}
    for pid in pids:
        comm = read_text(f"/proc/{pid}/comm")
        if comm is not None:
            out[str(pid)] = comm.rstrip("\n")
    return out


# The guest agent starts its action worker as `python3 -I -c "...; from <package>.worker import
# main; ..."` (guest/agent.py) and restarts it after a step kills it or times out: the daemon's
# own doing, never an app's exit.
GUEST_WORKER_MARK = b".worker import main"


def guest_workers(names: Mapping[str, str]) -> list[str]:
    """Pids (of `names`, {pid: comm}) that are the guest agent's action worker."""
    out = []
    for pid, comm in names.items():
        if not comm.startswith("python"):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read(4096)
        except OSError:
            continue
        if GUEST_WORKER_MARK in cmdline:
            out.append(pid)
    return sorted(out, key=int)


# The slot's X server (guest/init.py starts Xvfb on :0) listens on these unix socket names: the
# abstract one (Xlib tries it first on Linux) and the path.
X_DISPLAY = ":0"
X_SERVER_NAMES = ("Xvfb", "Xorg", "X")
_SO_ACCEPTCON = 0x10000  # a listening socket's flag in /proc/net/unix


def x_socket_names(display: str) -> tuple[str, str]:
    number = display.lstrip(":").split(".")[0]
    return f"@/tmp/.X11-unix/X{number}", f"/tmp/.X11-unix/X{number}"


def listening_unix_sockets(net_unix: str, names: Sequence[str]) -> dict[str, int]:
    """{name: inode} of the listening sockets bound to `names` in a /proc/<pid>/net/unix text
    (its network namespace's sockets; an abstract name starts with @)."""
    out: dict[str, int] = {}
    for line in net_unix.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[7] not in names:
            continue
        try:
            flags, inode = int(fields[3], 16), int(fields[6])
        except ValueError:
            continue
        if flags & _SO_ACCEPTCON:
            out[fields[7]] = inode
    return out


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets process `pid` holds open (empty when it is gone)."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat field 22): with the
    pid, an identity a reused pid cannot take."""
    text = read_text(f"/proc/{pid}/stat")
    if text is None:
        return None
    try:
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def display_server(
    init_pid: int, candidates: Iterable[int], display: str = X_DISPLAY
) -> dict[str, object]:
    """Who serves the slot's X display now: the listening sockets of `display` in the slot's
    network namespace and the process of `candidates` that holds them, with its start time and
    uid. Screenshots and input go to whoever holds these sockets, so an X server started in the
    original's place (by the desktop user, after killing it) has another identity here."""
    names = x_socket_names(display)
    out: dict[str, object] = {"display": display, "pid": None}
    text = read_text(f"/proc/{init_pid}/net/unix")
    if text is None:
        out["error"] = f"cannot read /proc/{init_pid}/net/unix"
        return out
    sockets = listening_unix_sockets(text, names)
    out["sockets"] = sockets
    if not sockets:
        out["error"] = f"nothing listens on display {display}"
        return out
    wanted = set(sockets.values())
    for pid in candidates:
        if wanted <= socket_inodes(pid):
            status = read_text(f"/proc/{pid}/status") or ""
            uids = parse_status_uids(status) if status else ()
            out.update(pid=pid, start=start_time(pid), uid=uids[0] if uids else None)
            return out
    out["error"] = f"no process of the slot holds the sockets of display {display}"
    return out


def host_uids(pids: Iterable[int]) -> dict[str, tuple[int, ...]]:
    out = {}
    for pid in pids:
        text = read_text(f"/proc/{pid}/status")
        if text is not None:
            out[str(pid)] = parse_status_uids(text)
    return out


def parse_status_lock(text: str) -> dict[str, int]:
    """NoNewPrivs, Seccomp (2 = filter) and CapBnd (a bit mask) of /proc/<pid>/status; a field
    the kernel does not show is absent from the result."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("NoNewPrivs", "Seccomp"):
            out[key] = int(value)
        elif key == "CapBnd":
            out[key] = int(value, 16)
    return out


def unlocked(status: dict[str, int], allowed_capbnd: int) -> list[str]:
    """Why a process with this parse_status_lock result is not locked ([] when it is)."""
    why = []
    if status.get("NoNewPrivs") != 1:
        why.append("no_new_privs is not set")
    if status.get("Seccomp") != 2:
        why.append("no seccomp filter")
    extra = status.get("CapBnd", -1) & ~allowed_capbnd if "CapBnd" in status else -1
    if extra:
        why.append(f"bounding set has {extra:#x} beyond {allowed_capbnd:#x}")
    return why


def process_locks(pids: Iterable[int], allowed_capbnd: int) -> dict[str, list[str]]:
    """{pid: reasons} of the processes still there that are not locked."""
    out = {}
    for pid in pids:
        text = read_text(f"/proc/{pid}/status")
        if text is not None:
            why = unlocked(parse_status_lock(text), allowed_capbnd)
            if why:
                out[str(pid)] = why
    return out
