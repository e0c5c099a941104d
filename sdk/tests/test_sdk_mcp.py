"""drums mcp's tools through MCP's own in-process client, against the SDK's test daemons (the
real drumsd app over the memory runtime, and the fake): the tools listed, a desktop created,
acted on and verified, bad input answered with an MCP error result that says what to fix, and the
desktops destroyed when the server stops. The live proof over stdio and HTTP is
tests/live/test_mcp_live.py."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from sdk_harness import Daemon

pytest.importorskip("mcp", reason="drums mcp needs the mcp extra")
from mcp.client.client import Client

from drums.mcp import build_server
from drums.mcp._session import png_size


def text(result: object) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def _report(env_id: str, status: str) -> dict[str, Any]:
    """A gate report whose second gate has `status` (pass, fail, pending)."""
    gates = [
        {"name": "guest_ready", "status": "pass"},
        {"name": "alive_after_resume", "status": status},
    ]
    valid = {"pass": True, "fail": False, "pending": None}[status]
    failed = ["alive_after_resume"] if status == "fail" else []
    return {"slot": env_id, "episode": 1, "episode_id": "e", "profile": "hardened",
            "gates": gates, "valid": valid, "failed": failed}  # fmt: skip


def test_png_size_reads_the_header() -> None:
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + (1280).to_bytes(4, "big")
    assert png_size(header + (800).to_bytes(4, "big")) == (1280, 800)
    assert png_size(b"GIF89a" + b"\x00" * 30) is None


def test_tools_drive_a_desktop_and_end_with_the_server(daemon: Daemon) -> None:
    async def body() -> None:
        server = build_server(daemon.aclient)
        async with Client(server) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            assert {"desktop_create", "click", "screenshot", "verify", "desktop_close"} <= names

            first = await mcp.call_tool("click", {"x": 1, "y": 1})
            assert first.is_error and "no desktop yet: call desktop_create" in text(first)

            made = await mcp.call_tool("desktop_create", {})
            assert not made.is_error, text(made)
            env_id = text(made).split()[1]
            assert [s.id for s in await daemon.aclient().list_envs()] == [env_id]

            # The in-memory runtime has no xterm: the tool says why there is no text.
            term = await mcp.call_tool("terminal", {})
            assert term.is_error and f"no terminal text on {env_id}: " in text(term), text(term)

            clicked = await mcp.call_tool("click", {"x": 10, "y": 20})
            assert text(clicked).splitlines() == [
                f"click at (10, 20) on {env_id} (action 1)",
                "episode: valid",
            ], text(clicked)
            gates = f"/v1/slots/{env_id}/gates"
            daemon.faults.respond("GET", gates, 200, _report(env_id, "fail"), times=1)
            moved = await mcp.call_tool("move", {"x": 3, "y": 4})  # the move happened: no error
            assert not moved.is_error and text(moved).splitlines()[1] == (
                "episode: invalid (failed gates: alive_after_resume); its score must not be "
                "trained on"
            ), text(moved)
            daemon.faults.respond("GET", gates, 200, _report(env_id, "pending"), times=1)
            moved = await mcp.call_tool("move", {"x": 3, "y": 4})
            assert text(moved).splitlines()[1] == "episode: pending (gates: alive_after_resume)"
            daemon.faults.respond("GET", gates, 503, {"error": {"code": "unavailable"}}, times=9)
            moved = await mcp.call_tool("move", {"x": 3, "y": 4})
            assert not moved.is_error and "episode: unknown (gates: " in text(moved), text(moved)
            daemon.faults.faults.clear()
            shot = (await mcp.call_tool("screenshot", {})).content[0]
            assert shot.type == "image" and shot.mime_type == "image/png"

            bad = await mcp.call_tool("click", {"x": -5, "y": 1})
            assert bad.is_error and "outside the screenshot" in text(bad)
            bad = await mcp.call_tool("click", {"x": "left", "y": 1})
            assert bad.is_error and "valid integer" in text(bad)
            bad = await mcp.call_tool("wait", {"seconds": 600})
            assert bad.is_error and "wait between 0 and 60 seconds" in text(bad)
            bad = await mcp.call_tool("desktop_create", {"state": "ckpt-x", "image": "base"})
            assert bad.is_error and "give a state alone" in text(bad)
            bad = await mcp.call_tool("desktop_attach", {"env_id": "slot-none"})
            assert bad.is_error and "drums: [not_found]" in text(bad), text(bad)

            listed = await mcp.call_tool("desktop_list", {})
            assert text(listed) == f"{env_id} (current)"
        # the server stopped: what its sessions made is gone
        async with daemon.aclient() as watcher:
            assert await watcher.list_envs() == []

    anyio.run(body)


def test_close_destroys_and_the_next_env_becomes_current(daemon: Daemon) -> None:
    async def body() -> None:
        async with Client(build_server(daemon.aclient)) as mcp:
            a = text(await mcp.call_tool("desktop_create", {})).split()[1]
            b = text(await mcp.call_tool("desktop_create", {})).split()[1]
            closed = await mcp.call_tool("desktop_close", {})
            assert text(closed) == f"env {b} destroyed"
            assert text(await mcp.call_tool("desktop_list", {})) == f"{a} (current)"
            async with daemon.aclient() as watcher:
                assert [s.id for s in await watcher.list_envs()] == [a]

    anyio.run(body)


def test_a_saved_state_outlives_the_session_unless_keep_false(daemon: Daemon) -> None:
    """save follows the documented saved-state lifetime (issue 38, as the SDK's env.save()): by
    default it is left to its lease on the daemon when the session ends; keep=false deletes it."""

    async def body() -> None:
        async with Client(build_server(daemon.aclient)) as mcp:
            assert not (await mcp.call_tool("desktop_create", {})).is_error
            leased = text(await mcp.call_tool("save", {}))
            tied = text(await mcp.call_tool("save", {"keep": False}))
        assert leased.startswith("saved state ") and leased.count(" ") == 2, leased
        assert tied.endswith(" (deleted when this session ends)"), tied
        envs, states = daemon.leftovers()
        assert envs == [] and states == [leased.split()[2]], states
        async with daemon.aclient() as c:
            await c.delete_state(leased.split()[2])

    anyio.run(body)
