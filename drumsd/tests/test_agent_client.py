"""The daemon's side of the agent socket: it resolves /proc/<pid>/root/... inside that root
without symlinks, accepts only a socket owned by the slot's root, and caps what it reads."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import trio
from drumsd.linux import agent_socket
from drumsd.runtime import agent_client as ac

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the checks assume host root (uid 0)")


def in_root(path: Path) -> Path:
    """`path` seen through this process's own /proc/<pid>/root (the host root: in-root uid 0)."""
    return Path(f"/proc/{os.getpid()}/root{path}")


async def serve_once(listener: socket.socket, reply: bytes) -> None:
    sock = trio.socket.from_stdlib_socket(listener)
    conn, _ = await sock.accept()
    with conn:
        await conn.recv(65536)
        view = memoryview(reply)
        while view:
            sent = await conn.send(view[: 1 << 20])
            view = view[sent:]


def make_listener(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(4)
    return s


def ok_reply(payload: bytes = b"") -> bytes:
    return json.dumps({"ok": True, "size": len(payload)}).encode() + b"\n" + payload


async def test_a_root_owned_socket_in_the_root_answers(tmp_path: Path) -> None:
    listener = make_listener(tmp_path / "agent.sock")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_once, listener, ok_reply(b"hello"))
        header, payload = await ac.call(in_root(tmp_path / "agent.sock"), {"op": "ping"}, timeout=5)
    assert header["ok"] and payload == b"hello"


async def test_a_symlink_to_another_socket_is_not_followed(tmp_path: Path) -> None:
    listener = make_listener(tmp_path / "host.sock")
    listener.setblocking(False)
    (tmp_path / "agent.sock").symlink_to(tmp_path / "host.sock")
    with pytest.raises(ac.AgentError) as info:
        await ac.call(in_root(tmp_path / "agent.sock"), {"op": "ping"}, timeout=5)
    assert info.value.code == ac.UNREACHABLE
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    # A symlinked directory on the way is refused too.
    (tmp_path / "real").mkdir()
    make_listener(tmp_path / "real" / "agent.sock")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ac.AgentError):
        await ac.call(in_root(tmp_path / "link" / "agent.sock"), {"op": "ping"}, timeout=5)


async def test_a_socket_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    make_listener(tmp_path / "agent.sock")
    os.chown(tmp_path / "agent.sock", 1000, 1000)
    with pytest.raises(ac.AgentError) as info:
        await ac.call(in_root(tmp_path / "agent.sock"), {"op": "ping"}, timeout=5)
    assert "not the agent's socket" in info.value.message


async def test_a_header_without_end_is_cut_at_the_cap(tmp_path: Path) -> None:
    listener = make_listener(tmp_path / "agent.sock")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_once, listener, b"{" + b" " * (ac.MAX_HEADER_BYTES + 10))
        with pytest.raises(ac.AgentError) as info:
            await ac.call(in_root(tmp_path / "agent.sock"), {"op": "ping"}, timeout=10)
        nursery.cancel_scope.cancel()
    assert "exceeds 1 MiB" in info.value.message


async def test_a_payload_beyond_the_cap_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ac, "MAX_PAYLOAD_BYTES", 1000)
    listener = make_listener(tmp_path / "agent.sock")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_once, listener, ok_reply(b"x" * 5000))
        with pytest.raises(ac.AgentError) as info:
            await ac.call(in_root(tmp_path / "agent.sock"), {"op": "ping"}, timeout=10)
        nursery.cancel_scope.cancel()
    assert "exceeds 64 MiB" in info.value.message


def test_slot_root_uid_reads_the_uid_map() -> None:
    assert agent_socket.slot_root_uid(os.getpid()) == 0
