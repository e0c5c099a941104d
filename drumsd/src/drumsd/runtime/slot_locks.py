"""Slot locks that say which operation holds them and since when, and worker threads an
operation's deadline can stop, so /v1/health can name a stuck operation instead of saying ok.

An operation under a slot lock runs under a trio deadline; the file work it hands to a thread
(copy, hash, size of the slot's files) gets a `CancelFlag` that the deadline sets, and the thread
stops at its next chunk. A thread still running after its operation gave up on it is listed by
`abandoned()` until it ends.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import trio

from drumsd.linux.sparse import CancelFlag

T = TypeVar("T")


@dataclass(frozen=True)
class Holder:
    op: str  # the operation's function name (capture, step, destroy ...)
    since: float  # trio time it took the lock
    deadline_s: float | None = None  # its own limit, when it set one


def caller_name(depth: int = 1) -> str:
    """The name of the function `depth` frames above the caller: the operation that took a
    lock, for health to name."""
    return sys._getframe(depth + 1).f_code.co_name  # noqa: SLF001 - CPython's frame API


class SlotLock:
    """A slot's trio.Lock that remembers its holder. `async with lock:` takes it in the name of
    the calling function; `lock.hold(op, deadline_s)` names both."""

    def __init__(self) -> None:
        self._lock = trio.Lock()
        self.holder: Holder | None = None

    def locked(self) -> bool:
        return self._lock.locked()

    def hold(self, op: str, deadline_s: float | None = None) -> _Hold:
        return _Hold(self, op, deadline_s)

    async def __aenter__(self) -> None:
        # The frame that wrote `async with table.lock(...)`: its function names the operation.
        await self.acquire(Holder(caller_name(), 0.0))

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    async def acquire(self, holder: Holder) -> None:
        await self._lock.acquire()
        self.holder = Holder(holder.op, trio.current_time(), holder.deadline_s)

    def release(self) -> None:
        self.holder = None
        self._lock.release()


class _Hold:
    def __init__(self, lock: SlotLock, op: str, deadline_s: float | None) -> None:
        self._lock, self._holder = lock, Holder(op, 0.0, deadline_s)

    async def __aenter__(self) -> None:
        await self._lock.acquire(self._holder)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType
    ) -> None:
        self._lock.release()


def held_too_long(
    locks: dict[str, SlotLock], now: float, default_limit_s: float
) -> list[tuple[str, Holder, float]]:
    """(slot, holder, seconds held) of the locks held past their holder's deadline, or past
    `default_limit_s` for a holder that set none."""
    out = []
    for slot_id, lock in locks.items():
        holder = lock.holder
        if holder is None:
            continue
        held = now - holder.since
        limit = holder.deadline_s if holder.deadline_s is not None else default_limit_s
        if held > limit:
            out.append((slot_id, holder, held))
    return out


# --- worker threads ---------------------------------------------------------------------------

_abandoned: dict[int, tuple[str, float]] = {}  # worker number -> (what, monotonic time given up)
_abandoned_lock = threading.Lock()
_numbers = itertools.count()


async def run_stoppable(fn: Callable[..., T], *args: Any, what: str) -> T:
    """`fn(*args, cancel=flag)` in a worker thread. When the caller is cancelled (its deadline),
    it returns at once: the flag is set so `fn` stops at its next chunk, and until it has, the
    thread is listed by `abandoned()` as `what`."""
    cancel = CancelFlag()
    number = next(_numbers)
    ended = threading.Event()

    def work() -> T:
        try:
            return fn(*args, cancel=cancel)
        finally:
            with _abandoned_lock:
                _abandoned.pop(number, None)
                ended.set()

    try:
        return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
    except trio.Cancelled:
        cancel.set()
        with _abandoned_lock:
            if not ended.is_set():
                _abandoned[number] = (what, time.monotonic())
        raise


def abandoned() -> list[tuple[str, float]]:
    """(what, seconds since it was given up) of the worker threads still running after their
    operation stopped waiting for them."""
    now = time.monotonic()
    with _abandoned_lock:
        return [(what, now - at) for what, at in _abandoned.values()]
