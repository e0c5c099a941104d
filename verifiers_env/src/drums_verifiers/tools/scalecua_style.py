"""The `scalecua` tool style: a single `computer` tool with ScaleCUA's action vocabulary.

Written from ScaleCUA's public description of its agent's unified action space (pyautogui-like
calls: click, doubleClick, rightClick, moveTo, dragTo, scroll, write, press, hotkey, wait,
terminate, response); the mapping to drumsd actions is in actions.scalecua_action.
"""

import verifiers.v1 as vf

from drums_verifiers import actions
from drums_verifiers.compat import CallToolResult
from drums_verifiers.tools.base import DesktopTools


class ScaleCUATools(DesktopTools):
    TOOL_PREFIX = None  # the tool is called plain `computer`

    @vf.tool
    async def computer(
        self,
        action: str,
        x: float | None = None,
        y: float | None = None,
        clicks: int | None = None,
        button: str | None = None,
        message: str | None = None,
        keys: list[str] | str | None = None,
        seconds: float | None = None,
        status: str | None = None,
        answer: str | None = None,
    ) -> CallToolResult:
        """Act on the desktop. action is one of: click(x, y, clicks=1, button='left'),
        doubleClick(x, y), rightClick(x, y), moveTo(x, y), dragTo(x, y) (from the cursor),
        scroll(clicks, x, y) (positive up), write(message), press(keys), hotkey(keys),
        wait(seconds), terminate(status='success'|'failure'), response(answer).
        Coordinates are pixels of the latest screenshot."""
        args = {
            k: v
            for k, v in dict(
                action=action,
                x=x,
                y=y,
                clicks=clicks,
                button=button,
                message=message,
                keys=keys,
                seconds=seconds,
                status=status,
                answer=answer,
            ).items()
            if v is not None
        }
        final = action in ("terminate", "response")
        return await self.act(
            lambda: actions.scalecua_action(self.screen(), self.cursor(), args),
            screenshot=not final,
        )


if __name__ == "__main__":
    ScaleCUATools.run()
