"""Every call this package makes into the drums SDK, in one place.

The SDK (`drums`, issue 5) is async-first: `drums.aconnect()` gives an `AsyncClient`, whose
`create(task=...)` gives an env with `wait_valid`, `observe`, `step`, `fork`, `verify`,
`close`. Keeping the calls here means a change of the SDK's surface is a change of this file,
and the rest of the package talks about desktops, not HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import logging
import struct
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from drums_verifiers.config import TOKEN_HINT, DaemonConfig
from drums_verifiers.daemon import Daemon

log = logging.getLogger("drums_verifiers.desktop")
T = TypeVar("T")

# The SDK is imported lazily so `import drums_verifiers` (CLI discovery, config parsing) works
# in environments where only the config is needed.


def sdk() -> Any:
    try:
        import drums
    except ImportError as exc:  # pragma: no cover - the distribution depends on drums-sdk
        raise RuntimeError(
            "the drums SDK is not installed; `pip install drums-sdk` (or the workspace's sdk/)"
        ) from exc
    return drums


async def resolve(value: T | Awaitable[T]) -> T:
    """The SDK's async client returns coroutines; tolerate plain values for sync shims."""
    if inspect.isawaitable(value):
        return await value
    return value  # type: ignore[return-value]


def error_code(exc: BaseException) -> str | None:
    """The daemon's error code carried by an SDK exception (`EnvGone` -> 'env_gone')."""
    return getattr(exc, "code", None)


def is_drums_error(exc: BaseException) -> bool:
    drums = sdk()
    return isinstance(exc, drums.DrumsError)


def is_invalid_episode(exc: BaseException) -> bool:
    drums = sdk()
    invalid = getattr(drums, "InvalidEpisode", None)
    return (invalid is not None and isinstance(exc, invalid)) or error_code(exc) in (
        "invalid_episode",
        "quarantined",
    )


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG header, without decoding the image."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24:
        raise ValueError("the screenshot is not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    return width, height


@dataclass
class Observation:
    png: bytes
    """The screenshot's bytes: a PNG unless screenshot options asked for another format."""
    instruction: str
    meta: dict[str, Any]
    content_type: str = "image/png"


async def open_client(daemon: DaemonConfig | Daemon, hint: str = TOKEN_HINT) -> Any:
    """An SDK AsyncClient for `daemon`; the caller owns it and must `aclose_client` it.

    Raises DaemonSettingsError (naming the setting) when there is no token, before any request."""
    sdk()
    resolved = daemon if isinstance(daemon, Daemon) else daemon.resolve()
    client = await resolve(resolved.aconnect(hint))
    enter = getattr(client, "__aenter__", None)
    if enter is not None:
        client = await enter() or client
    return client


async def aclose_client(client: Any) -> None:
    exit_ = getattr(client, "__aexit__", None)
    if exit_ is not None:
        await exit_(None, None, None)
    else:
        await resolve(client.aclose())


async def create_env(client: Any, task: str | dict[str, Any], idle_timeout_s: float) -> Any:
    return await resolve(client.create(task=task, idle_timeout_s=idle_timeout_s))


async def attach_env(client: Any, env_id: str) -> Any:
    """A handle on an env another process created (the tool servers act on the rollout's env).

    The SDK's issue names no attach call; this accepts the spellings an SDK would use, and says
    what is missing otherwise."""
    for name in ("attach", "env", "get_env"):
        method = getattr(client, name, None)
        if callable(method):
            return await resolve(method(env_id))
    raise RuntimeError(
        f"the drums SDK cannot attach to env {env_id}: AsyncClient needs attach(env_id) "
        "(as the sync Client has) returning an Env for an existing id"
    )


def env_id(env: Any) -> str:
    return str(env.id)


async def wait_valid(env: Any, timeout_s: float) -> Any:
    return await resolve(env.wait_valid(timeout=timeout_s))


async def observe(env: Any, shot: dict[str, Any] | None = None) -> Observation:
    """The screen; `shot` (screenshot options: format, quality, width, height) has the daemon
    encode and scale it, then `Observation.content_type` says the format."""
    obs = await resolve(env.observe(**shot) if shot else env.observe())
    meta = dict(getattr(obs, "meta", None) or {})
    if not isinstance(meta, dict):  # a pydantic model
        meta = meta.model_dump()
    return Observation(
        png=obs.png,
        instruction=str(meta.get("instruction") or ""),
        meta=meta,
        content_type=str(getattr(obs, "content_type", None) or "image/png"),
    )


async def step(env: Any, action: str | dict[str, Any], screenshot: bool | dict = False) -> Any:
    """One action; with `screenshot` (True, or screenshot options) the daemon returns the screen
    after it in the same call (`screenshot_b64(result)`): one round trip, not a step and a
    screenshot."""
    if screenshot:
        return await resolve(env.step(action, screenshot=screenshot))
    return await resolve(env.step(action))


def screenshot_b64(result: Any) -> tuple[str, str] | None:
    """The screenshot a `step(..., screenshot=...)` result carries, still base64 (the model's
    tool result carries base64 too: no decode and re-encode), and its content type."""
    png = field(result, "screenshot_png_b64")
    if png:
        return png, "image/png"
    data = field(result, "screenshot_b64")
    if data:
        return data, str(field(result, "screenshot_content_type") or "image/png")
    return None


def screenshot_bytes(result: Any) -> bytes | None:
    """The screenshot a `step(..., screenshot=...)` result carries, decoded."""
    shot = screenshot_b64(result)
    return base64.b64decode(shot[0]) if shot else None


async def verify(env: Any, timeout_s: float) -> Any:
    return await asyncio.wait_for(resolve(env.verify(strict=False)), timeout_s)


async def close_env(env: Any) -> None:
    close = getattr(env, "aclose", None) or env.close
    await resolve(close())


def fork(env: Any, n: int) -> Any:
    """The SDK's fork context manager: yields the children, destroys them (and the prefork
    state) on exit."""
    return env.fork(n)


def failed_gates(source: Any) -> list[str]:
    """Failed gate names from a gate report, a verify result or an SDK error's detail."""
    for holder in (source, getattr(source, "detail", None) or {}):
        for name in ("failed_gates", "failed"):
            value = field(holder, name)
            if value:
                return [str(g) for g in value]
    return []


def field(result: Any, name: str, default: Any = None) -> Any:
    """Read a field from an SDK result whether it is a model, a dataclass or a dict."""
    if isinstance(result, dict):
        return result.get(name, default)
    return getattr(result, name, default)
