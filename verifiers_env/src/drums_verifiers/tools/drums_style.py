"""The `drums` tool style: one tool per action, pixel coordinates, a screenshot after each."""

import verifiers.v1 as vf

from drums_verifiers import actions
from drums_verifiers.compat import CallToolResult, tool_result
from drums_verifiers.tools.base import DesktopTools


class DrumsTools(DesktopTools):
    @vf.tool
    async def click(self, x: float, y: float) -> CallToolResult:
        """Left-click at (x, y) in screenshot pixels."""
        return await self.act(lambda: actions.click(self.screen(), x, y))

    @vf.tool
    async def double_click(self, x: float, y: float) -> CallToolResult:
        """Double-click at (x, y)."""
        return await self.act(lambda: actions.click(self.screen(), x, y, "double_click"))

    @vf.tool
    async def right_click(self, x: float, y: float) -> CallToolResult:
        """Right-click at (x, y)."""
        return await self.act(lambda: actions.click(self.screen(), x, y, "right_click"))

    @vf.tool
    async def move(self, x: float, y: float) -> CallToolResult:
        """Move the mouse to (x, y) without clicking."""
        return await self.act(lambda: actions.click(self.screen(), x, y, "move"))

    @vf.tool
    async def drag(self, x: float, y: float, to_x: float, to_y: float) -> CallToolResult:
        """Press at (x, y), drag to (to_x, to_y), release."""
        return await self.act(lambda: actions.drag(self.screen(), x, y, to_x, to_y))

    @vf.tool
    async def scroll(self, x: float, y: float, amount: int) -> CallToolResult:
        """Scroll at (x, y): positive amounts scroll up, negative down."""
        return await self.act(lambda: actions.scroll(self.screen(), x, y, amount))

    @vf.tool(name="type")
    async def type_text(self, text: str) -> CallToolResult:
        """Type text at the keyboard focus."""
        return await self.act(lambda: actions.type_text(text))

    @vf.tool
    async def key(self, key: str) -> CallToolResult:
        """Press one key (enter, tab, esc, a, f5 ...); 'ctrl+s' presses a combination."""
        return await self.act(lambda: actions.key(key))

    @vf.tool
    async def hotkey(self, keys: list[str]) -> CallToolResult:
        """Press keys together, e.g. ["ctrl", "shift", "t"]."""
        return await self.act(lambda: actions.hotkey(keys))

    @vf.tool
    async def wait(self, seconds: float = 1.0) -> CallToolResult:
        """Wait, then look at the screen again."""
        return await self.act(lambda: actions.wait(seconds))

    @vf.tool
    async def screenshot(self) -> CallToolResult:
        """Look at the screen without acting."""
        env = await self._env()
        return tool_result([await self.screenshot_content(env)])

    @vf.tool
    async def done(self) -> CallToolResult:
        """Declare the task complete; ends the episode."""
        return await self.act(lambda: {"type": "done"}, screenshot=False)

    @vf.tool
    async def fail(self) -> CallToolResult:
        """Declare the task impossible; ends the episode."""
        return await self.act(lambda: {"type": "fail"}, screenshot=False)


if __name__ == "__main__":
    DrumsTools.run()
