"""`drums mcp --vendor-tools anthropic|openai`: the vendor's computer tools under the vendor's own
names and argument names (Anthropic's toolset members; OpenAI's `computer` with a batch of
actions), so a client that forwards the model's tool calls needs no mapping. They replace drums'
action tools of the same names; each call runs through the daemon's dialect step
(drums.dialects) and returns a line per call, its images and the screen after.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, List, Optional

from mcp.server.mcpserver import Context, MCPServer

Run = Callable[[Context, str, List[Dict[str, Any]], Optional[str]], Awaitable[List[Any]]]
ANTHROPIC = "anthropic-2026-08"
# drums' own tools these replace (same names, other arguments).
REPLACED = {
    "anthropic": ("double_click", "right_click", "scroll", "type", "key", "wait", "screenshot"),
    "openai": ("computer",),
}
Point = Optional[List[int]]


def register(server: MCPServer, vendor: str, run: Run) -> None:
    for name in REPLACED[vendor]:
        server.remove_tool(name)
    if vendor == "openai":
        _openai(server, run)
    else:
        _anthropic(server, run)


def _openai(server: MCPServer, run: Run) -> None:
    @server.tool(structured_output=False)
    async def computer(
        ctx: Context, actions: List[Dict[str, Any]], env_id: Optional[str] = None
    ) -> List[Any]:
        """OpenAI's computer tool: run `actions` (click, double_click, drag, keypress, move,
        screenshot, scroll, type, wait; screenshot pixels) in order; the screen after."""
        return await run(ctx, "openai", actions, env_id)


def _anthropic(server: MCPServer, run: Run) -> None:
    async def member(ctx: Context, env_id: Optional[str], name: str, **fields: Any) -> List[Any]:
        given = {k: v for k, v in fields.items() if v is not None}
        return await run(ctx, ANTHROPIC, [{"name": name, "input": given}], env_id)

    tool = server.tool(structured_output=False)

    @tool
    async def screenshot(ctx: Context, env_id: Optional[str] = None) -> List[Any]:
        """Take a screenshot."""
        return await member(ctx, env_id, "screenshot")

    @tool
    async def zoom(ctx: Context, region: List[int], env_id: Optional[str] = None) -> List[Any]:
        """The region [x0, y0, x1, y1] at full resolution."""
        return await member(ctx, env_id, "zoom", region=region)

    def clicker(name: str, doc: str) -> None:
        async def click(
            ctx: Context, coordinate: Point = None, text: Optional[str] = None,
            env_id: Optional[str] = None,
        ) -> List[Any]:  # fmt: skip
            return await member(ctx, env_id, name, coordinate=coordinate, text=text)

        click.__doc__ = doc
        server.tool(name=name, structured_output=False)(click)

    for name, what in (
        ("left_click", "Left click"),
        ("right_click", "Right click"),
        ("middle_click", "Middle click"),
        ("double_click", "Double click"),
        ("triple_click", "Triple click"),
    ):
        clicker(name, f"{what} at [x, y] (or the cursor); text: modifier keys held.")

    @tool
    async def left_click_drag(
        ctx: Context, coordinate: List[int], start_coordinate: Point = None,
        text: Optional[str] = None, env_id: Optional[str] = None,
    ) -> List[Any]:  # fmt: skip
        """Press at start_coordinate (or the cursor), drag to coordinate, release."""
        return await member(
            ctx, env_id, "left_click_drag", coordinate=coordinate,
            start_coordinate=start_coordinate, text=text,
        )  # fmt: skip

    @tool
    async def mouse_move(
        ctx: Context, coordinate: List[int], text: Optional[str] = None,
        env_id: Optional[str] = None,
    ) -> List[Any]:  # fmt: skip
        """Move the cursor to [x, y]."""
        return await member(ctx, env_id, "mouse_move", coordinate=coordinate, text=text)

    @tool
    async def left_mouse_down(ctx: Context, env_id: Optional[str] = None) -> List[Any]:
        """Press and hold the left button where the cursor is."""
        return await member(ctx, env_id, "left_mouse_down")

    @tool
    async def left_mouse_up(ctx: Context, env_id: Optional[str] = None) -> List[Any]:
        """Release the left button where the cursor is."""
        return await member(ctx, env_id, "left_mouse_up")

    @tool
    async def cursor_position(ctx: Context, env_id: Optional[str] = None) -> List[Any]:
        """Where the cursor is."""
        return await member(ctx, env_id, "cursor_position")

    @tool
    async def scroll(
        ctx: Context, scroll_direction: str, scroll_amount: int, coordinate: Point = None,
        text: Optional[str] = None, env_id: Optional[str] = None,
    ) -> List[Any]:  # fmt: skip
        """Scroll up, down, left or right by scroll_amount wheel clicks at [x, y]."""
        return await member(
            ctx, env_id, "scroll", scroll_direction=scroll_direction,
            scroll_amount=scroll_amount, coordinate=coordinate, text=text,
        )  # fmt: skip

    @server.tool(name="type", structured_output=False)
    async def type_(ctx: Context, text: str, env_id: Optional[str] = None) -> List[Any]:
        """Type a string of text."""
        return await member(ctx, env_id, "type", text=text)

    @tool
    async def key(
        ctx: Context, text: str, repeat: Optional[int] = None, env_id: Optional[str] = None
    ) -> List[Any]:
        """Press a key or combination ("Return", "ctrl+s"), repeat times."""
        return await member(ctx, env_id, "key", text=text, repeat=repeat)

    @tool
    async def hold_key(
        ctx: Context, text: str, duration: float, env_id: Optional[str] = None
    ) -> List[Any]:
        """Hold a key or combination for duration seconds."""
        return await member(ctx, env_id, "hold_key", text=text, duration=duration)

    @tool
    async def wait(ctx: Context, duration: float = 1.0, env_id: Optional[str] = None) -> List[Any]:
        """Wait duration seconds."""
        return await member(ctx, env_id, "wait", duration=duration)
