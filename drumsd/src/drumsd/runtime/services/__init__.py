"""The supervisor's background services, each `run(sup, *, task_status)` in its nursery.

`guarded_loop` is the one loop they share: an iteration that raises is logged with its context,
counted, and retried after a growing backoff; cancellation always goes through. Each service's
liveness (last iteration) and last error are kept in `ServiceHealth` and shown in /v1/health.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

if TYPE_CHECKING:
    from drumsd.core.config import Config
    from drumsd.core.metrics import MetricsWindow

log = logging.getLogger("drumsd.supervisor")


@dataclasses.dataclass
class ServiceHealth:
    """What /v1/health says about one background service."""

    name: str
    interval_s: float | None = None
    started_at: float | None = None
    last_iteration_at: float | None = None
    iterations: int = 0
    failures: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    finished: bool = False

    def failing(self) -> bool:
        """The latest iteration raised (no success since the last error)."""
        if self.last_error_at is None:
            return False
        return self.last_iteration_at is None or self.last_error_at >= self.last_iteration_at

    def stalled(self, now: float, grace_s: float) -> bool:
        """No iteration finished for well over its interval: the loop is stuck, not just slow."""
        if self.finished or self.interval_s is None:
            return False
        last = self.last_iteration_at or self.started_at
        return last is not None and now - last > 3 * self.interval_s + grace_s

    def as_json(self, now: float, grace_s: float) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["failing"] = self.failing()
        data["stalled"] = self.stalled(now, grace_s)
        return data


class ServiceHost(Protocol):
    """What a service's loop reads of the supervisor: its config, clock, failure metrics and
    the services' health table (the supervisor is one; so is a test's stand-in)."""

    @property
    def config(self) -> Config: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def metrics(self) -> MetricsWindow: ...
    @property
    def services(self) -> dict[str, ServiceHealth]: ...


def register(sup: ServiceHost, name: str, interval_s: float | None) -> ServiceHealth:
    health = ServiceHealth(name=name, interval_s=interval_s, started_at=sup.clock())
    sup.services[name] = health
    return health


async def guarded_loop(
    sup: ServiceHost,
    name: str,
    iteration: Callable[[], Awaitable[object]],
    interval_s: float,
    *,
    sleep_first: bool,
    task_status: trio.TaskStatus[None],
) -> None:
    """Run `iteration` every `interval_s` forever; a failure never ends the loop."""
    health = register(sup, name, interval_s)
    task_status.started()
    backoff = sup.config.service_backoff_s
    if sleep_first:
        await trio.sleep(interval_s)
    while True:
        try:
            await iteration()
        except Exception as exc:  # trio.Cancelled is a BaseException: it always propagates
            health.failures += 1
            health.last_error = f"{type(exc).__name__}: {exc}"
            health.last_error_at = sup.clock()
            sup.metrics.failure(f"service_{name}")
            log.exception(
                "service=%s iteration failed (%d failures); retrying in %gs",
                name,
                health.failures,
                backoff,
            )
            await trio.sleep(backoff)
            backoff = min(backoff * 2, sup.config.service_backoff_max_s)
            continue
        health.iterations += 1
        health.last_iteration_at = sup.clock()
        backoff = sup.config.service_backoff_s
        await trio.sleep(interval_s)


def health_json(sup: ServiceHost) -> tuple[dict[str, Any], list[str]]:
    """Each service's state, and a warning per failing or stalled one."""
    now = sup.clock()
    grace = sup.config.service_backoff_max_s
    out = {name: h.as_json(now, grace) for name, h in sorted(sup.services.items())}
    warnings = []
    for name, h in sorted(sup.services.items()):
        if h.failing():
            warnings.append(f"service {name} failing ({h.failures} failures): {h.last_error}")
        elif h.stalled(now, grace):
            warnings.append(f"service {name} stalled: no iteration since {h.last_iteration_at}")
    return out, warnings
