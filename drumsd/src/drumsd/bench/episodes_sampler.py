"""`drumsd bench episodes --profile`, the host side: a thread that reads, every interval, the CPU
of each process the bench's daemon started (its cpuacct group: the daemon, CRIU, the desktops,
their setup and checkers) sorted into what they are, beside ksmd's, the bench's own (the SDK
clients), the host's and the kernel's CPU pressure, and what was in flight (CRIU restores and
dumps, desktops in their first seconds after a restore or a thaw). episodes_profile places the
steps in it.

What a process is, from its cgroup (the daemon names each instance's groups after its owner:
`spare-<checkpoint>-...` for a warm spare, `slot-...`, `template-...`) and its command:
  criu restore (spare)   a warm spare's refill restore
  criu restore           any other restore (a create or reset that missed a spare, a fork)
  criu dump              a save, a task checkpoint's capture, a fork's prefork
  desktop (new)          a desktop's processes in the NEW_S after its restore or its thaw (the
                         first redraw, the catch-up of a claimed spare)
  desktop                the other desktops' processes (the busy episodes' apps, X, agents)
  daemon                 drumsd itself (its event loop and worker threads)
  daemon helpers         what else runs outside an instance (the launcher, exec helpers)
  exited between samples the account's growth no live process explains (short-lived helpers,
                         CRIU runs that ended between two samples)
  ksmd, client           the kernel's same-page merger; this bench process (less the sampler)
  host other             the host's busy time less all of the above (other load, kworkers)
  psi cpu some           not CPU: the share of time some task waited for a CPU (/proc/pressure)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drumsd.bench.episodes_host import TICK, host_busy_s
from drumsd.bench.episodes_profile import Sample
from drumsd.linux import host_share, procfs

NEW_S = 3.0  # a desktop counts as new this long after its restore or its thaw
PSI_CPU = Path("/proc/pressure/cpu")


@dataclass
class _Proc:
    kind: str  # criu restore (spare) ... daemon helpers; "" for a desktop (decided per sample)
    iid: str | None
    ticks: int
    child_ticks: int = 0  # cutime + cstime: the CPU of the children it reaped


def instance_of(cgroup_text: str, controller: str = "cpu") -> tuple[str | None, str | None]:
    """From /proc/<pid>/cgroup: (the instance id, the controller's path) when the process is in
    a drums instance's group (`.../drums-<hash>/<iid>`), else (None, path)."""
    for line in cgroup_text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            parts = [p for p in path.split("/") if p]
            for i, part in enumerate(parts[:-1]):
                if part.startswith("drums-"):
                    return parts[i + 1], path
            return None, path
    return None, None


def restore_kind(iid: str | None) -> str:
    return "criu restore (spare)" if iid and iid.startswith("spare-") else "criu restore"


def psi_some_s(text: str) -> float | None:
    """/proc/pressure/cpu's `some ... total=<us>` in seconds."""
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split():
                if part.startswith("total="):
                    return int(part[6:]) / 1e6
    return None


def _read(path: str | Path) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class Sampler:
    """Samples until stop(); `samples` then holds what episodes_profile reads."""

    def __init__(
        self,
        account_dir: Path,
        daemon_pid: int,
        interval_s: float = 0.1,
        freezer_root: Path = Path("/sys/fs/cgroup/freezer"),
    ) -> None:
        self.account_dir = account_dir
        self.daemon_pid = daemon_pid
        self.interval_s = interval_s
        self.freezer_root = freezer_root
        self.samples: list[Sample] = []
        self.sampler_cpu_s = 0.0  # what sampling itself cost (this thread's CPU)
        # CPU-seconds per (kind, command) over the whole run: which programs a kind is
        self.by_command: dict[tuple[str, str], float] = {}
        # CPU-seconds of the children each (kind, command) reaped: who ran the short-lived ones.
        # Not part of the totals: it also holds what was sampled of those children while alive.
        self.reaped: dict[tuple[str, str], float] = {}
        self._procs: dict[tuple[int, int, str], _Proc] = {}
        self._since: dict[str, float] = {}  # iid -> when it was restored or last thawed
        self._frozen: dict[str, bool] = {}
        self._freezer: dict[str, str] = {}  # iid -> its freezer path
        self._ksmd = host_share.ksmd_pid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-sampler")

    def start(self) -> Sampler:
        self._last = self._totals()
        self._read_procs(time.monotonic(), baseline=True)
        self.samples.append(Sample(time.monotonic(), {}))
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def top_reapers(self, n: int = 15) -> list[list[Any]]:
        """The `n` (kind, command) pairs whose reaped children used the most CPU."""
        top = sorted(self.reaped.items(), key=lambda kv: -kv[1])[:n]
        return [[kind, comm, round(cpu, 3)] for (kind, comm), cpu in top]

    def top_commands(self, n: int = 15) -> list[list[Any]]:
        """The `n` (kind, command) pairs that used the most CPU, with their CPU-seconds."""
        top = sorted(self.by_command.items(), key=lambda kv: -kv[1])[:n]
        return [[kind, comm, round(cpu, 3)] for (kind, comm), cpu in top]

    def _run(self) -> None:
        c0 = time.thread_time()
        while not self._stop.wait(self.interval_s):
            self.samples.append(self._sample())
        self.sampler_cpu_s = time.thread_time() - c0

    # ------------------------------------------------------------------ one sample

    def _totals(self) -> dict[str, float]:
        own = _read(self.account_dir / "cpuacct.usage")
        ksmd = _read(f"/proc/{self._ksmd}/stat") if self._ksmd else None
        me = _read("/proc/self/stat")
        psi = _read(PSI_CPU)
        return {
            "host": host_busy_s(),
            "account": int(own) / 1e9 if own else 0.0,
            "ksmd": procfs.parse_stat(ksmd).ticks / TICK if ksmd else 0.0,
            "bench": procfs.parse_stat(me).ticks / TICK if me else 0.0,
            "sampler": time.thread_time() if threading.current_thread() is self._thread else 0.0,
            "psi": (psi_some_s(psi) or 0.0) if psi else 0.0,
        }

    def _sample(self) -> Sample:
        now = time.monotonic()
        cpu, inflight, commands = self._read_procs(now)
        totals = self._totals()
        d = {k: totals[k] - self._last.get(k, 0.0) for k in totals}
        if self._last.get("sampler", 0.0) == 0.0:
            d["sampler"] = 0.0
        self._last = totals
        explained = sum(cpu.values())
        cpu["exited between samples"] = max(0.0, d["account"] - explained)
        cpu["ksmd"] = d["ksmd"]
        cpu["client"] = max(0.0, d["bench"] - d["sampler"])
        cpu["host other"] = max(0.0, d["host"] - d["account"] - d["ksmd"] - d["bench"])
        cpu["psi cpu some"] = d["psi"]
        commands["exited between samples"] = cpu["exited between samples"]
        for kind in ("ksmd", "client", "host other"):
            commands[kind] = cpu[kind]
        return Sample(
            now,
            {k: round(v, 5) for k, v in cpu.items()},
            inflight,
            {k: round(v, 5) for k, v in commands.items()},
        )

    def _read_procs(
        self, now: float, baseline: bool = False
    ) -> tuple[dict[str, float], dict[str, int], dict[str, float]]:
        """CPU per kind and per "<kind>: <command>" since the sample before, and what was in
        flight."""
        procs_text = _read(self.account_dir / "cgroup.procs") or ""
        seen: dict[tuple[int, int, str], _Proc] = {}
        cpu: dict[str, float] = {}
        commands: dict[str, float] = {}
        inflight: dict[str, int] = {}
        live_iids: set[str] = set()
        kinds: dict[str, str] = {}  # iid -> desktop or desktop (new), read once per sample
        for line in procs_text.split():
            pid = int(line)
            stat = _read(f"/proc/{pid}/stat")
            if stat is None:
                continue
            st = procfs.parse_stat(stat)
            # child ticks: where a process too short-lived to be sampled shows, in its reaper
            comm, ticks, start, cticks = st.comm, st.ticks, st.starttime, st.child_ticks
            key = (pid, start, comm)
            proc = self._procs.get(key)
            if proc is None:
                proc = self._classify(pid, comm, now)
                if proc is None:
                    continue
                before = ticks if baseline else 0  # born since the sample before: all of it
                cbefore = cticks if baseline else 0
            else:
                before, cbefore = proc.ticks, proc.child_ticks
            proc.ticks, proc.child_ticks = ticks, cticks
            seen[key] = proc
            if proc.iid:
                live_iids.add(proc.iid)
            kind = proc.kind
            if not kind and proc.iid:
                if proc.iid not in kinds:
                    kinds[proc.iid] = self._desktop_kind(proc.iid, now)
                kind = kinds[proc.iid]
            if kind:
                used = (ticks - before) / TICK
                cpu[kind] = cpu.get(kind, 0.0) + used
                if not baseline and used:
                    self.by_command[kind, comm] = self.by_command.get((kind, comm), 0.0) + used
                    key_c = f"{kind}: {comm}"
                    commands[key_c] = commands.get(key_c, 0.0) + used
                reaped = (cticks - cbefore) / TICK
                if not baseline and reaped > 0:
                    self.reaped[kind, comm] = self.reaped.get((kind, comm), 0.0) + reaped
            if proc.kind.startswith("criu"):
                inflight[proc.kind] = inflight.get(proc.kind, 0) + 1
        self._procs = seen
        for iid in list(self._since):
            if iid not in live_iids:
                self._since.pop(iid, None)
                self._frozen.pop(iid, None)
                self._freezer.pop(iid, None)
        new = sum(1 for kind in kinds.values() if kind == "desktop (new)")
        if new:
            inflight["desktop (new)"] = new
        return cpu, inflight, commands

    def _classify(self, pid: int, comm: str, now: float) -> _Proc | None:
        cg = _read(f"/proc/{pid}/cgroup")
        if cg is None:
            return None
        iid, _ = instance_of(cg)
        if comm == "criu":
            cmd = (_read(f"/proc/{pid}/cmdline") or "").split("\0")
            kind = (
                restore_kind(iid) if "restore" in cmd else "criu dump" if "dump" in cmd else "criu"
            )
        elif iid is not None:
            kind = ""
            if iid not in self._since:
                self._since[iid] = now
                _, fpath = instance_of(cg, "freezer")
                if fpath:
                    self._freezer[iid] = fpath
        else:
            kind = "daemon" if pid == self.daemon_pid else "daemon helpers"
        return _Proc(kind, iid, 0)

    def _desktop_kind(self, iid: str, now: float) -> str:
        """desktop (new) in the NEW_S after its restore or its thaw, frozen (a parked spare:
        no CPU to place), else desktop."""
        path = self._freezer.get(iid)
        state = _read(self.freezer_root / path.lstrip("/") / "freezer.state") if path else None
        frozen = bool(state and state.strip() != "THAWED")
        if self._frozen.get(iid) and not frozen:
            self._since[iid] = now  # thawed: a claimed spare catching up
        self._frozen[iid] = frozen
        if frozen:
            return "desktop (frozen)"
        return "desktop (new)" if now - self._since.get(iid, now) < NEW_S else "desktop"
