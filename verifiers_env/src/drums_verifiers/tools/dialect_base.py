"""What the vendor-native tool styles share: the model's calls, shaped as its vendor's computer
tool, go to the daemon as they are (`env.step(calls, dialect=...)`); drums.dialects translates
them there, the same translator the step API and `drums mcp` use. The model's screen is the
desktop times `screenshot_scale`: its coordinates are scaled from it, screenshots come at it.
"""

import time
from typing import Any

from drums_verifiers import desktop
from drums_verifiers.compat import CallToolResult, image_content, text_content, tool_result
from drums_verifiers.profile import profile_mark
from drums_verifiers.tools.base import RECOVERABLE_CODES, DesktopTools, text_result


class DialectTools(DesktopTools):
    dialect = ""

    def model_screen(self) -> tuple[int, int]:
        width, height = self.state.screen
        scale = self.config.screenshot_scale
        return max(16, round(width * scale)), max(16, round(height * scale))

    async def act_calls(self, calls: list[dict[str, Any]]) -> CallToolResult:
        """Run the vendor's calls in order in one step; a line per call (cursor positions), the
        images zoom and screenshot calls made, and the screen after."""
        state = self.state
        if state.env_failed:
            return text_result(
                f"the desktop is gone ({state.env_failed}); the episode is over", error=True
            )
        if state.terminal:
            return text_result(f"the episode already ended with {state.terminal}", error=True)
        started = time.monotonic()
        try:
            env = await self._env()
            result = await desktop.resolve(
                env.step(
                    calls, dialect=self.dialect, screen=self.model_screen(), screenshot=self.shot()
                )
            )
            profile_mark("tool", "stepped", action=self.dialect)
        except Exception as exc:
            if desktop.is_drums_error(exc) and desktop.error_code(exc) in RECOVERABLE_CODES:
                return text_result(f"error: {exc}", error=True)
            return self.failed(exc, self.dialect)
        lines, images = [], []
        for call in result.results or []:
            state.actions[call.name] = state.actions.get(call.name, 0) + 1
            line = call.name
            if call.cursor is not None:
                line += f": the cursor is at ({call.cursor['x']}, {call.cursor['y']})"
            lines.append(line)
            if call.image_b64:
                images.append(image_content(call.image_b64, call.image_content_type or ""))
        state.cursor = None  # the vendor's calls move it; cursor_position says where
        content: list[Any] = [text_content("\n".join(lines)), *images]
        shot = desktop.screenshot_b64(result)
        if shot is not None:
            content.append(image_content(shot[0], shot[1]))
        state.tool_s.append(time.monotonic() - started)
        return tool_result(content)
