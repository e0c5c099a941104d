"""What every tool style shares: a handle on the rollout's desktop, one action, the result.

A tool server is its own process, started per rollout. It learns the desktop from the rollout
state (`env_id`, pulled at its first call) and attaches to it through the SDK. A daemon failure
ends the episode (`state.env_failed`, which the task's stop condition reads); a bad argument is
only the model's mistake and comes back as text it can act on.
"""

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import verifiers.v1 as vf

# verifiers' state channel request (retries transient errors): the only private piece used here
from verifiers.v1.mcp.server import _channel_request

from drums_verifiers import actions, desktop
from drums_verifiers.compat import (
    CallToolResult,
    ImageContent,
    image_content,
    text_content,
    tool_result,
)
from drums_verifiers.config import DesktopToolsConfig
from drums_verifiers.profile import profile_mark
from drums_verifiers.state import DrumsState
from drums_verifiers.tools.nodelay import tool_server_nodelay

log = logging.getLogger("drums_verifiers.tools")
RECOVERABLE_CODES = ("invalid_request", "action_failed")


def text_result(text: str, error: bool = False) -> CallToolResult:
    return tool_result([text_content(text)], error)


class DesktopTools(vf.Toolset[DesktopToolsConfig, DrumsState]):
    TOOL_PREFIX = "computer"

    def __init__(self, config: DesktopToolsConfig) -> None:
        super().__init__(config)
        self._client: Any = None
        self._envs: dict[str, Any] = {}
        self._shared: DrumsState | None = None
        self._pushed: bytes | None = None
        self._pushing: asyncio.Task[None] | None = None
        self._calls = asyncio.Lock()

    async def setup(self) -> None:
        await super().setup()
        tool_server_nodelay()  # before uvicorn listens: 44 ms a call otherwise (nodelay.py)

    # --- the rollout state, synced once in and pushed behind the result ------------------------
    #
    # verifiers wraps every tool in a pull of the whole rollout state before the call and a push
    # after it: two HTTP round trips to vf-eval per call, 0.03-0.09 s of a 0.2-0.46 s call measured
    # (docs/verifiers.md). This server needs neither on the call's path. What it reads (env_id,
    # screen, fork seat) the task's setup writes before the tool servers start, and nothing else
    # writes what it writes (actions, cursor, terminal, tool_s, env_failed). So: one pull at the
    # first call, then a push after the result is out, in order, skipped when nothing changed;
    # a call that ends the episode (terminal, env_failed) pushes before it returns, because the
    # task's stop reads those before the next model call; shutdown waits for the last push,
    # which the task's finalize reads.

    @property
    def state(self) -> DrumsState:
        return self._shared if self._shared is not None else super().state

    def _with_state(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if not self._state_channel()[0]:
            # no per-rollout channel in this process's environment (a shared server gets each
            # rollout's in the request): keep verifiers' pull and push around every call
            return super()._with_state(fn)

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            async with self._calls:  # one call at a time: each sees the last one's state
                if self._shared is None:
                    profile_mark("tool", "pull_start")
                    self._shared = await self._pull_state()  # type: ignore[assignment]
                    self._pushed = self._state_adapter.dump_json(self._shared)
                    self._exit_stack.push_async_callback(self._flush_state)
                    profile_mark("tool", "pull_end")
                ended = (self._shared.terminal, self._shared.env_failed)
                result = await fn(*args, **kwargs)
                profile_mark("tool", "push_start")
                if (self._shared.terminal, self._shared.env_failed) != ended:
                    await self._flush_state()
                else:
                    self._push_soon()
                profile_mark("tool", "push_end")
                return result

        wrapper.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
        return wrapper

    def _push_soon(self) -> None:
        previous = self._pushing

        async def push() -> None:
            if previous is not None:
                await previous
            await self._send_state()

        self._pushing = asyncio.ensure_future(push())

    async def _flush_state(self) -> None:
        """Wait for the pushes under way, then push what is left."""
        if self._pushing is not None:
            await self._pushing
        await self._send_state()

    async def _send_state(self) -> None:
        url, secret, route = self._state_channel()
        if not url or self._shared is None:
            return
        body = self._state_adapter.dump_json(self._shared)
        if body == self._pushed:
            return
        client = self._state_client
        try:
            await _channel_request(
                "PUT",
                url,
                secret,
                route=route,
                content=body,
                client=None if client is None or client.is_closed else client,
            )
        except Exception as exc:  # the trace then lacks this call's tally; the call stands
            log.warning("env=%s: state push to %s failed: %s", self._shared.env_id, url, exc)
            return
        self._pushed = body

    async def _env(self) -> Any:
        env_id = self.state.env_id
        if not env_id:
            raise RuntimeError("the rollout has no desktop yet (state.env_id is empty)")
        if env_id not in self._envs:
            if self._client is None:
                self._client = await desktop.open_client(self.config.daemon)
                self._exit_stack.push_async_callback(desktop.aclose_client, self._client)
            self._envs[env_id] = await desktop.attach_env(self._client, env_id)
        return self._envs[env_id]

    def screen(self) -> actions.Screen:
        width, height = self.state.screen
        return actions.Screen(width, height, self.config.screenshot_scale)

    def cursor(self) -> tuple[int, int] | None:
        c = self.state.cursor
        return (c[0], c[1]) if c else None

    def shot(self) -> bool | dict[str, Any]:
        """The screenshot as the model sees it, made by the daemon (in the guest, once): scaled
        to the screen times `screenshot_scale` and in `screenshot_format`; plain True (a PNG of
        the whole screen) when neither is asked for."""
        return actions.shot_options(
            self.state.screen,
            self.config.screenshot_scale,
            self.config.screenshot_format,
            self.config.screenshot_quality,
        )

    async def screenshot_content(self, env: Any) -> ImageContent:
        shot = self.shot()
        obs = await desktop.observe(env, shot if isinstance(shot, dict) else None)
        return vf_image(obs.png, obs.content_type)

    async def act(self, build: Any, *, screenshot: bool = True) -> CallToolResult:
        """Run one action built by `build()` (which may raise BadAction) and report it."""
        state = self.state
        if state.env_failed:
            return text_result(
                f"the desktop is gone ({state.env_failed}); the episode is over", error=True
            )
        if state.terminal:
            return text_result(f"the episode already ended with {state.terminal}", error=True)
        try:
            action = build()
        except actions.BadAction as exc:
            return text_result(f"error: {exc}", error=True)
        started = time.monotonic()
        try:
            env = await self._env()
            result = await desktop.step(env, action, screenshot=screenshot and self.shot())
            profile_mark("tool", "stepped", action=action["type"])
        except Exception as exc:
            if desktop.is_drums_error(exc) and desktop.error_code(exc) in RECOVERABLE_CODES:
                return text_result(f"error: the desktop refused the action: {exc}", error=True)
            return self.failed(exc, action["type"])
        kind = action["type"]
        state.actions[kind] = state.actions.get(kind, 0) + 1
        cursor = actions.cursor_after(action, self.cursor())
        state.cursor = list(cursor) if cursor else None
        if kind in ("done", "fail"):
            state.terminal = kind
        lines = [actions.describe(action)]
        output = desktop.field(result, "output")
        if output is not None:
            lines.append(command_output(output))
        content: list[Any] = [text_content("\n".join(lines))]
        if screenshot:
            shot = desktop.screenshot_b64(result)
            try:
                content.append(
                    image_content(shot[0], shot[1])
                    if shot is not None
                    else await self.screenshot_content(env)
                )
            except Exception as exc:
                return self.failed(exc, "screenshot")
        state.tool_s.append(time.monotonic() - started)
        profile_mark("tool", "built")
        return tool_result(content)

    def failed(self, exc: Exception, during: str) -> CallToolResult:
        """A daemon or desktop failure: the episode is over (the task's stop reads this)."""
        if not desktop.is_drums_error(exc):
            raise exc
        state = self.state
        state.env_failed = f"{desktop.error_code(exc) or type(exc).__name__}: {exc}"
        log.warning("env=%s failed during %s: %s", state.env_id, during, exc)
        return text_result(
            f"the desktop failed ({state.env_failed}); the episode is over", error=True
        )


def vf_image(data: bytes, content_type: str = "image/png") -> ImageContent:
    import base64

    return image_content(base64.b64encode(data).decode(), content_type)


def command_output(output: Any) -> str:
    code = desktop.field(output, "returncode")
    out = desktop.field(output, "stdout", "") or ""
    err = desktop.field(output, "stderr", "") or ""
    text = f"exit code {code}\n{out}"
    if err:
        text += f"\nstderr:\n{err}"
    return text[-20_000:]
