"""`drums mcp`: drums desktops as an MCP server, for any MCP client (stdio or streamable HTTP).

    drums mcp                                  # stdio: the client starts it as a subprocess
    drums mcp --transport http --listen 127.0.0.1:7090   # streamable HTTP at /mcp

It talks to drumsd at DRUMS_URL with DRUMS_TOKEN / DRUMS_TOKEN_FILE (or --url, --token-file).
Needs the `mcp` extra: pip install 'drums-sdk[mcp]'.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, Optional, Sequence, Tuple

from .._async_client import AsyncClient

try:
    from ._server import build_server
except ImportError as exc:  # pragma: no cover - only without the extra
    if "mcp" not in str(exc):
        raise
    _MISSING: Optional[ImportError] = exc
else:
    _MISSING = None

__all__ = ["build_server", "main"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="drums mcp", description="drums desktops as MCP tools (stdio or streamable HTTP)"
    )
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--listen", default="127.0.0.1:7090", help="HOST:PORT for --transport http")
    p.add_argument("--url", default=None, help="drumsd's URL (default: DRUMS_URL)")
    p.add_argument("--token-file", default=None, help="default: DRUMS_TOKEN / DRUMS_TOKEN_FILE")
    p.add_argument(
        "--gates-timeout", type=float, default=120.0, help="how long desktop_create waits"
    )
    p.add_argument(
        "--vendor-tools",
        choices=("anthropic", "openai"),
        default=None,
        help="offer that vendor's computer tools under its own names (docs/dialects.md)",
    )
    p.add_argument(
        "--screen",
        type=_size,
        default=None,
        help="the model's screen WIDTHxHEIGHT for --vendor-tools (default: the desktop's)",
    )
    return p


def _size(text: str) -> Tuple[int, int]:
    width, _, height = text.lower().partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 1280x800")
    return int(width), int(height)


async def _serve(args: argparse.Namespace) -> None:
    import anyio

    from ._server import Sessions

    def connect() -> AsyncClient:
        return AsyncClient(args.url, token_file=args.token_file)

    sessions = Sessions(connect, args.gates_timeout)
    server = build_server(
        connect,
        sessions=sessions,
        vendor_tools=args.vendor_tools,
        model_screen=args.screen,
        log_level="WARNING",
    )
    if args.transport == "http":
        # uvicorn handles SIGTERM/SIGINT itself and runs the app's shutdown (sessions end).
        host, _, port = args.listen.rpartition(":")
        await _serve_http(server, host or "127.0.0.1", int(port))
        return

    async def stop_on_signal() -> None:
        # stdin is read in a worker thread no cancellation can interrupt, so on SIGTERM/SIGINT
        # the sessions are closed here (their desktops destroyed) and the process leaves.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                with anyio.CancelScope(shield=True):
                    await sessions.aclose()
                sys.stderr.flush()
                os._exit(128 + signum)

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_on_signal)
        await server.run_stdio_async()  # until the client closes stdin
        tg.cancel_scope.cancel()


async def _serve_http(server: Any, host: str, port: int) -> None:
    import uvicorn

    # An open client stream must not hold a SIGTERM'd server forever: 5 s, then the app's
    # shutdown runs and every session's desktops are destroyed.
    config = uvicorn.Config(
        server.streamable_http_app(host=host),
        host=host,
        port=port,
        timeout_graceful_shutdown=5,
        log_level="warning",
    )
    await uvicorn.Server(config).serve()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    if _MISSING is not None:
        print(
            f"drums mcp needs the mcp extra (pip install 'drums-sdk[mcp]'): {_MISSING}",
            file=sys.stderr,
        )
        return 2
    import anyio

    anyio.run(_serve, args)
    return 0
