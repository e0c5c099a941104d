"""A multi-turn transcript of each vendor's computer-tool calls (fixtures/transcripts/, in the
shapes the vendors' SDK types parse) replayed against a real task, examples/tasks/files.json, to a
score of 1: through the step API (SDK env.step with the dialect) and through `drums mcp` driven by
the official MCP client (its `computer` tool). DRUMS_LIVE=1.

CI runs the API path for both vendors and the two MCP paths for one vendor a day (alternating, by
DRUMS_DIALECT_ROTATION, default the day number); DRUMS_DIALECTS_ALL=1 runs every vendor on every
path.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
import drums
import pytest
from anthropic.types.beta.beta_computer_member_name import BETA_COMPUTER_MEMBER_NAME_VALUES
from anthropic.types.beta.beta_computer_tool_use_block import BetaComputerToolUseBlock
from live_daemon import Daemon
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from openai.types.responses import ResponseComputerToolCall
from pydantic import TypeAdapter

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = Path(__file__).parent / "fixtures" / "transcripts"
VENDORS = ("anthropic", "openai")
ROTATION = int(os.environ.get("DRUMS_DIALECT_ROTATION", str(int(time.time() // 86400))))


def mcp_sample(vendor: str) -> None:
    """The MCP paths for today's vendor only, unless DRUMS_DIALECTS_ALL=1."""
    if os.environ.get("DRUMS_DIALECTS_ALL") != "1" and vendor != VENDORS[ROTATION % len(VENDORS)]:
        pytest.skip(f"not CI's vendor today for the MCP paths: DRUMS_DIALECTS_ALL=1 runs {vendor}")


def load(vendor: str) -> tuple[dict, list[list[dict]]]:
    """The transcript and its turns' calls, each parsed by the vendor's own SDK type first."""
    script = json.loads((TRANSCRIPTS / f"{vendor}-files.json").read_text())
    turns = []
    for turn in script["turns"]:
        if vendor == "anthropic":
            adapter = TypeAdapter(BetaComputerToolUseBlock)
            blocks = [adapter.validate_python(b) for b in turn]
            turns.append([b.model_dump(exclude_none=True) for b in blocks])
        else:
            item = ResponseComputerToolCall.model_validate(turn)
            assert item.actions is not None
            turns.append([a.model_dump(exclude_none=True) for a in item.actions])
    return script, turns


@pytest.mark.parametrize("vendor", VENDORS)
def test_transcript_scores_1_through_the_api(live_daemon: Daemon, vendor: str) -> None:
    script, turns = load(vendor)
    with drums.connect(live_daemon.url, token=live_daemon.token) as client:
        with client.create(str(ROOT / script["task"])) as env:
            env.wait_valid(timeout=300)  # a first task on a loaded host
            for calls in turns:
                result = env.step(
                    calls, dialect=script["dialect"], screen=tuple(script["screen"]),
                    screenshot={"format": "jpeg"},
                )  # fmt: skip
                assert (result.screenshot_width, result.screenshot_height) == tuple(
                    script["screen"]
                )
            verdict = env.verify()
            assert verdict.score == 1.0, verdict


@pytest.mark.parametrize("vendor", VENDORS)
def test_transcript_scores_1_through_mcp(live_daemon: Daemon, vendor: str) -> None:
    mcp_sample(vendor)
    script, turns = load(vendor)
    env = {
        "DRUMS_URL": live_daemon.url,
        "DRUMS_TOKEN": live_daemon.token,
        "PATH": os.environ["PATH"],
    }
    cli = "import sys, drums._cli; sys.exit(drums._cli.main())"
    argv = [sys.executable, "-c", cli, "mcp", "--gates-timeout", "300"]

    async def replay() -> None:
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            made = await s.call_tool("desktop_create", {"task": str(ROOT / script["task"])})
            assert not made.is_error, made
            width, height = script["screen"]
            for calls in turns:
                got = await s.call_tool(
                    "computer",
                    {"dialect": script["dialect"], "actions": calls, "screen_width": width,
                     "screen_height": height, "format": "jpeg"},
                )  # fmt: skip
                assert not got.is_error, got
                images = [c for c in got.content if c.type == "image"]
                assert images and images[-1].mime_type == "image/jpeg"
            shot = await s.call_tool("screenshot", {"format": "webp", "quality": 60, "width": 640})
            assert not shot.is_error and shot.content[0].mime_type == "image/webp", shot
            bad = await s.call_tool("computer", {"dialect": "openai", "actions": [{"type": "tap"}]})
            assert bad.is_error and "actions[0].type" in bad.content[0].text, bad
            verdict = await s.call_tool("verify", {})
            assert not verdict.is_error, verdict
            assert json.loads(verdict.content[0].text)["score"] == 1.0, verdict

    anyio.run(replay)


@pytest.mark.parametrize("vendor", VENDORS)
def test_transcript_scores_1_through_mcp_vendor_tools(live_daemon: Daemon, vendor: str) -> None:
    """`drums mcp --vendor-tools VENDOR`: the calls go to tools named as the vendor names them
    (Anthropic's members; OpenAI's `computer` with the batch), as a forwarding client sends them."""
    mcp_sample(vendor)
    script, turns = load(vendor)
    env = {
        "DRUMS_URL": live_daemon.url,
        "DRUMS_TOKEN": live_daemon.token,
        "PATH": os.environ["PATH"],
    }
    width, height = script["screen"]
    cli = "import sys, drums._cli; sys.exit(drums._cli.main())"
    argv = [sys.executable, "-c", cli, "mcp", "--gates-timeout", "300",
            "--vendor-tools", vendor, "--screen", f"{width}x{height}"]  # fmt: skip

    async def replay() -> None:
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            listed = {t.name for t in (await s.list_tools()).tools}
            if vendor == "anthropic":
                members = set(BETA_COMPUTER_MEMBER_NAME_VALUES)
                assert members <= listed, members - listed
            else:
                assert "computer" in listed
            made = await s.call_tool("desktop_create", {"task": str(ROOT / script["task"])})
            assert not made.is_error, made
            for calls in turns:
                if vendor == "anthropic":
                    sent = [(c["name"], c.get("input") or {}) for c in calls]
                else:
                    sent = [("computer", {"actions": calls})]
                for name, arguments in sent:
                    got = await s.call_tool(name, arguments)
                    assert not got.is_error, (name, got)
                    shots = [c for c in got.content if c.type == "image"]
                    assert shots, got
            verdict = await s.call_tool("verify", {})
            assert json.loads(verdict.content[0].text)["score"] == 1.0, verdict

    anyio.run(replay)
