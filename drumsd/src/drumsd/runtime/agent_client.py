"""Host side of the guest agent protocol (drumsd.guest.protocol), over trio.

One connection per call, closed before returning: CRIU refuses to dump a slot while the host holds
a connection into it, so callers must also serialize dumps against calls (the slot's lock).
The socket of a running slot is /proc/<slot init pid>/root/run/drums/agent.sock. The slot's
users must not point the daemon elsewhere: such a path is resolved inside the slot's root with
openat2 (no symlinks at all, no escaping the root) to the socket's inode, which must be a socket
owned by the slot's root, and the daemon connects to that inode through /proc/self/fd. Replies
are read up to MAX_HEADER_BYTES + MAX_PAYLOAD_BYTES: a fake agent cannot grow the daemon's memory.
"""

# Timeouts are parameters on purpose: a step's timeout also travels to the agent as its deadline.
# ruff: noqa: ASYNC109

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from drumsd.guest import protocol
from drumsd.linux.agent_socket import agent_socket as agent_socket  # re-exported for callers
from drumsd.linux.agent_socket import connectable_path

AGENT_SOCKET_IN_SLOT = protocol.SOCKET_PATH
READY_MARKER_IN_SLOT = protocol.READY_PATH
# Codes: the agent's ("invalid_action", "timeout", "failed") plus the client's own
# "unreachable" (no agent listening: the slot is dead or still booting).
UNREACHABLE = "unreachable"
_MARGIN_S = 2.0
MAX_HEADER_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 64 << 20


class AgentError(Exception):
    """The agent answered with an error, timed out, or could not be reached."""

    def __init__(self, code: str, message: str, header: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.header = header or {}


@dataclass(frozen=True)
class ExecResult:
    rc: int
    stdout: str
    stderr: str


async def _read_reply(stream: trio.SocketStream, where: Path) -> bytes:
    """Read to EOF, refusing a header or payload beyond the caps."""
    reply = bytearray()
    limit = MAX_HEADER_BYTES
    while chunk := await stream.receive_some(1 << 20):
        reply += chunk
        if limit == MAX_HEADER_BYTES:
            newline = reply.find(b"\n")
            if newline >= 0:
                limit = newline + 1 + MAX_PAYLOAD_BYTES
            elif len(reply) > MAX_HEADER_BYTES:
                raise AgentError("failed", f"agent reply header from {where} exceeds 1 MiB")
        if len(reply) > limit:
            raise AgentError("failed", f"agent reply payload from {where} exceeds 64 MiB")
    return bytes(reply)


async def call(
    sock_path: Path, request: dict[str, Any], *, timeout: float
) -> tuple[dict[str, Any], bytes]:
    """Send one request, return (header, payload); raise AgentError on any failure."""
    data = protocol.encode_request(request)
    try:
        with trio.fail_after(timeout):
            try:
                with connectable_path(sock_path) as path:
                    stream = await trio.open_unix_socket(path)
            except OSError as exc:
                raise AgentError(
                    UNREACHABLE,
                    f"cannot connect to {sock_path}: {exc.strerror or exc}; is the "
                    "slot running and its desktop ready?",
                ) from exc
            async with stream:
                await stream.send_all(data)
                reply = await _read_reply(stream, sock_path)
    except trio.TooSlowError as exc:
        raise AgentError(
            "timeout", f"no reply to {request['op']} from {sock_path} within {timeout} s"
        ) from exc
    except (trio.BrokenResourceError, OSError) as exc:  # AgentError is not an OSError
        raise AgentError("failed", f"connection to {sock_path} broke: {exc}") from exc
    try:
        header, payload = protocol.split_reply(bytes(reply))
    except protocol.ProtocolError as exc:
        raise AgentError(exc.code, f"{exc.message} ({sock_path}, op {request['op']})") from exc
    error = protocol.error_of(header)
    if error is not None:
        raise AgentError(error[0], error[1], header)
    return header, payload


async def ping(sock_path: Path, *, timeout: float = 2.0) -> dict[str, Any]:
    header, _ = await call(sock_path, {"op": "ping"}, timeout=timeout)
    return header


async def wait_ready(sock_path: Path, *, timeout: float, interval: float = 0.01) -> dict[str, Any]:
    """Ping until the agent answers or `timeout` passes (then raise the last AgentError)."""
    last: AgentError | None = None
    with trio.move_on_after(timeout):
        while True:
            try:
                return await ping(sock_path, timeout=max(0.5, interval))
            except AgentError as exc:
                last = exc
            await trio.sleep(interval)
    raise AgentError(
        "timeout", f"agent at {sock_path} not ready after {timeout} s (last error: {last})"
    )


async def step(
    sock_path: Path,
    action: dict[str, Any],
    *,
    timeout: float | None = None,
    screenshot: bool = False,
) -> tuple[dict[str, Any], bytes | None]:
    """Perform one action; returns (result, PNG taken right after it if `screenshot`)."""
    request: dict[str, Any] = {"op": "step", "action": action}
    if timeout is not None:
        request["timeout_s"] = timeout
    if screenshot:
        request["screenshot"] = True
    wait = (timeout if timeout is not None else _implied_timeout(action)) + _MARGIN_S
    header, payload = await call(sock_path, request, timeout=wait)
    return header.get("result", {}), (payload if screenshot else None)


def _implied_timeout(action: dict[str, Any]) -> float:
    try:
        return protocol.step_timeout(protocol.parse_action(action), None)
    except protocol.ProtocolError:
        return protocol.DEFAULT_STEP_TIMEOUT_S  # the agent will reject it with the reason


async def screenshot(sock_path: Path, *, timeout: float = 10.0) -> bytes:
    """A PNG of the whole 1920x1080 screen."""
    _, payload = await call(sock_path, {"op": "screenshot"}, timeout=timeout)
    return payload


async def grab(
    sock_path: Path, spec: protocol.ShotSpec, *, timeout: float = 10.0
) -> tuple[dict[str, Any], bytes]:
    """A screenshot encoded as `spec` asks: (header with content_type, width, height, cached,
    grab_s, encode_s; the encoded bytes)."""
    request: dict[str, Any] = {"op": "screenshot"}
    if spec != protocol.PNG_FULL:
        request["shot"] = spec.to_request()
    return await call(sock_path, request, timeout=timeout)


async def read_file(
    sock_path: Path, path: str, *, max_bytes: int | None = None, timeout: float = 30.0
) -> bytes:
    """A file's bytes as the desktop user sees them (raises if it exceeds max_bytes)."""
    request: dict[str, Any] = {"op": "read_file", "path": path}
    if max_bytes is not None:
        request["max_bytes"] = max_bytes
    header, payload = await call(sock_path, request, timeout=timeout)
    if header.get("truncated"):
        raise AgentError(
            "failed",
            f"{path} is {header.get('file_size')} bytes, more than max_bytes={max_bytes}",
            header,
        )
    return payload


async def exec_(
    sock_path: Path,
    command: list[str] | str,
    *,
    timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> ExecResult:
    """Run a command as the desktop user: argv list, or a string for /bin/sh -c."""
    request: dict[str, Any] = {"op": "exec", "timeout_s": timeout_s}
    request["shell" if isinstance(command, str) else "argv"] = command
    if env:
        request["env"] = env
    if cwd:
        request["cwd"] = cwd
    header, _ = await call(sock_path, request, timeout=timeout_s + _MARGIN_S)
    return ExecResult(rc=header["rc"], stdout=header["stdout"], stderr=header["stderr"])


async def launch(
    sock_path: Path,
    command: list[str] | str,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 10.0,
) -> None:
    """Start an app as the desktop user and return at once (it keeps running, output dropped);
    e.g. OSWorld's `launch` setup step."""
    request: dict[str, Any] = {"op": "exec", "detach": True, "timeout_s": timeout}
    request["shell" if isinstance(command, str) else "argv"] = command
    if env:
        request["env"] = env
    if cwd:
        request["cwd"] = cwd
    header, _ = await call(sock_path, request, timeout=timeout + _MARGIN_S)
    if header["rc"] != 0:
        raise AgentError("failed", f"could not launch {command!r} (setsid rc={header['rc']})")


async def windows(sock_path: Path, *, timeout: float = 5.0) -> list[dict[str, Any]]:
    header, _ = await call(sock_path, {"op": "windows"}, timeout=timeout)
    return header["windows"]


async def procs(sock_path: Path, *, timeout: float = 5.0) -> list[dict[str, Any]]:
    header, _ = await call(sock_path, {"op": "procs"}, timeout=timeout)
    return header["procs"]
