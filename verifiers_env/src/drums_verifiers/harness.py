"""The drums-verifiers chat harness: verifiers' MCP chat loop with a visual-context window.

Request interceptors in verifiers 0.4 may rewrite only the newest messages, so the window has
to live in the program that builds each request; this harness runs that program (through `uv`,
like the built-in `null` harness) and passes it K from the harness config or the task.
"""

from __future__ import annotations

import inspect

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.harnesses.utils import mcp as vf_mcp
from verifiers.v1.harnesses.utils.launch import launch_chat_program

from drums_verifiers import chat_program, profile, visual_window

HEADER = (
    '# /// script\n# requires-python = ">=3.10"\n'
    '# dependencies = ["openai", "mcp==2.0.0", "httpx", "httpx2", "tenacity"]\n'
    "# ///\n"
)


def program_source() -> str:
    """The standalone script: verifiers' MCP client helpers, the window, then the loop."""
    parts = [inspect.getsource(m) for m in (vf_mcp, profile, visual_window, chat_program)]
    return HEADER + "\n".join(parts)


PROGRAM = program_source()


class DrumsHarnessConfig(vf.HarnessConfig):
    visual_window: int | None = Field(None, ge=1)
    """Screenshots kept as images; unset takes the taskset's `visual_window`."""
    max_steps: int = Field(200, ge=1)


class DrumsChatHarness(vf.Harness[DrumsHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def setup(self, runtime: vf.Runtime) -> None:
        await runtime.prepare_uv_script(PROGRAM, self.config.resolved_env)

    def window(self, data: vf.TaskData) -> int:
        return self.config.visual_window or int(getattr(data, "visual_window", 3) or 3)

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> vf.ProgramResult:
        system_prompt, prompt = self.resolve_prompt(data)
        return await launch_chat_program(
            PROGRAM,
            self.config,
            ctx,
            trace,
            runtime,
            endpoint,
            secret,
            mcp_urls,
            system_prompt,
            prompt,
            extra_args=[
                f"--visual-window={self.window(data)}",
                f"--max-steps={self.config.max_steps}",
            ],
        )
