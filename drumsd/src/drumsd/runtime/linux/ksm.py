"""KSM: joined on start when configured (host-wide, shared with other daemons through
`host_share.KsmShare`), left on stop, and its savings read for /v1/health and metrics."""

from __future__ import annotations

import contextlib

from drumsd.linux.process_trees import ksm_counters
from drumsd.runtime.linux.base import KSM_DIR, RuntimeBase, _log


class KsmMixin(RuntimeBase):
    def _ksm_on(self) -> None:
        wanted = {
            "run": "1",
            "pages_to_scan": str(self.config.ksm_pages_to_scan),
            "sleep_millisecs": str(self.config.ksm_sleep_millisecs),
        }
        try:
            failed = self._ksm_share.join(wanted)
        except OSError as exc:
            _log("ksm_unavailable", claims=self._ksm_share.root, error=exc.strerror)
            return
        for name in failed:
            _log("ksm_unavailable", file=KSM_DIR / name)
        self._ksm_joined = True

    def _ksm_restore(self) -> None:
        # The host's values come back only when the last daemon using KSM leaves.
        if self._ksm_joined:
            with contextlib.suppress(OSError):
                self._ksm_share.leave()
            self._ksm_joined = False

    def ksm_stats(self) -> dict[str, int | bool]:
        """For /v1/health and metrics: whether KSM is on and the memory it saves right now."""
        out: dict[str, int | bool] = {"enabled": self.config.ksm}
        out.update(ksm_counters(KSM_DIR))
        return out
