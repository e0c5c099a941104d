"""One MCP client's desktops: the envs it created or attached, which one is current, and the
cleanup that destroys what it created when the client goes away.

A session belongs to one MCP connection (a stdio process, or one streamable-HTTP session). The
envs it creates are owned by its own `drums.AsyncClient`, so closing the session is closing that
client: every env it made is destroyed and every state it saved deleted, shielded from
cancellation with the SDK's cleanup deadline. Attached envs are only forgotten.
"""

from __future__ import annotations

import logging
import struct
from contextlib import AsyncExitStack
from typing import Callable, Dict, List, Optional, Tuple

import anyio

from .. import models as m
from .._async_client import AsyncClient, AsyncEnv
from .._base import Forked
from ..actions import BadAction, Screen

log = logging.getLogger("drums.mcp")


def png_size(png: bytes) -> Optional[Tuple[int, int]]:
    """Width and height from a PNG's IHDR chunk (None if it is not a PNG)."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


class Session:
    """The desktops of one MCP connection; `aclose()` destroys the ones it created."""

    def __init__(self, connect: Callable[[], AsyncClient], name: str) -> None:
        self._connect = connect
        self.name = name
        self._client: Optional[AsyncClient] = None
        self.envs: Dict[str, AsyncEnv] = {}
        self.screens: Dict[str, Screen] = {}
        self.current: Optional[str] = None
        self._forks = AsyncExitStack()
        self.closed = False
        self._closing: Optional[anyio.Event] = None

    @property
    def client(self) -> AsyncClient:
        if self.closed:
            raise BadAction("this MCP session is closed")
        if self._client is None:
            self._client = self._connect()
        return self._client

    def env(self, env_id: Optional[str]) -> AsyncEnv:
        """The named env, or the session's current one."""
        if env_id:
            found = self.envs.get(env_id)
            if found is None:
                known = ", ".join(sorted(self.envs)) or "none"
                raise BadAction(
                    f"env {env_id!r} is not in this session (yours: {known}); "
                    "use desktop_attach to take over an env made elsewhere"
                )
            return found
        if self.current is None:
            raise BadAction(
                "no desktop yet: call desktop_create (task, image or state) or desktop_attach first"
            )
        return self.envs[self.current]

    def screen(self, env_id: str) -> Screen:
        return self.screens.get(env_id, Screen())

    def saw(self, env_id: str, png: bytes, width: Optional[int] = None) -> None:
        """Coordinates are checked against the size of the last screenshot of that env (and
        scaled from it when it was asked `width` pixels wide)."""
        if width is not None:
            self.screens[env_id] = Screen(scale=width / Screen().width)
            return
        size = png_size(png)
        if size is not None:
            self.screens[env_id] = Screen(size[0], size[1])

    def adopt(self, env: AsyncEnv) -> AsyncEnv:
        self.envs[env.id] = env
        self.current = env.id
        log.info("session %s: env %s is current", self.name, env.id, extra={"env_id": env.id})
        return env

    async def create(
        self,
        task: Optional[str],
        image: Optional[str],
        state: Optional[str],
        gates_timeout: float,
    ) -> AsyncEnv:
        if state and (task or image):
            raise BadAction("give a state alone (it already has its image); or a task and/or image")
        env = await self.client.create(task, image=image, from_state=state)
        self.adopt(env)
        await env.wait_valid(timeout=gates_timeout)
        return env

    async def attach(self, env_id: str) -> AsyncEnv:
        return self.adopt(await self.client.attach(env_id))

    async def fork(self, env: AsyncEnv, n: int) -> Forked[AsyncEnv]:
        # The children live until the session closes (or desktop_close): the fork's own
        # context exit, which destroys them, runs at session end.
        forked = await self._forks.enter_async_context(env.fork(n))
        for child in forked.children:
            self.envs[child.id] = child
        return forked

    async def save(self, env: AsyncEnv, keep: bool) -> m.Checkpoint:
        return await env.save(keep=keep)

    async def close_env(self, env: AsyncEnv) -> str:
        """Destroy an env this session created; forget one it attached to."""
        self.envs.pop(env.id, None)
        self.screens.pop(env.id, None)
        if self.current == env.id:
            self.current = next(iter(self.envs), None)
        if env.owned:
            await env.aclose()
            return "destroyed"
        return "detached (not created here, so left running)"

    def listing(self) -> List[str]:
        return [
            f"{eid}{' (current)' if eid == self.current else ''}"
            f"{'' if env.owned else ' (attached)'}"
            for eid, env in self.envs.items()
        ]

    async def aclose(self) -> None:
        """Destroy every env this session created and delete its unkept states. A second call
        (a SIGTERM arriving while the connection's own teardown runs) waits for the first."""
        if self._closing is not None:
            await self._closing.wait()
            return
        self._closing = anyio.Event()
        self.closed = True
        try:
            await self._forks.aclose()
        finally:
            try:
                if self._client is not None:
                    log.info("session %s ends: destroying %d env(s)", self.name, len(self.envs))
                    await self._client.aclose()
            finally:
                self.envs.clear()
                self._closing.set()
