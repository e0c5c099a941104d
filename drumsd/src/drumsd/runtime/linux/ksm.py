"""KSM: joined on start when configured (host-wide, shared with other daemons through
`host_share.KsmShare`), left on stop, boosted after a burst of restores, and its savings read
for /v1/health and metrics.

Every restored task is KSM-eligible from its first instruction (the exec helper sets
`PR_SET_MEMORY_MERGE` on criu, inherited by the tree it restores), but a quiet scan takes
minutes to reach a fork's children: 16 children of an office desktop are ~700k pages, and a
page merges only once the scan has seen it unchanged (or finds it in the stable tree). So a
fork turns the scan rate up for `boost_s`, then back to the quiet rate (spare refills do not:
under a stream of episodes they kept ksmd boosted nearly all the time, spares.py)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import trio

from drumsd.linux import host_share
from drumsd.linux.process_trees import ksm_counters
from drumsd.runtime.linux.base import log_event

KSM_DIR = Path("/sys/kernel/mm/ksm")


# A boost ends once KSM has made this many full passes since the burst (a new process is
# queued just behind the scan cursor: one pass to reach it, one to see its pages unchanged and
# merge them, one to spare), or after its seconds, whichever comes first.
BOOST_PASSES = 3
BOOST_POLL_S = 0.5
# ksmd runs at nice 5 and the slots' cgroup has a high CPU weight: while 16 children redraw,
# a boosted scan got a sixth of a core and reached them after the 10 s that count. Raised only
# once the restores are done: raised from the fork's start, it took 9 CPU-s from a fork of 16
# osworld desktops and made it 1.4x slower. At load 20 on 2 vCPUs, -10 merged a median 0.9 GiB
# of a fork of 16 office desktops within 10 s, -20 1.4 GiB (ksmd 5.3 and 6.9 CPU-s).
BOOST_NICE = -20


@dataclass(frozen=True)
class KsmBoost:
    """The scan rate after a burst of restores, and for how long at most."""

    seconds: float
    pages_to_scan: int
    sleep_millisecs: int


class KsmMembership:
    def __init__(
        self,
        share: host_share.KsmShare,
        *,
        enabled: bool,
        pages_to_scan: int,
        sleep_millisecs: int,
        boost: KsmBoost | None = None,
    ) -> None:
        self.enabled = enabled
        self.ksm_dir = share.ksm_dir
        self._wanted = {
            "run": "1",
            "pages_to_scan": str(pages_to_scan),
            "sleep_millisecs": str(sleep_millisecs),
        }
        self._share = share
        self.joined = False
        self.boost_rate = boost if boost is not None and boost.seconds > 0 else None
        self.boosts = 0  # boosts started (a boost extended by another burst counts once)
        self._boost_until = 0.0  # trio clock
        self._boost_passes_until = 0  # KSM's full_scans count that ends the boost
        self._boosted = trio.Event()
        self._urgent = False  # ksmd reniced to BOOST_NICE by this boost

    def join(self) -> None:
        """Blocking: KSM on with our settings, when enabled (a host without it is logged)."""
        if not self.enabled:
            return
        try:
            failed = self._share.join(self._wanted)
        except OSError as exc:
            log_event("ksm_unavailable", claims=self._share.root, error=exc.strerror)
            return
        for name in failed:
            log_event("ksm_unavailable", file=self.ksm_dir / name)
        self.joined = True

    def leave(self) -> None:
        # The host's values come back only when the last daemon using KSM leaves.
        if self.joined:
            with contextlib.suppress(OSError):
                self.end_boost()  # another daemon still in would keep our boost
                self._share.leave()
            self.joined = False

    def boost(self, *, urgent: bool = True) -> None:
        """Scan at the boost rate for its seconds from now (a boost under way is extended);
        `urgent` (the burst's restores are done) also raises ksmd's priority, which a boost
        begun while restores still run leaves low, so they keep the CPU. Sysfs writes, inline."""
        rate = self.boost_rate
        if rate is None or not self.joined:
            return
        knobs = {
            "pages_to_scan": str(rate.pages_to_scan),
            "sleep_millisecs": str(rate.sleep_millisecs),
        }
        self._share.boost(knobs, rate.seconds)  # host-wide: another daemon's end keeps it
        if not self._boosted.is_set():
            self.boosts += 1
            self._boosted.set()
        if urgent and not self._urgent:
            self._urgent = self._share.renice_scanner(BOOST_NICE)
        self._boost_until = trio.current_time() + rate.seconds
        self._boost_passes_until = self._full_scans() + BOOST_PASSES

    def start_boost(self) -> None:
        """A burst of restores begins: the boost rate at ksmd's own priority."""
        self.boost(urgent=False)

    def end_boost(self) -> None:
        """Back to the quiet rate now (also what `serve_boosts` does when a boost runs out)."""
        if self._boosted.is_set():
            self._boosted = trio.Event()
            self._urgent = False
            if self.joined:
                self._share.unboost({k: v for k, v in self._wanted.items() if k != "run"})

    async def serve_boosts(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Until cancelled: end each boost when its time is up."""
        task_status.started()
        while True:
            await self._boosted.wait()
            # Polled: the kernel signals no end of a pass.
            while self._boosted.is_set() and not self._boost_done():  # noqa: ASYNC110
                await trio.sleep(BOOST_POLL_S)
            self.end_boost()

    def _boost_done(self) -> bool:
        return (
            trio.current_time() >= self._boost_until
            or self._full_scans() >= self._boost_passes_until
        )

    def _full_scans(self) -> int:
        return ksm_counters(self.ksm_dir).get("full_scans", 0)

    def stats(self) -> dict[str, int | bool]:
        """Whether KSM is on and the memory it saves right now."""
        out: dict[str, int | bool] = {"enabled": self.enabled}
        out.update(ksm_counters(self.ksm_dir))
        return out
