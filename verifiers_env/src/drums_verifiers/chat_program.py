"""The chat loop of the drums-verifiers harness, bundled into a standalone PEP 723 script.

It is verifiers' tool-calling chat loop reduced to what a desktop agent needs, plus the
visual-context window applied to every model request, and an MCP client of its own (verifiers
0.4 has one to bundle, the commit prime-rl pins does not). The harness bundles this file after
profile.py and visual_window.py, so names from those are globals at run time. It runs under the
packages of harness.HEADER, whatever verifiers the trainer has: mcp 2.0.0's client (it talks to
verifiers' tool servers on mcp 1.x or 2.x) and any openai 2.x or 3.x (3.x takes an httpx2
timeout, so the timeout is built with `openai.Timeout`, the class each version expects).
"""

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # bundled ahead of this module in the generated script
    from drums_verifiers.profile import profile_mark
    from drums_verifiers.visual_window import apply_visual_window

MODEL_TRANSPORT_ERROR_EXIT_CODE = 97  # verifiers' code for "the model connection failed"
MCP_ATTEMPTS = 5
MCP_TIMEOUT_S = 600.0


@asynccontextmanager
async def mcp_client(spec: dict) -> AsyncIterator[Any]:
    """One MCP client on a streamable-HTTP server (`spec["url"]`), in the caller's task."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    timeout = httpx2.Timeout(spec.get("timeout", MCP_TIMEOUT_S), connect=5.0)
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            create_mcp_http_client(headers=spec.get("headers") or None, timeout=timeout)
        )
        transport = streamable_http_client(spec["url"], http_client=http)
        yield await stack.enter_async_context(Client(transport))


class ToolServer:
    """One MCP server of the rollout: a client opened at first use and reopened after a
    transport failure (a failed call is retried on a new client, so a tool may see a call
    twice; a tool's own failure is a result, not an exception, and is never retried)."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.stack: AsyncExitStack | None = None
        self.client: Any = None

    async def run(self, operation: Callable[[Any], Awaitable[Any]]) -> Any:
        for attempt in range(MCP_ATTEMPTS):
            try:
                if self.client is None:
                    self.stack = AsyncExitStack()
                    self.client = await self.stack.enter_async_context(mcp_client(self.spec))
                return await operation(self.client)
            except Exception:
                await self.aclose()
                if attempt + 1 == MCP_ATTEMPTS:
                    raise
                await asyncio.sleep(min(0.5 * 2**attempt, 8.0))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        stack, self.stack, self.client = self.stack, None, None
        if stack is not None:
            with suppress(Exception):  # closing noise must not replace the result
                await stack.aclose()


async def connect_mcp(config: dict, stack: AsyncExitStack) -> tuple[list, dict, dict]:
    """Every configured server's tools as OpenAI function schemas (`<server>_<tool>`), the
    dispatch map (advertised name -> (server, tool)) and the servers."""
    tools: list[dict] = []
    dispatch: dict[str, tuple[str, str]] = {}
    servers: dict[str, ToolServer] = {}
    for name, spec in config.get("mcpServers", {}).items():
        server = servers[name] = ToolServer(spec)
        stack.push_async_callback(server.aclose)
        listed = await server.run(lambda client: client.list_tools())
        for tool in listed.tools:
            full = f"{name}_{tool.name}" if name else tool.name
            if full in dispatch:
                raise ValueError(f"duplicate tool name {full!r} across MCP servers")
            function = {
                "name": full,
                "description": tool.description or "",
                "parameters": tool.input_schema,
            }
            tools.append({"type": "function", "function": function})
            dispatch[full] = (name, tool.name)
    return tools, dispatch, servers


def chat_content(blocks: list) -> str | list[dict]:
    """MCP content blocks as OpenAI chat tool-result content (text, or parts with images)."""
    parts: list[dict] = []
    for block in blocks:
        if block.type == "text":
            parts.append({"type": "text", "text": block.text})
        elif block.type == "image":
            url = f"data:{block.mime_type};base64,{block.data}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": str(block)})
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


async def call_mcp(servers: dict, dispatch: dict, name: str, arguments: dict) -> str | list:
    server, tool = dispatch[name]
    result = await servers[server].run(lambda client: client.call_tool(tool, arguments))
    return chat_content(result.content)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--system-prompt", default="")
    parser.add_argument("--prompt", default="")
    parser.add_argument("--initial-messages-file", default="")
    parser.add_argument("--mcp-config", default="")
    parser.add_argument("--tool-interception-url", default="")
    parser.add_argument("--visual-window", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=200)
    return parser.parse_args()


def read_initial(name: str) -> list:
    """The opening messages (instruction + first screenshot); the file is removed after."""
    path = Path(name)
    messages = json.loads(path.read_bytes())
    path.unlink()
    return messages


async def complete(client: Any, model: str, messages: list, tools: list) -> dict:
    """One streamed completion, returned as the assistant message dict."""
    kwargs: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        kwargs["tools"] = tools
    async with client.chat.completions.stream(**kwargs) as stream:
        completion = await stream.get_final_completion()
    message = completion.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments or "{}"},
            }
            for c in message.tool_calls
        ]
    return out


def image_chars(content: Any) -> int:
    """Characters of image data URLs in a tool result (what the screenshot costs the wire)."""
    if not isinstance(content, list):
        return 0
    return sum(len(p.get("image_url", {}).get("url", "")) for p in content if isinstance(p, dict))


async def main() -> None:
    import openai
    from openai import APIConnectionError, AsyncOpenAI

    args = parse_args()
    messages: list[dict[str, Any]] = []
    if args.system_prompt:
        messages.append({"role": "system", "content": args.system_prompt})
    if args.initial_messages_file:
        messages.extend(read_initial(args.initial_messages_file))
    elif args.prompt:
        messages.append({"role": "user", "content": args.prompt})
    client = AsyncOpenAI(
        base_url=args.base_url, api_key=args.api_key, timeout=openai.Timeout(None, connect=5.0)
    )
    config = json.loads(args.mcp_config or "{}")
    async with AsyncExitStack() as stack:
        tools, dispatch, servers = ([], {}, {})
        if config.get("mcpServers"):
            async with asyncio.timeout(60):  # in this task: the clients' scopes stay nested
                tools, dispatch, servers = await connect_mcp(config, stack)
        for _ in range(args.max_steps):
            request = apply_visual_window(messages, args.visual_window)
            profile_mark("chat", "request_start")
            try:
                reply = await complete(client, args.model, request, tools)
            except APIConnectionError as exc:
                raise SystemExit(MODEL_TRANSPORT_ERROR_EXIT_CODE) from exc
            profile_mark("chat", "reply")
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            if not calls:
                return
            for call in calls:
                name = call["function"]["name"]
                try:
                    arguments = json.loads(call["function"]["arguments"] or "{}")
                    if name not in dispatch:
                        content: Any = f"error: unknown tool {name!r}"
                    else:
                        profile_mark("chat", "mcp_start", tool=name)
                        content = await call_mcp(servers, dispatch, name, arguments)
                        profile_mark("chat", "mcp_end", image_chars=image_chars(content))
                except json.JSONDecodeError as exc:
                    content = f"error: tool arguments are not JSON ({exc})"
                except Exception as exc:
                    content = f"error: {type(exc).__name__}: {exc}"
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "name": name, "content": content}
                )


if __name__ == "__main__":
    asyncio.run(main())
