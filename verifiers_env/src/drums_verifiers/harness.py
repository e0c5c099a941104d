"""The drums-verifiers chat harness: verifiers' MCP chat loop with a visual-context window.

Request interceptors in verifiers 0.4 may rewrite only the newest messages, so the window has
to live in the program that builds each request; this harness runs that program (through `uv`,
like the built-in `null` harness) and passes it K from the harness config or the task. A program
that fails says why on vf-eval's console (its last error line), not only `HarnessError`.
"""

from __future__ import annotations

import inspect
import logging

import verifiers.v1 as vf
from pydantic import Field

from drums_verifiers import chat_program, compat, profile, visual_window

console = logging.getLogger("verifiers.v1.drums")
# openai: every 2.x and 3.x the supported verifiers lines allow (the program adapts its timeout).
HEADER = (
    '# /// script\n# requires-python = ">=3.11"\n'
    '# dependencies = ["openai>=2.9,<4", "mcp==2.0.0", "httpx2"]\n'
    "# ///\n"
)


def program_source() -> str:
    """The standalone script: profile marks, the window, then the loop (with its MCP client)."""
    return HEADER + "\n".join(inspect.getsource(m) for m in (profile, visual_window, chat_program))


def failure_cause(output: str) -> str:
    """The line that says why a program failed: a traceback's last line, else the last line."""
    # what Python prints for an exception in a finalizer comes after the real error
    output = output.split("\nException ignored in")[0]
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return "no output"
    errors = [line for line in lines if not line.startswith(("File ", "^", "~", "Traceback"))]
    return (errors or lines)[-1][-500:]


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
        result = await compat.launch_program(
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
        if result.exit_code and trace.stop_condition is None:
            console.error(
                "drums: rollout %s (task %s) harness drums-verifiers exited %d: %s",
                trace.id,
                getattr(data, "name", None),
                result.exit_code,
                failure_cause(result.stderr or result.stdout or ""),
            )
        return result
