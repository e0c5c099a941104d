"""What every tool style shares: a handle on the rollout's desktop, one action, the result.

A tool server is its own process, started per rollout. It learns the desktop from the rollout
state (`env_id`, synced before each call) and attaches to it through the SDK. A daemon failure
ends the episode (`state.env_failed`, which the task's stop condition reads); a bad argument is
only the model's mistake and comes back as text it can act on.
"""

import logging
import time
from typing import Any

import verifiers.v1 as vf
from mcp_types import CallToolResult, ImageContent, TextContent

from drums_verifiers import actions, desktop
from drums_verifiers.config import DesktopToolsConfig
from drums_verifiers.profile import profile_mark
from drums_verifiers.state import DrumsState

log = logging.getLogger("drums_verifiers.tools")
RECOVERABLE_CODES = ("invalid_request", "action_failed")


def text_result(text: str, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)


class DesktopTools(vf.Toolset[DesktopToolsConfig, DrumsState]):
    TOOL_PREFIX = "computer"

    def __init__(self, config: DesktopToolsConfig) -> None:
        super().__init__(config)
        self._client: Any = None
        self._envs: dict[str, Any] = {}

    async def _pull_state(self) -> Any:
        profile_mark("tool", "pull_start")
        state = await super()._pull_state()
        profile_mark("tool", "pull_end")
        return state

    async def _push_state(self, before: bytes) -> None:
        profile_mark("tool", "push_start")
        await super()._push_state(before)
        profile_mark("tool", "push_end")

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

    async def screenshot_content(self, env: Any) -> ImageContent:
        obs = await desktop.observe(env)
        png = actions.scale_png(obs.png, self.config.screenshot_scale)
        return vf_image(png)

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
            result = await desktop.step(env, action, screenshot=screenshot)
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
        content: list[Any] = [TextContent(type="text", text="\n".join(lines))]
        if screenshot:
            png = desktop.screenshot_png(result)
            try:
                content.append(
                    vf_image(actions.scale_png(png, self.config.screenshot_scale))
                    if png is not None
                    else await self.screenshot_content(env)
                )
            except Exception as exc:
                return self.failed(exc, "screenshot")
        state.tool_s.append(time.monotonic() - started)
        profile_mark("tool", "built")
        return CallToolResult(content=content)

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


def vf_image(png: bytes) -> ImageContent:
    import base64

    return ImageContent(type="image", data=base64.b64encode(png).decode(), mime_type="image/png")


def command_output(output: Any) -> str:
    code = desktop.field(output, "returncode")
    out = desktop.field(output, "stdout", "") or ""
    err = desktop.field(output, "stderr", "") or ""
    text = f"exit code {code}\n{out}"
    if err:
        text += f"\nstderr:\n{err}"
    return text[-20_000:]
