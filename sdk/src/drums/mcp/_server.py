"""The MCP tools: make or take a desktop, act on it, look at it, fork, save, verify and close.

Every tool takes an optional `env_id`; without it the tool acts on the session's current env (the
last one created or attached). A session is one MCP connection: its state lives on the
connection, and the connection's teardown (stdio EOF, HTTP session DELETE or loss) destroys the
envs it created. Connections without a handshake (the stateless 2026-07 protocol) share one
session that ends with the server.

Errors a client can fix (bad arguments, an unknown env, a refused action) come back as an MCP
error result whose text says what to send instead; they never end the server.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import TextContent
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .. import actions
from .._async_client import AsyncClient, AsyncEnv
from .._base import validity
from .._exceptions import DrumsError
from .._version import __version__
from ._session import Session

log = logging.getLogger("drums.mcp")
SHARED = "shared"
INSTRUCTIONS = (
    "Linux desktops from a drums daemon. Start with desktop_create (an OSWorld task id, an image "
    "or a saved state) or desktop_attach; then act (click, type, key, ...), look (screenshot), "
    "verify, and desktop_close. Every tool takes env_id, or acts on the current desktop."
)


class Sessions:
    """Every live session of this server; whatever is still open when it stops is closed."""

    def __init__(self, connect: Callable[[], AsyncClient], gates_timeout: float) -> None:
        self.connect = connect
        self.gates_timeout = gates_timeout
        self.live: Dict[int, Session] = {}
        self._count = 0

    async def of(self, ctx: Context) -> Session:
        connection = getattr(ctx.request_context.session, "_connection", None)
        if connection is None or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self._shared()
        session: Optional[Session] = connection.state.get("drums")
        if session is None:
            self._count += 1
            session = Session(self.connect, connection.session_id or f"conn-{self._count}")
            connection.state["drums"] = session
            self.live[id(session)] = session
            connection.exit_stack.push_async_callback(self._end, session)
        return session

    def _shared(self) -> Session:
        for session in self.live.values():
            if session.name == SHARED:
                return session
        session = Session(self.connect, SHARED)
        self.live[id(session)] = session
        return session

    async def _end(self, session: Session) -> None:
        # Still listed while it closes, so a server-wide aclose() waits for it too.
        try:
            await session.aclose()
        except DrumsError as exc:
            log.error("session %s: cleanup failed: %s", session.name, exc)
        finally:
            self.live.pop(id(session), None)

    async def aclose(self) -> None:
        for session in list(self.live.values()):
            await self._end(session)


def _failed(exc: Exception) -> ToolError:
    if isinstance(exc, actions.BadAction):
        return ToolError(str(exc))
    if isinstance(exc, DrumsError):
        return ToolError(f"drums: {exc}")
    return ToolError(f"{type(exc).__name__}: {exc}")


async def episode_line(env: AsyncEnv) -> str:
    """The episode's gate verdict after an action, as one line of the tool's result; the action
    already happened, so a failed gates read is reported, not raised."""
    try:
        v = validity(await env.gates())
    except DrumsError as exc:
        return f"episode: unknown (gates: {exc})"
    if v["valid"] is False:
        failed = ", ".join(v["failed_gates"])
        return f"episode: invalid (failed gates: {failed}); its score must not be trained on"
    if v["valid"] is None:
        return f"episode: pending (gates: {', '.join(v['pending_gates']) or '?'})"
    return "episode: valid"


def build_server(
    connect: Callable[[], AsyncClient],
    *,
    gates_timeout: float = 120.0,
    sessions: Optional[Sessions] = None,
    vendor_tools: Optional[str] = None,
    model_screen: Optional[Tuple[int, int]] = None,
    **settings: Any,
) -> MCPServer:
    """The `drums mcp` server; `connect()` makes one drums client per session (`sessions`, if
    given, is the registry to use: the caller can then close every session itself).
    `vendor_tools` ("anthropic" or "openai") puts that vendor's computer tools in place of
    drums' own of the same names; `model_screen` is the model's (width, height) for them."""
    sessions = sessions or Sessions(connect, gates_timeout)

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[Sessions]:
        try:
            yield sessions
        finally:
            await sessions.aclose()

    server: MCPServer = MCPServer(
        "drums",
        instructions=INSTRUCTIONS,
        version=__version__,
        lifespan=lifespan,
        **settings,
    )

    async def act(
        ctx: Context, env_id: Optional[str], build: Callable[[actions.Screen], Dict[str, Any]]
    ) -> str:
        try:
            session = await sessions.of(ctx)
            env = session.env(env_id)
            action = build(session.screen(env.id))
            result = await env.step(action)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        line = f"{actions.describe(action)} on {env.id} (action {result.actions})"
        line += "\n" + await episode_line(env)
        if result.output is not None:
            out = result.output
            line += f"\nreturncode {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
        return line

    @server.tool()
    async def desktop_create(
        ctx: Context,
        task: Optional[str] = None,
        image: Optional[str] = None,
        state: Optional[str] = None,
    ) -> str:
        """A new desktop, made current: on an OSWorld task id (its setup run), an image, or a
        saved state. Destroyed when this MCP session ends."""
        try:
            session = await sessions.of(ctx)
            env = await session.create(task, image, state, sessions.gates_timeout)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        text = f"env {env.id} is ready (image {env.slot.image}, task {env.slot.task_id or 'none'})"
        instruction = env._instruction  # known when the task came inline (a file or dict)
        return f"{text}\ninstruction: {instruction}" if instruction else text

    @server.tool()
    async def desktop_attach(ctx: Context, env_id: str) -> str:
        """Take over an env made elsewhere (by id), made current; left running at session end."""
        try:
            env = await (await sessions.of(ctx)).attach(env_id)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        return f"attached to env {env.id} ({env.slot.state.value})"

    @server.tool()
    async def desktop_list(ctx: Context) -> str:
        """The desktops of this session."""
        return "\n".join((await sessions.of(ctx)).listing()) or "no desktops in this session"

    @server.tool()
    async def click(ctx: Context, x: int, y: int, env_id: Optional[str] = None) -> str:
        """Left click at screen pixel (x, y)."""
        return await act(ctx, env_id, lambda s: actions.click(s, x, y))

    @server.tool()
    async def double_click(ctx: Context, x: int, y: int, env_id: Optional[str] = None) -> str:
        """Double click at (x, y)."""
        return await act(ctx, env_id, lambda s: actions.click(s, x, y, "double_click"))

    @server.tool()
    async def right_click(ctx: Context, x: int, y: int, env_id: Optional[str] = None) -> str:
        """Right click at (x, y)."""
        return await act(ctx, env_id, lambda s: actions.click(s, x, y, "right_click"))

    @server.tool()
    async def move(ctx: Context, x: int, y: int, env_id: Optional[str] = None) -> str:
        """Move the pointer to (x, y)."""
        return await act(ctx, env_id, lambda s: actions.click(s, x, y, "move"))

    @server.tool()
    async def drag(
        ctx: Context, x: int, y: int, to_x: int, to_y: int, env_id: Optional[str] = None
    ) -> str:
        """Press at (x, y), move to (to_x, to_y), release."""
        return await act(ctx, env_id, lambda s: actions.drag(s, x, y, to_x, to_y))

    @server.tool()
    async def scroll(
        ctx: Context, x: int, y: int, amount: int, env_id: Optional[str] = None
    ) -> str:
        """Scroll at (x, y): positive amounts up, negative down."""
        return await act(ctx, env_id, lambda s: actions.scroll(s, x, y, amount))

    @server.tool(name="type")
    async def type_(ctx: Context, text: str, env_id: Optional[str] = None) -> str:
        """Type text."""
        return await act(ctx, env_id, lambda s: actions.type_text(text))

    @server.tool()
    async def key(ctx: Context, key: str, env_id: Optional[str] = None) -> str:
        """Press one key ('enter', 'tab', 'f5'); 'ctrl+s' presses a combination."""
        return await act(ctx, env_id, lambda s: actions.key(key))

    @server.tool()
    async def hotkey(ctx: Context, keys: List[str], env_id: Optional[str] = None) -> str:
        """Press keys together, e.g. ['ctrl', 'shift', 't']."""
        return await act(ctx, env_id, lambda s: actions.hotkey(keys))

    @server.tool()
    async def wait(ctx: Context, seconds: float, env_id: Optional[str] = None) -> str:
        """Wait on the desktop (0 to 60 seconds)."""
        return await act(ctx, env_id, lambda s: actions.wait(seconds))

    @server.tool()
    async def execute(
        ctx: Context, command: str, timeout_s: float = 30.0, env_id: Optional[str] = None
    ) -> str:
        """Run a shell command as the desktop user (bash -lc); returns its exit code and output."""
        return await act(ctx, env_id, lambda s: actions.execute(command, timeout_s))

    @server.tool()
    async def screenshot(
        ctx: Context,
        format: str = "png",
        quality: Optional[int] = None,
        width: Optional[int] = None,
        env_id: Optional[str] = None,
    ) -> Image:
        """The desktop's screen now: png (default), jpeg or webp (quality 1..100), scaled to
        `width` pixels wide (aspect kept). Later clicks take coordinates in this image's space."""
        try:
            session = await sessions.of(ctx)
            env = session.env(env_id)
            if format == "png" and quality is None and width is None:
                obs = await env.observe()
            else:
                obs = await env.observe(format=format, quality=quality, width=width)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        session.saw(env.id, obs.png, width)
        return Image(data=obs.png, format=obs.content_type.split("/")[1])

    async def run_calls(
        ctx: Context,
        dialect: str,
        calls: List[Dict[str, Any]],
        env_id: Optional[str],
        screen: Optional[Tuple[int, int]] = None,
        shot: Any = True,
    ) -> List[Any]:
        try:
            env = (await sessions.of(ctx)).env(env_id)
            result = await env.step(calls, dialect=dialect, screen=screen, screenshot=shot)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        out: List[Any] = []
        lines = [f"{len(calls)} {dialect} call(s) on {env.id} (action {result.actions})"]
        for call in result.results or []:
            line = f"[{call.index}] {call.name}"
            if call.cursor is not None:
                line += f": cursor at ({call.cursor['x']}, {call.cursor['y']})"
            lines.append(line)
            data = call.image_bytes()
            if data is not None:
                kind = (call.image_content_type or "image/png")[6:]
                out.append(Image(data=data, format=kind).to_image_content())
        lines.append(await episode_line(env))
        final = result.screenshot_bytes()
        if final is not None:
            kind = (result.screenshot_content_type or "image/png")[6:]
            out.append(Image(data=final, format=kind).to_image_content())
        return [TextContent(type="text", text="\n".join(lines)), *out]

    @server.tool(structured_output=False)
    async def computer(
        ctx: Context,
        dialect: str,
        actions: List[Dict[str, Any]],
        screen_width: Optional[int] = None,
        screen_height: Optional[int] = None,
        screenshot: bool = True,
        format: str = "png",
        quality: Optional[int] = None,
        env_id: Optional[str] = None,
    ) -> List[Any]:
        """Vendors' computer-use calls, forwarded as they are, run in order in one step.
        dialect: anthropic-2026-08 (calls {"name": "left_click", "input": {...}}),
        anthropic-2025-01 / anthropic-2025-11 (the single tool's inputs {"action": ..., ...}),
        openai (actions {"type": "click", "button": "left", "x": .., "y": ..}). screen_width x
        screen_height is the model's screen (coordinates scaled from it, screenshots and cursor
        positions to it). Returns a line per call (cursor positions included), zoom and
        screenshot images, and the screen after the batch when screenshot is true."""
        screen = None
        if screen_width is not None or screen_height is not None:
            if screen_width is None or screen_height is None:
                raise ToolError("give screen_width and screen_height together (the model's size)")
            screen = (screen_width, screen_height)
        shot: Any = False
        if screenshot:
            shot = {"format": format} if quality is None else {"format": format, "quality": quality}
        return await run_calls(ctx, dialect, actions, env_id, screen, shot)

    @server.tool()
    async def terminal(ctx: Context, env_id: Optional[str] = None) -> str:
        """The text of the desktop's terminal (the focused or newest xterm: its scrollback and
        screen); reading it is not an action."""
        try:
            got = await (await sessions.of(ctx)).env(env_id).terminal()
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        if got.text is None:
            raise ToolError(f"no terminal text on {got.slot}: {got.reason}")
        return got.text

    @server.tool()
    async def fork(ctx: Context, n: int = 1, env_id: Optional[str] = None) -> str:
        """N copies of the desktop as it is now (CRIU restores of one checkpoint). The current
        env stays current; name a child by env_id. Children end with this session."""
        try:
            session = await sessions.of(ctx)
            forked = await session.fork(session.env(env_id), n)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        ids = ", ".join(c.id for c in forked.children)
        return f"forked {len(forked.children)} in {forked.elapsed_s:.2f} s: {ids}"

    @server.tool()
    async def save(ctx: Context, keep: bool = True, env_id: Optional[str] = None) -> str:
        """Save the desktop (a checkpoint desktop_create(state=...) restores). It lives until its
        lease on the daemon runs out (30 min unused by default; a restore renews it), whether or
        not this session is still open; keep=false deletes it when this session ends."""
        try:
            session = await sessions.of(ctx)
            state = await session.save(session.env(env_id), keep)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        return f"saved state {state.id}" + ("" if keep else " (deleted when this session ends)")

    @server.tool()
    async def verify(ctx: Context, env_id: Optional[str] = None) -> str:
        """Run the task's checker: score, and whether the episode is valid (its gates passed)."""
        try:
            env: AsyncEnv = (await sessions.of(ctx)).env(env_id)
            result = await env.verify(strict=False)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        return json.dumps(
            {
                "env_id": env.id,
                "score": result.score,
                "valid": result.valid,
                "verdict": result.verdict,
                "invalid_reasons": result.invalid_reasons,
                "checker_error": result.checker_error,
            }
        )

    @server.tool()
    async def desktop_close(ctx: Context, env_id: Optional[str] = None) -> str:
        """Destroy a desktop this session created (an attached one is only let go)."""
        try:
            session = await sessions.of(ctx)
            env = session.env(env_id)
            what = await session.close_env(env)
        except (actions.BadAction, DrumsError) as exc:
            raise _failed(exc) from exc
        return f"env {env.id} {what}"

    if vendor_tools is not None:
        from ._vendor import register

        async def vendor_run(
            ctx: Context, dialect: str, calls: List[Dict[str, Any]], env_id: Optional[str]
        ) -> List[Any]:
            return await run_calls(ctx, dialect, calls, env_id, model_screen)

        register(server, vendor_tools, vendor_run)

    return server
