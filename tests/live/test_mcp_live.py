"""`drums mcp` driven by the official MCP Python client against a real daemon, over both
transports: the tools are listed; a desktop is created on a shared OSWorld task, acted on (shell
and pointer), looked at, forked, saved, verified (the scripted solve scores 1) and closed; bad
input comes back as an MCP error result saying what was wrong; and the desktops a session made are
gone once its client disconnects (stdio: the server process ends; HTTP: the session is deleted
while the server keeps running). DRUMS_LIVE=1.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import drums
import pytest
from drumsd_process import free_port
from harness import poll
from live_daemon import start_live_daemon, stop_and_clean

mcp = pytest.importorskip("mcp", reason="drums mcp needs the mcp extra (in the dev group)")
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

OSWORLD = Path("/work/shared/osworld")
RENAME = OSWORLD / "os" / "e0df059f-28a6-4169-924f-b9623e7184cc.json"
SOLVE = "mv /home/user/Desktop/todo_list_Jan_1 /home/user/Desktop/todo_list_Jan_2"
TOOLS = {
    "desktop_create", "desktop_attach", "desktop_list", "desktop_close", "click",
    "double_click", "right_click", "move", "drag", "scroll", "type", "key", "hotkey", "wait",
    "execute", "screenshot", "terminal", "fork", "save", "verify",
}  # fmt: skip


def text_of(result: object) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def call(session: ClientSession, tool: str, **args: object) -> str:
    result = await session.call_tool(tool, args)
    assert not result.is_error, (tool, text_of(result))
    return text_of(result)


async def refused(session: ClientSession, tool: str, **args: object) -> str:
    result = await session.call_tool(tool, args)
    assert result.is_error, (tool, text_of(result))
    return text_of(result)


def children_running(marker: str) -> list[int]:
    """This test process's own children whose command line holds `marker`."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if marker.encode() in cmdline:
                found.append(int(pid))
    return found


def server_argv(*extra: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys, drums._cli; sys.exit(drums._cli.main())",
        "mcp",
        *extra,
    ]


@asynccontextmanager
async def http_session(url: str) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        yield s


def test_drums_mcp_over_stdio_and_http(tmp_path: Path) -> None:
    if not RENAME.is_file():
        pytest.skip(f"no shared OSWorld task at {RENAME} (a fixture for this test only)")
    # A daemon of its own, stopped and cleaned after (the session fixture's stop leaves a spare's
    # mounts behind when run alone).
    root = Path(tempfile.mkdtemp(prefix="drums-mcp-"))
    daemon = start_live_daemon(root)
    env = {"DRUMS_URL": daemon.url, "DRUMS_TOKEN": daemon.token, "PATH": os.environ["PATH"]}
    http = None
    try:
        with drums.connect(daemon.url, token=daemon.token) as watcher:
            before = {s.id for s in watcher.list_envs()}

            def live_envs() -> list[str]:
                """The envs made since this test began (the daemon is shared)."""
                return [s.id for s in watcher.list_envs() if s.id not in before]

            async def over_stdio() -> None:
                params = StdioServerParameters(
                    command=server_argv()[0], args=server_argv()[1:], env=env
                )
                async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                    await s.initialize()
                    listed = {t.name for t in (await s.list_tools()).tools}
                    assert TOOLS <= listed, TOOLS - listed

                    # bad input before any desktop: a clear MCP error result, server still up
                    assert "no desktop yet: call desktop_create" in await refused(
                        s, "click", x=1, y=2
                    )
                    missing = await refused(s, "click", y=2)
                    assert "x\n  Field required" in missing, missing

                    made = await call(s, "desktop_create", task=str(RENAME))
                    env_id = made.split()[1]
                    assert "instruction:" in made, made
                    assert live_envs() == [env_id]

                    shot = (await s.call_tool("screenshot", {})).content[0]
                    assert shot.type == "image" and shot.mime_type == "image/png", shot
                    assert base64.b64decode(shot.data)[:8] == b"\x89PNG\r\n\x1a\n"

                    outside = await refused(s, "click", x=5000, y=10)
                    assert "outside the screenshot" in outside and "0 <= x < 1920" in outside
                    assert "scroll amount" in await refused(s, "scroll", x=10, y=10, amount=0)
                    unknown = await refused(s, "click", x=1, y=1, env_id="slot-nope")
                    assert "not in this session" in unknown and env_id in unknown
                    moved = (await call(s, "move", x=100, y=100)).splitlines()
                    assert moved[0] == f"move at (100, 100) on {env_id} (action 1)", moved
                    assert moved[1] == "episode: valid" or moved[1].startswith(
                        "episode: pending (gates: "
                    ), moved

                    ran = await call(s, "execute", command=SOLVE + " && echo renamed")
                    assert "returncode 0" in ran and "renamed" in ran, ran

                    # The xterm's text: typed into it, read back, and the read is no action.
                    await call(s, "click", x=480, y=300)  # into the xterm
                    await call(s, "type", text="echo drums-$((6*7))\n")
                    acted = (await call(s, "wait", seconds=0)).splitlines()[0]

                    async def echoed() -> str:
                        text = await call(s, "terminal")
                        return text if "drums-42" in text.split("echo", 1)[-1] else ""

                    deadline = time.monotonic() + 20
                    while not (text := await echoed()):
                        assert time.monotonic() < deadline, await call(s, "terminal")
                        await anyio.sleep(0.3)
                    assert "echo drums-$((6*7))" in text, text
                    again = (await call(s, "wait", seconds=0)).splitlines()[0]
                    count = lambda line: int(line.rsplit("(action ", 1)[1].rstrip(")"))  # noqa: E731
                    assert count(again) == count(acted) + 1, (acted, again)

                    forked = await call(s, "fork", n=1)
                    child = forked.rsplit(": ", 1)[1].strip()
                    assert sorted(live_envs()) == sorted([env_id, child]), forked
                    child_ls = await call(
                        s, "execute", command="ls /home/user/Desktop", env_id=child
                    )
                    assert "todo_list_Jan_2" in child_ls, child_ls  # the fork has the rename
                    assert "destroyed" in await call(s, "desktop_close", env_id=child)
                    assert live_envs() == [env_id]

                    assert (await call(s, "save")).startswith("saved state ")

                    verdict = json.loads(await call(s, "verify"))
                    assert verdict["score"] == 1.0 and verdict["valid"], verdict
                    assert live_envs() == [env_id]
                # the client closed stdin: the server ends its session and destroys the env

            anyio.run(over_stdio)
            poll("the stdio session's env destroyed", lambda: live_envs() == [])

            async def stdio_sigterm() -> None:
                params = StdioServerParameters(
                    command=server_argv()[0], args=server_argv()[1:], env=env
                )
                stack = AsyncExitStack()
                read, write = await stack.enter_async_context(stdio_client(params))
                s = await stack.enter_async_context(ClientSession(read, write))
                await s.initialize()
                await call(s, "desktop_create", image="base")
                assert len(live_envs()) == 1
                (child,) = children_running("drums._cli")
                os.kill(child, signal.SIGTERM)  # the client still holds its stdin open
                await anyio.to_thread.run_sync(
                    lambda: poll("the SIGTERM'd server's env destroyed", lambda: live_envs() == [])
                )
                with anyio.move_on_after(10), contextlib.suppress(Exception):
                    await stack.aclose()

            anyio.run(stdio_sigterm)

            port = free_port()
            http = subprocess.Popen(
                server_argv("--transport", "http", "--listen", f"127.0.0.1:{port}"),
                env=env,
                stderr=(tmp_path / "http.log").open("w"),
            )
            url = f"http://127.0.0.1:{port}/mcp"

            async def over_http() -> None:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        async with http_session(url) as probe:
                            await probe.list_tools()
                        break
                    except Exception:
                        assert http.poll() is None, (tmp_path / "http.log").read_text()
                        assert time.monotonic() < deadline, (
                            "drums mcp --transport http never answered"
                        )
                        await anyio.sleep(0.3)
                async with http_session(url) as s:
                    listed = {t.name for t in (await s.list_tools()).tools}
                    assert TOOLS <= listed
                    made = await call(s, "desktop_create", image="base")
                    env_id = made.split()[1]
                    assert "typed 5 characters" in await call(s, "type", text="hello")
                    shot = (await s.call_tool("screenshot", {"env_id": env_id})).content[0]
                    assert shot.type == "image"
                    assert "no keys given" in await refused(s, "hotkey", keys=[])
                    assert live_envs() == [env_id]

            anyio.run(over_http)
            # the client deleted its session; the server is still running
            poll("the HTTP session's env destroyed", lambda: live_envs() == [])
            assert http.poll() is None, (tmp_path / "http.log").read_text()

            async def sigterm_mid_session() -> None:
                stack = AsyncExitStack()
                s = await stack.enter_async_context(http_session(url))
                await call(s, "desktop_create", image="base")
                assert len(live_envs()) == 1
                http.send_signal(signal.SIGTERM)  # the client is still connected
                await anyio.to_thread.run_sync(lambda: http.wait(timeout=40))
                # the client's own exit now talks to a server that is gone: not what is tested
                with anyio.move_on_after(10), contextlib.suppress(Exception):
                    await stack.aclose()

            anyio.run(sigterm_mid_session)
            # uvicorn re-raises the SIGTERM once its shutdown (our sessions' cleanup) is done
            assert http.returncode in (0, -signal.SIGTERM), (tmp_path / "http.log").read_text()
            assert live_envs() == [], "SIGTERM'd server left its session's env"
    finally:
        if http is not None and http.poll() is None:
            http.terminate()
            http.wait(timeout=20)
        stop_and_clean(daemon, root / "state", root)
