"""The `anthropic` tool style: Anthropic's computer toolset (computer_toolset_20260801), one tool
per member, named and shaped as the vendor's SDK types spell them, so a policy served with its
native tool schema gets its native calls run. The screen after each call comes back with it."""

from typing import Any

import verifiers.v1 as vf

from drums_verifiers.compat import CallToolResult
from drums_verifiers.tools.dialect_base import DialectTools

Point = list[int] | None


class AnthropicTools(DialectTools):
    dialect = "anthropic-2026-08"
    TOOL_PREFIX = None  # the tools are named as the vendor names them

    async def member(self, name: str, **fields: Any) -> CallToolResult:
        given = {k: v for k, v in fields.items() if v is not None}
        return await self.act_calls([{"name": name, "input": given}])

    @vf.tool
    async def screenshot(self) -> CallToolResult:
        """Take a screenshot of the screen."""
        return await self.member("screenshot")

    @vf.tool
    async def zoom(self, region: list[int]) -> CallToolResult:
        """A screenshot of the region [x0, y0, x1, y1] at full resolution."""
        return await self.member("zoom", region=region)

    @vf.tool
    async def left_click(self, coordinate: Point = None, text: str | None = None) -> CallToolResult:
        """Left click at [x, y] (or where the cursor is); text: modifier keys to hold."""
        return await self.member("left_click", coordinate=coordinate, text=text)

    @vf.tool
    async def right_click(
        self, coordinate: Point = None, text: str | None = None
    ) -> CallToolResult:
        """Right click at [x, y]."""
        return await self.member("right_click", coordinate=coordinate, text=text)

    @vf.tool
    async def middle_click(
        self, coordinate: Point = None, text: str | None = None
    ) -> CallToolResult:
        """Middle click at [x, y]."""
        return await self.member("middle_click", coordinate=coordinate, text=text)

    @vf.tool
    async def double_click(
        self, coordinate: Point = None, text: str | None = None
    ) -> CallToolResult:
        """Double click at [x, y]."""
        return await self.member("double_click", coordinate=coordinate, text=text)

    @vf.tool
    async def triple_click(
        self, coordinate: Point = None, text: str | None = None
    ) -> CallToolResult:
        """Triple click at [x, y]."""
        return await self.member("triple_click", coordinate=coordinate, text=text)

    @vf.tool
    async def left_click_drag(
        self, coordinate: list[int], start_coordinate: Point = None, text: str | None = None
    ) -> CallToolResult:
        """Press at start_coordinate (or the cursor), drag to coordinate, release."""
        return await self.member(
            "left_click_drag", coordinate=coordinate, start_coordinate=start_coordinate, text=text
        )

    @vf.tool
    async def mouse_move(self, coordinate: list[int], text: str | None = None) -> CallToolResult:
        """Move the cursor to [x, y]."""
        return await self.member("mouse_move", coordinate=coordinate, text=text)

    @vf.tool
    async def left_mouse_down(self) -> CallToolResult:
        """Press and hold the left button where the cursor is."""
        return await self.member("left_mouse_down")

    @vf.tool
    async def left_mouse_up(self) -> CallToolResult:
        """Release the left button where the cursor is."""
        return await self.member("left_mouse_up")

    @vf.tool
    async def cursor_position(self) -> CallToolResult:
        """Where the cursor is, (x, y)."""
        return await self.member("cursor_position")

    @vf.tool
    async def scroll(
        self,
        scroll_direction: str,
        scroll_amount: int,
        coordinate: Point = None,
        text: str | None = None,
    ) -> CallToolResult:
        """Scroll up, down, left or right by scroll_amount wheel clicks at [x, y]."""
        return await self.member(
            "scroll",
            scroll_direction=scroll_direction,
            scroll_amount=scroll_amount,
            coordinate=coordinate,
            text=text,
        )

    @vf.tool(name="type")
    async def type_text(self, text: str) -> CallToolResult:
        """Type a string of text."""
        return await self.member("type", text=text)

    @vf.tool
    async def key(self, text: str, repeat: int | None = None) -> CallToolResult:
        """Press a key or combination ("Return", "ctrl+s"), repeat times."""
        return await self.member("key", text=text, repeat=repeat)

    @vf.tool
    async def hold_key(self, text: str, duration: float) -> CallToolResult:
        """Hold a key or combination down for duration seconds."""
        return await self.member("hold_key", text=text, duration=duration)

    @vf.tool
    async def wait(self, duration: float = 1.0) -> CallToolResult:
        """Wait duration seconds, then look."""
        return await self.member("wait", duration=duration)


if __name__ == "__main__":
    AnthropicTools.run()
