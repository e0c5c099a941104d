"""Warm-spare pool sizing and bookkeeping: pure logic, no OS effects.

A pool must hold the claims that arrive while one refill runs (Little's law: rate * restore
time), with headroom for bursts, and never fewer than MIN_SPARES while the pool is in use. It is
bounded by the config (per checkpoint, per host) and by admission control: refills are new
desktops and must not push the host past the floors that refuse creates.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from drumsd.core.metrics import Histogram

# Claims older than this no longer describe the current load.
RATE_WINDOW_S = 120.0
# Burst headroom over the mean rate (claims are bursty: a fork, a trainer's synchronized reset).
HEADROOM = 2.0
# Restore time assumed before any restore of the checkpoint was observed (measured 0.15-0.3 s).
DEFAULT_RESTORE_S = 0.25
# One spare leaves no margin: a refill runs 0.16-0.33 s p50 here with long tails under load, and a
# claim that finds a dead spare moves to the next. Two kept every 1/s reset a hit (warm-spares.md).
MIN_SPARES = 2


def spare_target(
    claims_per_s: float | None, restore_s: float, per_checkpoint: int, headroom: float = HEADROOM
) -> int:
    """Spares one checkpoint should keep. `claims_per_s` None = never claimed yet: keep the
    configured maximum so the first episodes hit; a quiet checkpoint keeps MIN_SPARES."""
    if per_checkpoint <= 0:
        return 0
    if claims_per_s is None:
        return per_checkpoint
    need = math.ceil(max(0.0, claims_per_s) * max(0.0, restore_s) * headroom)
    return min(per_checkpoint, max(MIN_SPARES, need))


def share_host(targets: Mapping[str, int], per_host: int) -> dict[str, int]:
    """Fit per-checkpoint targets into `per_host`: hand out spares one at a time, round robin
    in order of demand, so every pool gets its first spare before any gets a third."""
    out = dict.fromkeys(targets, 0)
    left = max(0, per_host)
    order = sorted(targets, key=lambda k: (-targets[k], k))
    while left > 0:
        gave = False
        for key in order:
            if left > 0 and out[key] < targets[key]:
                out[key] += 1
                left -= 1
                gave = True
        if not gave:
            break
    return out


@dataclass
class PoolStats:
    """What the control plane saw of one checkpoint's pool: hits, misses, claim latency."""

    hits: int = 0
    misses: int = 0
    claim_s: Histogram = field(default_factory=Histogram)  # spare hits: thaw until agent answers
    restore_s: Histogram = field(default_factory=Histogram)  # misses: the restore path
    claims_at: deque[float] = field(default_factory=deque)

    def record(self, now: float, spare: bool, seconds: float) -> None:
        if spare:
            self.hits += 1
            self.claim_s.observe(seconds)
        else:
            self.misses += 1
            self.restore_s.observe(seconds)
        self.claims_at.append(now)
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self.claims_at and now - self.claims_at[0] > RATE_WINDOW_S:
            self.claims_at.popleft()

    def claims_per_s(self, now: float, since: float) -> float | None:
        """Claims per second over the recent window (None before the first claim). `since` is
        when tracking began, so a young pool is not judged over a window it did not live."""
        self._trim(now)
        if self.hits + self.misses == 0:
            return None
        span = max(1.0, min(RATE_WINDOW_S, now - since))
        return len(self.claims_at) / span

    def typical_restore_s(self) -> float:
        return self.restore_s.quantile(0.5) or DEFAULT_RESTORE_S

    def summary(self) -> dict[str, float | int | None]:
        total = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_ratio": self.hits / total if total else None,
            "claim_p50_s": self.claim_s.quantile(0.5),
            "claim_p99_s": self.claim_s.quantile(0.99),
            "restore_p50_s": self.restore_s.quantile(0.5),
        }


__all__ = ["PoolStats", "share_host", "spare_target"]
