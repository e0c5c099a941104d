"""What the test suites share: polling with a deadline (one helper, in trio or blocking), the
daemon's API in process over the in-memory runtime, and virtual time for trio's MockClock.

Every test root imports it by name (`from harness import ...`): pytest's `pythonpath` in the
root pyproject.toml puts tests/ on sys.path.
"""

from __future__ import annotations

import datetime
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio
from drumsd.api.app import create_app
from drumsd.core.admission import HostSample
from drumsd.core.config import Config
from drumsd.linux.journal_io import Journal
from drumsd.runtime.memory_runtime import MemoryRuntime
from drumsd.runtime.supervisor import Supervisor, open_supervisor
from trio.testing import MockClock

T = TypeVar("T")


def day_sample(items: Sequence[T], per_day: int, day: int | None = None) -> list[T]:
    """The `per_day` of `items` CI runs on `day` (a date ordinal; today's by default): the next
    ones in turn each day, so ceil(len(items) / per_day) days run them all. For slow live cases
    that CI samples and an opt-in tier runs in full (the skip reason names the tier)."""
    if day is None:
        day = datetime.date.today().toordinal()
    n = len(items)
    return [items[(day * per_day + i) % n] for i in range(min(per_day, n))]


TOKEN = "t" * 40
SHA = "ab" * 32
HOST_NAMESPACES = {"pid": 1, "mnt": 2, "net": 3, "ipc": 4, "uts": 5}


# --- polling ---------------------------------------------------------------------------------
# For state that lives in another task or process, with no event to wait on. Both fail naming what
# they waited for and the last value; the async one counts trio's time, so under MockClock its
# limit is virtual.


async def wait_for(
    predicate: Callable[[], Any],
    limit_s: float = 5.0,
    *,
    what: str = "the condition",
    every_s: float | None = None,
) -> Any:
    """`predicate()` (plain or async) until it is truthy, in trio; its value. Fails naming `what`
    and the last value seen. Polls every 10 ms, or under a MockClock every 0.25 s of virtual
    time: each of its jumps waits for the clock's autojump threshold of real idleness."""
    if every_s is None:
        every_s = 0.25 if isinstance(trio.lowlevel.current_clock(), MockClock) else 0.01
    last: Any = None
    try:
        with trio.fail_after(limit_s):
            while True:
                last = predicate()
                if inspect.isawaitable(last):
                    last = await last
                if last:
                    return last
                await trio.sleep(every_s)
    except trio.TooSlowError:
        raise AssertionError(f"{what}: not within {limit_s:g} s (last: {last!r})") from None


def poll(
    what: str, predicate: Callable[[], Any], limit_s: float = 30.0, every_s: float = 0.25
) -> Any:
    """The same, blocking, in wall time: for tests that drive real processes (integration and
    live), where every call names what it waits for."""
    deadline = time.monotonic() + limit_s
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {limit_s:g} s (last: {last!r})")
        time.sleep(every_s)


# --- virtual time ----------------------------------------------------------------------------

VIRTUAL_BASE = 1_700_000_000.0


def virtual_clock() -> float:
    """Wall time for the records that follows trio's clock, so MockClock moves leases too."""
    return VIRTUAL_BASE + trio.current_time()


# --- the daemon's API in process -------------------------------------------------------------


def memory_config(tmp: Path, **overrides: Any) -> dict[str, Any]:
    """A daemon config over the in-memory runtime, its directories under `tmp`."""
    (tmp / "lower").mkdir(exist_ok=True)
    raw: dict[str, Any] = {
        "token_file": str(tmp / "token"),
        "state_dir": str(tmp / "state"),
        "journal_dir": str(tmp / "journal"),
        "forgotten_dir": str(tmp / "forgotten"),
        "lower": str(tmp / "lower"),
        "image_sha256": SHA,
        "runtime": "memory",
        "alive_after_s": 0.05,
    }
    raw.update(overrides)
    return raw


def make_config(tmp: Path, **overrides: Any) -> Config:
    raw = memory_config(tmp, host_usd_per_hour=3.6, lease={"reap_interval_s": 3600})
    raw.update(overrides)
    return Config.model_validate(raw)


def roomy(_: Path) -> HostSample:
    """An admission sample of a host with room for everything."""
    return HostSample(time.time(), 20_000, 24_000, 0.0, 50_000, 100_000)


@dataclass
class Api:
    client: httpx.AsyncClient
    sup: Supervisor
    runtime: MemoryRuntime
    config: Config
    clock: list[float]  # seconds added to the records' clock (a test moves leases with it)


class open_api:
    """`async with open_api(tmp_path, **config) as api`: the supervisor over the in-memory
    runtime, its template built, and an httpx client on the app through the ASGI transport."""

    def __init__(
        self,
        tmp: Path,
        sampler: Callable[[Path], HostSample] = roomy,
        runtime: MemoryRuntime | None = None,
        clock: Callable[[], float] = time.time,
        runtime_cls: type[MemoryRuntime] = MemoryRuntime,
        journal: Journal | None = None,
        **cfg: Any,
    ) -> None:
        self.config = make_config(tmp, **cfg)
        self.runtime = runtime or runtime_cls(self.config.state_dir)
        self.sampler = sampler
        self.wall = clock
        self.journal = journal
        self.clock = [0.0]

    async def __aenter__(self) -> Api:
        self._sup_cm = open_supervisor(
            self.config,
            self.runtime,
            self.journal,
            sampler=self.sampler,
            host_namespaces=HOST_NAMESPACES,
            clock=lambda: self.wall() + self.clock[0],
        )
        sup = await self._sup_cm.__aenter__()
        await wait_for(
            lambda: sup.template_status.get("base") != "building", what="the template build"
        )
        app = create_app(sup, self.config, TOKEN)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://drumsd",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        return Api(self.client, sup, self.runtime, self.config, self.clock)

    async def __aexit__(self, *exc: Any) -> None:
        await self.client.aclose()
        await self._sup_cm.__aexit__(*exc)


async def create(api: Api, **body: Any) -> dict[str, Any]:
    r = await api.client.post("/v1/slots", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def wait_valid(api: Api, slot_id: str, limit_s: float = 5.0) -> dict[str, Any]:
    """The slot's gate report once the episode is judged (valid is no longer None)."""

    async def judged() -> dict[str, Any] | None:
        report = (await api.client.get(f"/v1/slots/{slot_id}/gates")).json()
        return report if report["valid"] is not None else None

    return await wait_for(judged, limit_s, what=f"{slot_id}'s gate verdict", every_s=0.02)


def error_of(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The error body of a refusal, checked: its status, its code, and a message."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]
