"""Ownership of the desktops of one verifiers episode, and their shielded teardown.

`DrumsEnv.run` opens an `EpisodeDesktops` around the episode and closes it on every path;
`DrumsTask.setup` finds it through a context variable and creates (or, for fork children,
adopts) the rollout's desktop through it. A task run outside `DrumsEnv` gets a private owner
that its reward closes, with the daemon's idle lease as the backstop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from dataclasses import dataclass
from typing import Any

from verifiers.v1.utils.aio import run_shielded

from drums_verifiers import desktop
from drums_verifiers.config import DaemonConfig
from drums_verifiers.profile import profile_mark

log = logging.getLogger("drums_verifiers.episode")
CLOSE_TIMEOUT_S = 30.0


@dataclass
class ForkSeat:
    """The child desktop a fork-group rollout plays on."""

    env: Any
    parent: str
    index: int


CURRENT: contextvars.ContextVar[EpisodeDesktops | None] = contextvars.ContextVar(
    "drums_episode", default=None
)
SEAT: contextvars.ContextVar[ForkSeat | None] = contextvars.ContextVar("drums_seat", default=None)


class EpisodeDesktops:
    """Opens one SDK client lazily, tracks every env it created, closes them all on exit."""

    def __init__(self, daemon: DaemonConfig) -> None:
        self.daemon = daemon
        self._client: Any = None
        self._client_lock = asyncio.Lock()
        self._owned: list[Any] = []
        self.by_trace: dict[str, Any] = {}
        """The env each rollout (trace id) plays on, for its finalize."""
        self.closed = False

    async def client(self) -> Any:
        async with self._client_lock:
            if self.closed:
                raise RuntimeError("this episode's desktops are already closed")
            if self._client is None:
                self._client = await desktop.open_client(self.daemon)
            return self._client

    async def create(self, task: str | dict[str, Any], idle_timeout_s: float) -> Any:
        env = await desktop.create_env(await self.client(), task, idle_timeout_s)
        self._owned.append(env)
        log.info(
            "created env=%s task=%s",
            desktop.env_id(env),
            task if isinstance(task, str) else task.get("id"),
        )
        return env

    async def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for env in reversed(self._owned):
            started = time.monotonic()
            try:
                await asyncio.wait_for(desktop.close_env(env), CLOSE_TIMEOUT_S)
                close_s = round(time.monotonic() - started, 4)
                log.info("closed env=%s in %.3f s", desktop.env_id(env), close_s)
                # after the traces and records are written: the overhead bench reads it here
                profile_mark("episode", "closed", env=desktop.env_id(env), close_s=close_s)
            except Exception:
                log.warning(
                    "closing env=%s failed; its idle lease will reap it",
                    desktop.env_id(env),
                    exc_info=True,
                )
        self._owned.clear()
        self.by_trace.clear()
        if self._client is not None:
            try:
                await asyncio.wait_for(desktop.aclose_client(self._client), CLOSE_TIMEOUT_S)
            except Exception:
                log.warning("closing the drums client failed", exc_info=True)
            self._client = None

    async def aclose(self) -> None:
        """Close every desktop, even when the caller is being cancelled."""
        await run_shielded(self._close())

    async def __aenter__(self) -> EpisodeDesktops:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# Tasks run without DrumsEnv keep their private owner here between setup and reward.
_PRIVATE: dict[str, EpisodeDesktops] = {}


def owner_for(trace_id: str, daemon: DaemonConfig) -> EpisodeDesktops:
    current = CURRENT.get()
    if current is not None:
        return current
    return _PRIVATE.setdefault(trace_id, EpisodeDesktops(daemon))


async def release_private(trace_id: str) -> None:
    owner = _PRIVATE.pop(trace_id, None)
    if owner is not None:
        await owner.aclose()
