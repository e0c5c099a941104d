"""The `openai` tool style: OpenAI's `computer` tool, one tool taking the batch of actions a
computer_call carries ({"type": "click", "button": "left", "x": .., "y": ..}, drag, keypress,
move, scroll, type, wait, screenshot, double_click), run in order; the screen after them comes
back with the result."""

from typing import Any

import verifiers.v1 as vf

from drums_verifiers.compat import CallToolResult
from drums_verifiers.tools.base import text_result
from drums_verifiers.tools.dialect_base import DialectTools


class OpenAITools(DialectTools):
    dialect = "openai"
    TOOL_PREFIX = None  # the tools are named as the vendor names them

    @vf.tool
    async def computer(
        self, actions: list[dict[str, Any]] | None = None, action: dict[str, Any] | None = None
    ) -> CallToolResult:
        """Run computer actions in order: a list `actions` (or one `action`), each an object
        with a `type` (click, double_click, drag, keypress, move, screenshot, scroll, type,
        wait) and its fields, in screenshot pixels."""
        calls = actions if actions is not None else ([action] if action is not None else [])
        if not calls:
            return text_result("error: give `actions`, a list of computer actions", error=True)
        return await self.act_calls(calls)


if __name__ == "__main__":
    OpenAITools.run()
