"""The one place where the verifiers lines drums-verifiers supports differ.

Supported: PyPI's verifiers 0.4.x (mcp 2.x) and the git commit prime-rl pins in its
`deps/verifiers` submodule (a60a606ec at prime-rl 559b44772: 0.3.1.dev62 from a checkout, 0.0.0
from an archive or prime-rl's Docker image; mcp 1.x). Their v1 Task / Taskset / Toolset / Env API
is the same for what this package uses; what differs:

- the MCP result types: the `mcp_types` package with snake_case fields under mcp 2, camelCase
  fields in `mcp.types` under mcp 1. `mcp.types` exists in both (mcp 2 re-exports `mcp_types`
  there, whose models also take the camelCase names), so results are built here with those.
- verifiers' chat-program helpers (`verifiers.v1.harnesses.utils`: `launch_chat_program` and the
  MCP client the program bundles) exist only in 0.4. The harness uses `launch_program` below,
  built on the runtime calls both lines have, and its program has its own MCP client.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from mcp.types import CallToolResult, ImageContent, TextContent

SUPPORTED = "verifiers 0.4.x, or the commit prime-rl pins (0.3.1.dev62)"


def verifiers_version() -> str:
    try:
        return metadata.version("verifiers")
    except metadata.PackageNotFoundError:
        return "not installed"


def require_v1() -> None:
    """A clear error when the installed verifiers has no v1 API (0.1 to 0.3.x on PyPI)."""
    try:
        import verifiers.v1  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"drums-verifiers needs the verifiers v1 API ({SUPPORTED}); the installed verifiers "
            f"is {verifiers_version()} ({exc})"
        ) from None


def text_content(text: str) -> TextContent:
    return TextContent(type="text", text=text)


def image_content(data: str, mime_type: str) -> ImageContent:
    """An MCP image block (base64 `data`)."""
    return ImageContent(type="image", data=data, mimeType=mime_type)


def tool_result(content: Sequence[Any], error: bool = False) -> CallToolResult:
    return CallToolResult(content=list(content), isError=error)


async def launch_program(
    source: str,
    config: Any,
    ctx: Any,
    trace: Any,
    runtime: Any,
    endpoint: str,
    secret: str,
    mcp_urls: dict[str, str],
    system_prompt: str | None,
    prompt: Any,
    extra_args: Sequence[str] = (),
) -> Any:
    """Run a PEP 723 chat program with verifiers' wire arguments (what 0.4's
    `launch_chat_program` passes): the interception endpoint and secret, the model, the MCP
    servers as an `mcpServers` URL config, and the prompt (messages through a file: base64
    screenshots exceed argv limits)."""
    from verifiers.v1.dialects.chat import message_to_wire

    args = [f"--base-url={endpoint}", f"--api-key={secret}", f"--model={ctx.model}", *extra_args]
    if system_prompt:
        args.append(f"--system-prompt={system_prompt}")
    if mcp_urls:
        servers = {
            name: {"url": url, "timeout": config.tool_timeout} for name, url in mcp_urls.items()
        }
        args.append("--mcp-config=" + json.dumps({"mcpServers": servers}))
    if isinstance(prompt, str):
        args.append(f"--prompt={prompt}")
    elif prompt is not None:
        path = f".vf-initial-messages-{trace.id}.json"
        await runtime.write(path, json.dumps([message_to_wire(m) for m in prompt]).encode())
        args.append(f"--initial-messages-file={path}")
    program = await runtime.prepare_uv_script(source, config.resolved_env)
    return await runtime.run_program([*program, *args], {**config.resolved_env})
