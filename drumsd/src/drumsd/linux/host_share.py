"""What several drumsd on one host share, and how each claims its own part of it.

A daemon holds its state and journal dirs with an flock for its whole life and binds its port
before it reconciles anything, so a second `drumsd serve` on the same config fails before it
touches a slot. Host uid ranges are claimed one file per range in a host-wide dir (O_EXCL, so
two daemons never get the same range), and the KSM knobs are saved by the first daemon that
turns KSM on and restored by the last one out, not by whichever stops first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

HOST_DIR = Path("/run/drums-host")  # tmpfs: claims die with the slots at reboot
LOCK_NAME = ".drumsd.lock"


class ClaimError(Exception):
    """A shared resource another daemon holds, said with what to do."""


# ---------------------------------------------------------------- dirs and the port


def hold_dir(path: Path, what: str, claimant: str = "daemon") -> int:
    """An exclusive flock on `path/.drumsd.lock`, held until the returned fd is closed (the
    process exiting releases it, so a kill -9 leaves nothing stale). A daemon's dirs and a
    bench's (`claimant`) take the same lock, so neither runs on the other's."""
    try:
        return hold_lock_file(path / LOCK_NAME)
    except LockBusy as busy:
        raise ClaimError(
            f"{what} {path} is in use by another drumsd ({busy.holder}); stop it, or give "
            f"this {claimant} its own {what}"
        ) from None
    except OSError as exc:
        raise ClaimError(f"{what} {path}: cannot lock {exc.filename}: {exc.strerror}") from None


class LockBusy(Exception):
    """Another process holds the lock file; `holder` says who (`lock_holder`)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def hold_lock_file(lock: Path) -> int:
    """An exclusive flock on `lock` (created if missing) that records this process's pid, held
    until the returned fd is closed. LockBusy when another process holds it."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = lock_holder(os.pread(fd, 64, 0).decode(errors="replace").strip(), lock)
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise LockBusy(holder) from None
        raise OSError(exc.errno, exc.strerror, str(lock)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_holder(pid_text: str, lock: Path, proc: Path = Path("/proc")) -> str:
    """Who holds `lock`, from the pid its file records: the pid and its command line, or that
    it exited and a process it started (which inherited the lock) holds it now."""
    if not pid_text.isdigit():
        return "pid ?"
    try:
        cmd = (proc / pid_text / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return (
            f"pid {pid_text}, which has exited: a process it started holds the lock; "
            f"`fuser -v {lock}` names it"
        )
    return f"pid {pid_text}: {cmd}" if cmd else f"pid {pid_text}"


def bind_listener(host: str, port: int) -> socket.socket:
    """The API socket, bound now (before reconcile) and handed to hypercorn as fd://."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ClaimError(
            f"cannot listen on {host}:{port}: {exc.strerror}; is another drumsd running? "
            "change listen or stop it"
        ) from None
    sock.set_inheritable(True)
    return sock


# ---------------------------------------------------------------- host uid ranges


class UidRanges:
    """Claims on host uid ranges: `<root>/<index>` holds the claiming daemon's state dir.

    A claim outlives its daemon while its slot does (a restarted daemon adopts the slot and
    keeps the claim); claims of a state dir that no longer exists are stale and pruned."""

    def __init__(self, owner: Path, root: Path = HOST_DIR / "uid-ranges") -> None:
        self.owner = str(owner)
        self.root = root

    def _path(self, index: int) -> Path:
        return self.root / str(index)

    def _owner_of(self, index: int) -> str | None:
        try:
            return self._path(index).read_text().strip()
        except FileNotFoundError:
            return None

    def _create(self, index: int) -> bool:
        try:
            fd = os.open(self._path(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, f"{self.owner}\n".encode())
        finally:
            os.close(fd)
        return True

    def claims(self) -> dict[int, str]:
        out: dict[int, str] = {}
        if self.root.is_dir():
            for path in self.root.iterdir():
                if path.name.isdigit():
                    with contextlib.suppress(FileNotFoundError):
                        out[int(path.name)] = path.read_text().strip()
        return out

    def recover(self, held: set[int]) -> list[int]:
        """At start: keep (or re-make) claims for the ranges our slots hold, drop our other
        claims and those of vanished state dirs. Returns ranges of `held` another daemon owns."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        conflicts = []
        for index, owner in self.claims().items():
            mine = owner == self.owner
            if (mine and index not in held) or (not mine and not Path(owner).is_dir()):
                with contextlib.suppress(FileNotFoundError):
                    self._path(index).unlink()
        for index in held:
            if not self._create(index) and self._owner_of(index) != self.owner:
                conflicts.append(index)
        return conflicts

    def claim_lowest(self, taken: set[int]) -> int:
        """The lowest range neither in `taken` (ours) nor claimed by any daemon on the host."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        index = 0
        while index in taken or not self._create(index):
            index += 1
        return index

    def release(self, index: int) -> None:
        if self._owner_of(index) == self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._path(index).unlink()


# ---------------------------------------------------------------- KSM knobs


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------- CRIU's kerndat cache

KDAT_STALE_S = 60.0  # a half-written cache older than this was left by a CRIU that died


def ensure_criu_cache_dir(path: Path, now: float | None = None) -> str | None:
    """`path` (criu.KDAT_DIR, drums' CRIU build's RUNDIR) made a dir of this user's alone (0700),
    where CRIU keeps what it learnt of the kernel between runs instead of probing it at each
    dump and restore. Anything else in its place (a file, a link, another user's dir: it lies
    in a world-writable /dev/shm, and CRIU trusts the cache it reads) is removed first, and so
    is a half-written cache a killed CRIU left (CRIU creates it exclusively: left, it stops
    every later save of the cache). Shared by the daemons of one host. None when ready, else
    why not: CRIU then probes the kernel each run, as before."""
    try:
        st = _lstat(path)
        if st is None or not _ours(st):
            if st is not None and stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            elif st is not None:
                path.unlink()
            with contextlib.suppress(FileExistsError):  # another daemon made it just now
                path.mkdir(mode=0o700)
            st = _lstat(path)
            if st is None or not _ours(st):  # someone else's again, made meanwhile
                return f"{path}: not a dir of uid {os.geteuid()} with mode 0700"
        tmp = path / "criu.kdat.tmp"
        with contextlib.suppress(FileNotFoundError):
            if (now if now is not None else time.time()) - tmp.stat().st_mtime > KDAT_STALE_S:
                tmp.unlink()
    except OSError as exc:
        return f"{path}: {exc}"
    return None


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _ours(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


KSMD_NICE = 5  # what the kernel gives its KSM thread (mm/ksm.c: set_user_nice(current, 5))


def ksmd_pid(proc: Path = Path("/proc")) -> int | None:
    """The pid of the kernel's KSM thread (a child of kthreadd named ksmd), or None."""
    for comm in proc.glob("[0-9]*/comm"):
        if _is_ksmd(int(comm.parent.name), proc):
            return int(comm.parent.name)
    return None


def _is_ksmd(pid: int, proc: Path = Path("/proc")) -> bool:
    try:
        return (proc / str(pid) / "comm").read_text().strip() == "ksmd"
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class KsmShare:
    """The KSM knobs under a host-wide refcount of daemons (`holders/<pid>`): the first joiner
    saves the host's values, the last leaver (or the next joiner after a crash) restores them."""

    def __init__(
        self, ksm_dir: Path, root: Path = HOST_DIR / "ksm", proc: Path = Path("/proc")
    ) -> None:
        self.ksm_dir = ksm_dir
        self.root = root
        self.proc = proc  # where ksmd is looked for (renice_scanner)
        self.pid = os.getpid()
        self._ksmd: int | None = None  # found once (a /proc walk), checked before each use

    def _holders(self) -> list[int]:
        holders = self.root / "holders"
        holders.mkdir(parents=True, exist_ok=True)
        alive = []
        for path in holders.iterdir():
            if path.name.isdigit() and _alive(int(path.name)):
                alive.append(int(path.name))
            else:
                path.unlink(missing_ok=True)
        return alive

    def join(self, wanted: Mapping[str, str]) -> list[str]:
        """Set the knobs; returns the names that could not be written (no KSM here)."""
        failed = []
        with _locked(self.root / "lock"):
            saved_path = self.root / "saved.json"
            if not self._holders() and not saved_path.exists():
                saved = {}
                for name in wanted:
                    with contextlib.suppress(OSError):
                        saved[name] = (self.ksm_dir / name).read_text().strip()
                saved_path.write_text(json.dumps(saved))
            for name, value in wanted.items():
                try:
                    (self.ksm_dir / name).write_text(value)
                except OSError:
                    failed.append(name)
            (self.root / "holders" / str(self.pid)).write_text("")
        return failed

    def boost(self, knobs: Mapping[str, str], seconds: float) -> list[str]:
        """Hold a scan boost for `seconds` from now (`boosts/<pid>` holds its end) and write its
        knobs; returns the names that could not be written. The host's saved values are kept."""
        with _locked(self.root / "lock"):
            boosts = self.root / "boosts"
            boosts.mkdir(parents=True, exist_ok=True)
            (boosts / str(self.pid)).write_text(f"{time.time() + seconds}\n")
            return self._write(knobs)

    def unboost(self, quiet: Mapping[str, str]) -> bool:
        """Drop our boost. The `quiet` knobs and ksmd's own nice come back only when no other
        live daemon's boost is running (its end would otherwise be cut short); returns whether
        they did."""
        with _locked(self.root / "lock"):
            boosts = self.root / "boosts"
            (boosts / str(self.pid)).unlink(missing_ok=True)
            if self._other_boosts(boosts):
                return False
            self._write(quiet)
            self.renice_scanner(KSMD_NICE)
            return True

    def _other_boosts(self, boosts: Path) -> bool:
        """Whether another live daemon's boost runs (stale claims are removed)."""
        running = False
        for path in boosts.iterdir() if boosts.is_dir() else ():
            try:
                until = float(path.read_text())
            except (OSError, ValueError):
                until = 0.0
            if path.name.isdigit() and _alive(int(path.name)) and until > time.time():
                running = True
            else:
                path.unlink(missing_ok=True)
        return running

    def _write(self, knobs: Mapping[str, str]) -> list[str]:
        failed = []
        for name, value in knobs.items():
            try:
                (self.ksm_dir / name).write_text(value)
            except OSError:
                failed.append(name)
        return failed

    def renice_scanner(self, nice: int) -> bool:
        """Set ksmd's nice value (the kernel starts it at KSMD_NICE); whether it was set.
        Other daemons' boosts end on the same value, so none has to remember the host's."""
        if self._ksmd is None or not _is_ksmd(self._ksmd, self.proc):
            self._ksmd = ksmd_pid(self.proc)
        if self._ksmd is None:
            return False
        try:
            os.setpriority(os.PRIO_PROCESS, self._ksmd, nice)
        except OSError:
            return False
        return True

    def leave(self) -> bool:
        """Drop our hold; restore the saved values if no other daemon holds KSM. Returns
        whether this call restored them."""
        with _locked(self.root / "lock"):
            (self.root / "holders" / str(self.pid)).unlink(missing_ok=True)
            if self._holders():
                return False
            saved_path = self.root / "saved.json"
            try:
                saved = json.loads(saved_path.read_text())
            except (FileNotFoundError, ValueError):
                return False
            for name, value in saved.items():
                with contextlib.suppress(OSError):
                    (self.ksm_dir / name).write_text(value)
            saved_path.unlink(missing_ok=True)
            return True
