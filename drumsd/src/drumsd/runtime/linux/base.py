"""The records every part of the Linux runtime uses: its config, the instance record (and the
agent gate each instance has), a filesystem prepared ahead of a restore, and the event log line.

Vocabulary: an *instance* is one restored (or booted) process tree with its own directory
`state_dir/slots/<iid>` (a tmpfs holding the upper layer, the overlay root, CRIU's work dir) and its
own cgroups named `<iid>`. A *slot* is the control plane's name for whichever instance currently
serves it: a reset swaps the instance (the old one is torn down in the background). Every instance
dir holds `owner.json` naming its slot, so a restarted daemon can sweep what no live slot owns.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from drumsd.core.config import Config
from drumsd.core.seams import SlotLimits
from drumsd.guest import protocol
from drumsd.linux import mounts, write_track

AGENT_SOCK = protocol.SOCKET_PATH.lstrip("/")
READY_FILE = protocol.READY_PATH.lstrip("/")
DESKTOP_UID = 1000
TEMPLATE_LIMITS = SlotLimits(vcpus=2.0, memory_mib=4096, pids_max=4096, tmpfs_mib=1024)


def log_event(event: str, **fields: Any) -> None:
    """One structured line per event on stderr (slot/instance always named)."""
    parts = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"drums.runtime {event} {parts}", file=sys.stderr, flush=True)


# Every default of the config model (core/config.py, the one place defaults are written).
_MODEL = Config.model_construct()


@dataclass(frozen=True)
class LinuxRuntimeConfig:
    """What the Linux runtime reads of the daemon's config: `from_config(config)`, or built
    directly (benches, tests) with a field left out taking the config model's default."""

    state_dir: Path
    criu: Path = _MODEL.criu
    max_concurrent_restores: int = _MODEL.max_concurrent_restores
    max_attempts: int = _MODEL.max_attempts
    warm_upper: bool = _MODEL.warm_upper
    async_kill: bool = _MODEL.async_kill
    restore_cpu_boost: bool = _MODEL.restore_cpu_boost
    restore_cpu_weight: int | None = _MODEL.restore_cpu_weight
    daemon_cpu_weight: int | None = _MODEL.daemon_cpu_weight
    group_cpu_shares: int = _MODEL.linux.group_cpu_shares
    # Memory limit of all slots together (MiB): None = host memory less group_memory_reserve_mib,
    # 0 = none. Each slot's own limit alone lets 50 slots x 2 GiB overcommit a 24 GiB host.
    group_memory_mib: int | None = _MODEL.group_memory_mib
    group_memory_reserve_mib: int = _MODEL.admission.min_available_mib
    ksm: bool = _MODEL.ksm.enabled
    ksm_pages_to_scan: int = _MODEL.ksm.pages_to_scan
    ksm_sleep_millisecs: int = _MODEL.ksm.sleep_millisecs
    ksm_boost_s: float = _MODEL.ksm.boost_s
    ksm_boost_pages_to_scan: int = _MODEL.ksm.boost_pages_to_scan
    ksm_boost_sleep_millisecs: int = _MODEL.ksm.boost_sleep_millisecs
    spares_per_checkpoint: int = _MODEL.spares.per_checkpoint if _MODEL.spares.enabled else 0
    spares_per_host: int = _MODEL.spares.per_host
    spare_max_age_s: float = _MODEL.spares.max_age_s
    images_tmpfs_mib: int = _MODEL.linux.images_tmpfs_mib
    screen_grab: str = _MODEL.linux.screen_grab  # "full": every grab takes the path before
    shm_holes: bool = _MODEL.linux.shm_holes  # zero SysV shm pages made holes before a dump
    track_writes: bool = _MODEL.linux.track_writes  # restored trees armed (write_track.py)
    agent_ready_timeout_s: float = _MODEL.linux.agent_ready_timeout_s
    restore_timeout_s: float = _MODEL.linux.restore_timeout_s
    dump_timeout_s: float = _MODEL.linux.dump_timeout_s
    boot_timeout_s: float = _MODEL.linux.boot_timeout_s
    quiesce_window_s: float = _MODEL.quiesce.window_s
    quiesce_timeout_s: float = _MODEL.quiesce.timeout_s
    quiesce_poll_ms: int = _MODEL.quiesce.poll_ms
    quiesce_events: bool = _MODEL.quiesce.events
    teardown_timeout_s: float = _MODEL.linux.teardown_timeout_s
    profile: str = _MODEL.profile
    criu_log_level: int | None = _MODEL.criu_log_level
    procview_dir: Path | None = _MODEL.procview_dir
    netns_fast: bool = _MODEL.netns_fast
    slot_range: tuple[int, int] = _MODEL.slot_range  # with memory, how many slots the limits fit

    @classmethod
    def from_config(cls, cfg: Config) -> LinuxRuntimeConfig:
        linux = cfg.linux
        return cls(
            state_dir=cfg.state_dir,
            criu=cfg.criu,
            max_concurrent_restores=cfg.max_concurrent_restores,
            max_attempts=cfg.max_attempts,
            warm_upper=cfg.warm_upper,
            async_kill=cfg.async_kill,
            restore_cpu_boost=cfg.restore_cpu_boost,
            restore_cpu_weight=cfg.restore_cpu_weight,
            daemon_cpu_weight=cfg.daemon_cpu_weight,
            group_cpu_shares=linux.group_cpu_shares,
            group_memory_mib=cfg.group_memory_mib,
            group_memory_reserve_mib=cfg.admission.min_available_mib,
            ksm=cfg.ksm.enabled,
            ksm_pages_to_scan=cfg.ksm.pages_to_scan,
            ksm_sleep_millisecs=cfg.ksm.sleep_millisecs,
            ksm_boost_s=cfg.ksm.boost_s,
            ksm_boost_pages_to_scan=cfg.ksm.boost_pages_to_scan,
            ksm_boost_sleep_millisecs=cfg.ksm.boost_sleep_millisecs,
            spares_per_checkpoint=cfg.spares.per_checkpoint if cfg.spares.enabled else 0,
            spares_per_host=cfg.spares.per_host,
            spare_max_age_s=cfg.spares.max_age_s,
            images_tmpfs_mib=linux.images_tmpfs_mib,
            screen_grab=linux.screen_grab,
            shm_holes=linux.shm_holes,
            track_writes=linux.track_writes,
            agent_ready_timeout_s=linux.agent_ready_timeout_s,
            restore_timeout_s=linux.restore_timeout_s,
            dump_timeout_s=linux.dump_timeout_s,
            boot_timeout_s=linux.boot_timeout_s,
            quiesce_window_s=cfg.quiesce.window_s,
            quiesce_timeout_s=cfg.quiesce.timeout_s,
            quiesce_poll_ms=cfg.quiesce.poll_ms,
            quiesce_events=cfg.quiesce.events,
            teardown_timeout_s=linux.teardown_timeout_s,
            profile=cfg.profile,
            criu_log_level=cfg.criu_log_level,
            procview_dir=cfg.procview_dir,
            netns_fast=cfg.netns_fast,
            slot_range=cfg.slot_range,
        )


class AgentGate:
    """Agent calls run concurrently; a dump waits until none is open and blocks new ones (CRIU
    cannot dump a unix socket whose peer is on the host)."""

    def __init__(self) -> None:
        self._cond = trio.Condition()
        self._calls = 0
        self._dumping = False

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        async with self._cond:
            while self._dumping:
                await self._cond.wait()
            self._calls += 1
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                async with self._cond:
                    self._calls -= 1
                    self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def dump(self) -> AsyncIterator[None]:
        async with self._cond:
            while self._dumping or self._calls:
                await self._cond.wait()
            self._dumping = True
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                async with self._cond:
                    self._dumping = False
                    self._cond.notify_all()


@dataclass
class Instance:
    """One process tree and everything it holds on the host."""

    iid: str
    paths: mounts.SlotPaths
    cgroups: dict[str, str]
    checkpoint_id: str
    lower: tuple[Path, ...]
    pid: int = 0
    starttime: int = 0
    pidfd: int = -1
    exited: trio.Event = field(default_factory=trio.Event)
    gate: AgentGate = field(default_factory=AgentGate)
    restore_s: float = 0.0
    # Wall clock when criu began restoring this tree (kept when a spare is claimed: the tree ran
    # between its restore and its freeze). state_hash counts upper entries touched from then on
    # as the tree's own writes.
    restore_started_at: float = 0.0
    attempts: int = 1
    frozen: bool = False
    watched: bool = False
    exit_how: str = ""  # how the init ended, once `exited` is set (a quarantine says it)
    image_sha256: str = ""
    error: str = ""
    boot_proc: trio.Process | None = None
    phases: dict[str, float] = field(default_factory=dict)
    uid_index: int | None = None  # hardened: the slot's host uid range
    born: float = field(default_factory=time.monotonic)
    # The daemon's userfaultfds of the tree's processes (linux.track_writes): closed with it.
    write_track: write_track.Armed | None = None

    @property
    def sock(self) -> str:
        return f"/proc/{self.pid}/root/{AGENT_SOCK}"


@dataclass
class Prepared:
    """A fs (tmpfs + upper copy + overlay) made ahead of a restore (warm_upper)."""

    iid: str
    paths: mounts.SlotPaths
    checkpoint_id: str
    uid_index: int | None = None


def new_iid(prefix: str) -> str:
    return f"{prefix[:40]}-{secrets.token_hex(3)}"


def agent_code(code: str) -> str:
    mapped = {"invalid_action": "invalid_request", "timeout": "timeout", "not_found": "not_found"}
    return mapped.get(code, "action_failed")
