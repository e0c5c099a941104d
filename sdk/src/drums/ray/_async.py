"""`drums.ray.aconnect()`: the pool for async code (verl's agent loops run many trajectories on
one event loop). Each call is the sync pool's, run in a worker thread, so a step or a create
waits without blocking the loop; the pool itself is made on first use (connecting to Ray and
warming the agents takes a moment, and `aconnect()` is not awaited).

    async with drums.ray.aconnect() as pool:
        env = await pool.create(task="...")
        await env.step({"type": "wait", "seconds": 0}, screenshot=True)
        result = await env.verify()
        await env.aclose()
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

import anyio
import anyio.to_thread

from .. import models as m
from .._observation import Observation
from ._pool import Pool, PoolEnv

T = TypeVar("T")


async def _in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


class AsyncPoolEnv:
    """A pool env's methods as coroutines (`drums.AsyncEnv`'s names)."""

    def __init__(self, env: PoolEnv) -> None:
        self.env = env
        self.id = env.id
        self.host = env.host

    def __repr__(self) -> str:
        return f"AsyncPoolEnv(id={self.id!r}, host={self.host!r})"

    async def refresh(self) -> m.Slot:
        return await _in_thread(self.env.refresh)

    async def wait_valid(self, timeout: float = 60.0) -> m.GateReport:
        return await _in_thread(self.env.wait_valid, timeout=timeout)

    async def gates(self) -> m.GateReport:
        return await _in_thread(self.env.gates)

    async def observe(self) -> Observation:
        return await _in_thread(self.env.observe)

    async def step(self, action: Any, *, screenshot: bool = False) -> m.StepResult:
        return await _in_thread(self.env.step, action, screenshot=screenshot)

    async def reset(self) -> m.Slot:
        return await _in_thread(self.env.reset)

    async def load_task(self, task: Any) -> m.TaskInfo:
        return await _in_thread(self.env.load_task, task)

    async def save(self, *, keep: bool = True, **kwargs: Any) -> m.Checkpoint:
        return await _in_thread(self.env.save, keep=keep, **kwargs)

    async def verify(self, **kwargs: Any) -> m.VerifyResult:
        return await _in_thread(self.env.verify, **kwargs)

    async def metrics(self) -> m.SlotMetrics:
        return await _in_thread(self.env.metrics)

    async def aclose(self) -> None:
        """Destroy the env and give its desktop back (idempotent)."""
        await _in_thread(self.env.close)

    async def __aenter__(self) -> AsyncPoolEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncPool:
    """`drums.ray.Pool` for async code; the keyword arguments are `Pool`'s."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._pool: Optional[Pool] = None
        self._lock = anyio.Lock()

    async def pool(self) -> Pool:
        """The sync pool underneath, connected on first use."""
        async with self._lock:
            if self._pool is None:
                self._pool = await _in_thread(Pool, **self._kwargs)
        return self._pool

    async def create(self, task: Optional[Any] = None, **kwargs: Any) -> AsyncPoolEnv:
        pool = await self.pool()
        return AsyncPoolEnv(await _in_thread(pool.create, task, **kwargs))

    async def health(self) -> Any:
        return await _in_thread((await self.pool()).health)

    async def metrics(self) -> Any:
        return await _in_thread((await self.pool()).metrics)

    async def aclose(self) -> None:
        """Destroy this pool's envs (and the states it saved without keep)."""
        if self._pool is not None:
            await _in_thread(self._pool.close)

    async def __aenter__(self) -> AsyncPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def aconnect(**kwargs: Any) -> AsyncPool:
    """The pool of every drums host in this process's Ray cluster, for async code."""
    return AsyncPool(**kwargs)
