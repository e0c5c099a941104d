"""KSM: joined on start when configured (host-wide, shared with other daemons through
`host_share.KsmShare`), left on stop, and its savings read for /v1/health and metrics."""

from __future__ import annotations

import contextlib
from pathlib import Path

from drumsd.linux import host_share
from drumsd.linux.process_trees import ksm_counters
from drumsd.runtime.linux.base import log_event

KSM_DIR = Path("/sys/kernel/mm/ksm")


class KsmMembership:
    def __init__(
        self, share: host_share.KsmShare, *, enabled: bool, pages_to_scan: int, sleep_millisecs: int
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
                self._share.leave()
            self.joined = False

    def stats(self) -> dict[str, int | bool]:
        """Whether KSM is on and the memory it saves right now."""
        out: dict[str, int | bool] = {"enabled": self.enabled}
        out.update(ksm_counters(self.ksm_dir))
        return out
