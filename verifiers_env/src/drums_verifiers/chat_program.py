"""The chat loop of the drums-verifiers harness, bundled into a standalone PEP 723 script.

It is verifiers' tool-calling chat loop reduced to what a desktop agent needs, plus the
visual-context window applied to every model request. The harness bundles this file after
verifiers' MCP helpers and visual_window.py, so names from those are globals at run time.
"""

import argparse
import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # bundled ahead of this module in the generated script
    from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp

    from drums_verifiers.profile import profile_mark
    from drums_verifiers.visual_window import apply_visual_window

MODEL_TRANSPORT_ERROR_EXIT_CODE = 97  # verifiers' code for "the model connection failed"


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
    import httpx
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
        base_url=args.base_url, api_key=args.api_key, timeout=httpx.Timeout(None, connect=5.0)
    )
    config = json.loads(args.mcp_config or "{}")
    async with AsyncExitStack() as stack:
        tools, dispatch, servers = ([], {}, {})
        if config.get("mcpServers"):
            tools, dispatch, servers = await asyncio.wait_for(
                connect_mcp(config, stack, set()), timeout=60
            )
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
