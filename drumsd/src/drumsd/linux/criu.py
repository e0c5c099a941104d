"""CRIU command lines and the dump action script (pure), reading CRIU's logs for errors, and
parsing the dumped process tree (pstree.img) to check a dump against the live tree.

Flags are the ones proven on this kind of host (shared/notes/criu-desktop.md): the slot's netns is
private (no network lock), file locks and ghost files are dumped, the upper layer is copied by a
post-dump action script while the tree is still frozen, and restores leave cgroups to us.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from drumsd.core.criu_wire import image_messages, message_fields, read_varint

GHOST_LIMIT = "64M"
# Where drums' CRIU build keeps its kerndat cache (its RUNDIR: hostprep and nix/criu.nix build
# with it; host_share.ensure_criu_cache_dir makes it root's). A stock CRIU keeps it in /run, only
# when /run is a tmpfs: on a host whose /run is not, every CRIU run probes the kernel again
# (~30 ms of a ~43 ms dump of one process, measured on this kind of host).
KDAT_DIR = Path("/dev/shm/drums-criu")
DUMP_LOG_LEVEL = 4  # a dump's log at debug unless the config says otherwise (it is read on failure)


def dump_argv(
    criu: Path,
    pid: int,
    images: Path,
    script: Path,
    *,
    leave_running: bool,
    externals: Mapping[str, str] | None = None,
    log: str = "dump.log",
    log_level: int | None = None,
    track_parent: Path | None = None,
) -> list[str]:
    """With `track_parent` (the images of the checkpoint an armed tree was restored from,
    `write_track.py`), drums' CRIU writes only the pages written since the restore and marks
    the rest as that parent's."""
    argv = [
        str(criu),
        "dump",
        "-t",
        str(pid),
        "-D",
        str(images),
        "-o",
        log,
        f"-v{DUMP_LOG_LEVEL if log_level is None else log_level}",
        "--network-lock",
        "skip",
        "--file-locks",
        "--ghost-limit",
        GHOST_LIMIT,
        "--action-script",
        str(script),
    ]
    if leave_running:
        argv.append("--leave-running")
    if track_parent is not None:
        argv += ["--track-mem-uffd-wp", "--prev-images-dir", str(track_parent)]
    for path, key in (externals or {}).items():
        argv += ["--external", f"mnt[{path}]:{key}"]
    return argv


def restore_argv(
    criu: Path,
    images: Path,
    work: Path,
    root: Path,
    pidfile: Path,
    *,
    externals: Mapping[str, str] | None = None,
    leave_stopped: bool = False,
    log: str = "restore.log",
    log_level: int | None = None,
    lo_up_script: str | None = None,
) -> list[str]:
    argv = [
        str(criu),
        "restore",
        "-D",
        str(images),
        "-W",
        str(work),
        "-o",
        log,
        "--root",
        str(root),
        "--restore-detached",
        "--restore-sibling",
        "--pidfile",
        str(pidfile),
        "--file-locks",
        "--manage-cgroups=ignore",
    ]
    if log_level is not None:
        argv.append(f"-v{log_level}")
    if leave_stopped:
        argv.append("--leave-stopped")
    for key, path in (externals or {}).items():
        argv += ["--external", f"mnt[{key}]:{path}"]
    if lo_up_script is not None:
        # netns_fast: a fresh net namespace with only lo (up, by the script) instead of CRIU
        # restoring the dumped one with `ip` and four iptables-restore runs. A slot's netns
        # holds nothing else (no links, addresses or rules beyond lo's).
        argv += ["--empty-ns", "net", "--action-script", lo_up_script]
    return argv


def action_script(upper: Path, dest_upper: Path, copier: Sequence[str] | None = None) -> str:
    """On post-dump the tasks are still frozen: the upper copy matches the memory image. Copying
    after `--leave-running` resumed the tree would race the desktop's writes. `copier` is the
    command that copies instead of `cp -a` (a delta save's, `upper_links.post_dump_argv`)."""
    src, dst = shlex.quote(str(upper)), shlex.quote(str(dest_upper))
    copy = " ".join(map(shlex.quote, copier)) if copier else f"cp -a {src}/. {dst}/"
    return (
        "#!/bin/sh\n"
        '[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] || exit 0\n'
        f"mkdir -p {dst} && exec {copy}\n"
    )


def log_errors(log_text: str, limit: int = 6) -> list[str]:
    """The lines of a CRIU log that explain a failure (CRIU marks them `Error`)."""
    lines = [ln.strip() for ln in log_text.splitlines() if "Error" in ln or "error" in ln]
    # Every plain restore logs its netns's `ip` (ipv4 "Address", ipv6 "address already
    # assigned") and four iptables execs failing (docs/runtime.md, "netns_fast"): noise in an
    # error that quotes these lines.
    harmless = (
        "tables-restore",
        "tables-legacy-restore",
        "address already assigned",
        "rlimit_nofile",
    )
    return [ln for ln in lines if not any(h in ln.lower() for h in harmless)][-limit:]


# CRIU 4.2.1 checkpoints one user and one pid namespace per tree (the slot's): a process that made
# its own (unshare -Up, a sandbox) fails the dump with this line, naming the process (host pid).
_NESTED_NS = re.compile(r"Can't dump nested (user|pid) namespace for (\d+)")


def nested_namespace(errors: Sequence[str]) -> tuple[str, int] | None:
    """(namespace kind, host pid) of a dump refused for a nested user or pid namespace (pure)."""
    for line in errors:
        m = _NESTED_NS.search(line)
        if m:
            return m.group(1), int(m.group(2))
    return None


# CRIU 4.2.1 refuses a dump whose inotify watch's fdinfo has no file handle, which the kernel
# leaves out for an overlay inode whose dentry was evicted (memory pressure, drop_caches).
_INOTIFY_NO_HANDLE = re.compile(r"error parsing \[inotify wd:\S+ ino:([0-9a-f]+) sdev:")


def unhandled_inotify_inodes(errors: Sequence[str]) -> set[int]:
    """Inode numbers of the inotify watches a dump was refused for (pure)."""
    return {int(m.group(1), 16) for line in errors if (m := _INOTIFY_NO_HANDLE.search(line))}


def tail(path: Path, lines: int = 20) -> Sequence[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


# ---- the dumped process tree (pstree.img), to check a dump against the live tree --------------


@dataclass(frozen=True)
class DumpedTask:
    pid: int  # in the slot's pid namespace, as CRIU records it
    ppid: int
    threads: tuple[int, ...]

    @property
    def thread_ids(self) -> tuple[int, ...]:
        """The threads by their ids in the namespace. CRIU 4.2.1 lists a zombie with the one
        thread 0 (collect_threads never sets a dead task's thread id; dump_one_zombie writes its
        core-<pid>.img): that thread is the pid."""
        return (self.pid,) if self.threads == (0,) else self.threads


def parse_pstree(data: bytes) -> list[DumpedTask]:
    """CRIU's pstree.img (`image_messages`): PstreeEntry messages (1 pid, 2 ppid, 3 pgid,
    4 sid, 5 threads; threads packed or not)."""
    tasks: list[DumpedTask] = []
    for entry in image_messages(data, "pstree.img"):
        fields: dict[int, int] = {}
        threads: list[int] = []
        for number, value in message_fields(entry, "pstree.img"):
            if isinstance(value, int):
                if number == 5:
                    threads.append(value)
                else:
                    fields[number] = value
                continue
            j = 0
            while number == 5 and j < len(value):
                thread, j = read_varint(value, j)
                threads.append(thread)
        tasks.append(DumpedTask(fields.get(1, 0), fields.get(2, 0), tuple(threads)))
    return tasks


def missing_from_dump(
    before: Mapping[int, str], after: Mapping[int, str], dumped: Sequence[DumpedTask]
) -> list[str]:
    """Processes of the slot (namespace pid -> comm) seen both just before and just after the
    dump that the dump does not hold: they would be lost on every restore (e.g. a process that
    joined the slot's cgroup from outside its process tree). One seen on one side only is churn
    around the freeze, not a miss."""
    held = {t.pid for t in dumped}
    stable = before.keys() & after.keys()
    return [f"{before[pid]}({pid})" for pid in sorted(stable - held)]


def missing_threads(
    before: Mapping[int, Mapping[int, int]],
    after: Mapping[int, Mapping[int, int]],
    dumped: Sequence[DumpedTask],
) -> list[str]:
    """Threads (namespace pid -> {tid: starttime}) that ran throughout the dump, seen with the
    same tid and start time just before and just after it, that the dump does not hold under
    their process. A thread born or ended around the freeze is churn (Chromium's and LibreOffice's
    thread pools come and go), not a miss; a process missing as a whole is `missing_from_dump`'s
    report."""
    held = {t.pid: set(t.thread_ids) for t in dumped}
    out: list[str] = []
    for pid in sorted(before.keys() & after.keys() & held.keys()):
        was, now = before[pid], after[pid]
        stable = {tid for tid in was.keys() & now.keys() if was[tid] == now[tid]}
        out += [f"thread {tid} of process {pid}" for tid in sorted(stable - held[pid])]
    return out


def threads_without_core(dumped: Sequence[DumpedTask], images: Sequence[str]) -> list[int]:
    """Threads pstree.img lists whose register state (core-<tid>.img) is not among `images`
    (file names): a restore of such a dump fails or loses the thread. A zombie's core is under
    its pid (`DumpedTask.thread_ids`): a tree caught between a child's exit and its parent's
    wait, as a shell's loop often is, is whole."""
    names = set(images)
    return [tid for t in dumped for tid in t.thread_ids if f"core-{tid}.img" not in names]


TASK_STOPPED = 3  # CoreEntry.tc.task_state of a task dumped stopped (compel's task-state.h)


def task_state(core: bytes) -> int | None:
    """The task_state of a CRIU core-<pid>.img (CoreEntry field 3, TaskCoreEntry field 1);
    None for a thread's core, which has none. ValueError when it is not such an image."""
    entry = next(image_messages(core, "core image"), b"")
    for number, value in message_fields(entry, "core image"):
        if number == 3 and isinstance(value, bytes):
            for inner, state in message_fields(value, "core image"):
                if inner == 1 and isinstance(state, int):
                    return state
    return None
