"""A ring buffer of host samples over time, for the console's charts: live slots, restores and
steps per second, memory available, KSM savings, spares parked. One small dict every
EVERY_S seconds, HISTORY_SAMPLES of them (an hour); memory only, lost on restart."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

EVERY_S = 5.0
HISTORY_SAMPLES = 720
# Operations that restore a desktop from a checkpoint (CRIU restores on the Linux runtime).
RESTORE_OPERATIONS = ("create", "reset", "fork")


class HostHistory:
    def __init__(self, size: int = HISTORY_SAMPLES, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self.samples: deque[dict[str, Any]] = deque(maxlen=size)
        self._last: tuple[float, int, int] | None = None  # (at, restores, steps) counted so far

    def add(
        self,
        now: float,
        *,
        slots_by_state: Mapping[str, int],
        op_counts: Mapping[str, int],
        mem_available_mib: float | None,
        mem_total_mib: float | None,
        ksm_saved_mib: float | None = None,
        spares_parked: int | None = None,
    ) -> dict[str, Any]:
        """One sample from the counts of the metrics window at `now`. Rates are the counts'
        growth since the last sample; a metrics window reset (counts fall) counts from zero."""
        restores = sum(int(op_counts.get(op, 0)) for op in RESTORE_OPERATIONS)
        steps = int(op_counts.get("step", 0))
        rates: dict[str, float | None] = {"restores_per_s": None, "steps_per_s": None}
        if self._last is not None and now > self._last[0]:
            at, r0, s0 = self._last
            dt = now - at
            rates["restores_per_s"] = round((restores - r0 if restores >= r0 else restores) / dt, 4)
            rates["steps_per_s"] = round((steps - s0 if steps >= s0 else steps) / dt, 4)
        self._last = (now, restores, steps)
        live = {k: int(v) for k, v in slots_by_state.items() if k not in ("destroyed",)}
        sample = {
            "ts": now,
            "slots": sum(live.values()),
            "ready": live.get("ready", 0),
            "quarantined": live.get("quarantined", 0),
            "busy": live.get("busy", 0),
            **rates,
            "mem_available_mib": mem_available_mib,
            "mem_total_mib": mem_total_mib,
            "ksm_saved_mib": ksm_saved_mib,
            "spares_parked": spares_parked,
        }
        self.samples.append(sample)
        return sample

    def as_json(self, since: float | None = None) -> dict[str, Any]:
        rows = [s for s in self.samples if since is None or s["ts"] > since]
        return {"every_s": self.every_s, "size": self.samples.maxlen, "samples": rows}
