"""Which drumsd every entry point of this package talks to, and with which token.

One rule for the taskset, the tool servers and the trainer adapters: explicit configuration
first, else DRUMS_URL / DRUMS_TOKEN_FILE / DRUMS_TOKEN, else the defaults (http://127.0.0.1:7070,
/etc/drums/token). The values come from the SDK's own resolution (`drums._config`); this module
adds where each one came from, the first log line that says so, and a clear error naming the
setting to change when there is no token. It imports neither verifiers nor a trainer, so every
adapter can call `resolve_daemon`.

The URL `ray://` (a `daemon_url`, or DRUMS_URL) is the pool's ray mode, for code running inside
a Ray job (SkyRL's envs, verl's tools): envs come from `drums.ray`'s pool over every drums host
of the cluster, and no token is needed here (each host's agent reads its own node's token).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drums import Secret
from drums._config import DEFAULT_TOKEN_FILE, DEFAULT_URL, resolve_settings

log = logging.getLogger("drums_verifiers.daemon")
RAY_URL = "ray://"
"""The daemon URL of ray mode: the pool of the Ray cluster this process runs in."""
_announced: set[str] = set()
_announce_lock = threading.Lock()


class DaemonSettingsError(RuntimeError):
    """No usable token (or another setting is wrong); the message names what to set."""


@dataclass(frozen=True)
class Daemon:
    """A resolved daemon address and token, with where each came from (never the token)."""

    url: str
    url_source: str
    """'config', 'DRUMS_URL' or 'default'."""
    token: Secret | None
    token_source: str
    """'config token', 'DRUMS_TOKEN', or '<path> (config|DRUMS_TOKEN_FILE|default)'."""
    token_file: Path | None
    """The file the token was read from (or looked for), None when it came as a value."""
    missing: str | None = None
    """Why there is no token, when there is none."""

    @property
    def ray(self) -> bool:
        """Ray mode: envs come from drums.ray's pool, each host's agent holding its token."""
        return self.url == RAY_URL

    def describe(self) -> str:
        if self.ray:
            return f"the drums pool of this Ray cluster (ray mode, from {self.url_source})"
        token = self.token_source if self.token is not None else f"none ({self.missing})"
        return f"drumsd {self.url} (from {self.url_source}), token from {token}"

    def require_token(self, hint: str = "") -> Secret:
        """The token, or an error that says where it was looked for and what to set."""
        if self.token is not None:
            return self.token
        where = hint or "pass the token file in the entry point's config"
        raise DaemonSettingsError(
            f"no drumsd token: {self.missing}; {where}, or export DRUMS_TOKEN_FILE=<file> "
            "or DRUMS_TOKEN=<token> (the daemon's token_file)"
        )

    def aconnect(self, hint: str = "", **kwargs: Any) -> Any:
        """An SDK AsyncClient on this daemon, or in ray mode the pool's AsyncPool (the caller
        owns and closes it; `kwargs` go to the SDK client, or to the pool in ray mode)."""
        if self.ray:
            return _ray_pool().aconnect(**kwargs)
        import drums

        return self._named(drums.aconnect(url=self.url, token=self.require_token(hint), **kwargs))

    def connect(self, hint: str = "", **kwargs: Any) -> Any:
        """An SDK sync Client on this daemon, or in ray mode the pool (`drums.ray.Pool`, the
        same create / close surface); the caller owns and closes it."""
        if self.ray:
            return _ray_pool().connect(**kwargs)
        import drums

        return self._named(drums.connect(url=self.url, token=self.require_token(hint), **kwargs))

    def _named(self, client: Any) -> Any:
        """The client with this token's real source: the SDK, handed the token as a value,
        would name "the token argument" in a 401's message, not the file or variable."""
        client._settings = dataclasses.replace(client._settings, token_source=self.token_source)
        return client

    def announce(self, who: str = "") -> None:
        """Log which daemon and token source is used, once per process, user and setting."""
        line = f"{who} uses {self.describe()}" if who else self.describe()
        with _announce_lock:
            if line in _announced:
                return
            _announced.add(line)
        log.info("%s", line)


def _ray_pool() -> Any:
    try:
        import drums.ray
    except ImportError as exc:
        raise DaemonSettingsError(
            f"the daemon URL {RAY_URL} (ray mode) needs drums.ray: `pip install drums-sdk[ray]` "
            f"in this job's environment ({exc})"
        ) from None
    return drums.ray


def _ray_url(url: str, source: str) -> str | None:
    """RAY_URL if `url` asks for ray mode; a `ray://` with anything after it is refused (Ray
    Client addresses are not supported: the pool runs inside the Ray job)."""
    if not url.lower().startswith("ray:"):
        return None
    if url.lower().rstrip("/") != "ray:":
        raise DaemonSettingsError(
            f"{source} is {url!r}: ray mode is exactly {RAY_URL!r} (the pool of the Ray cluster "
            "this job runs in; set RAY_ADDRESS to name another cluster). For a process outside "
            "Ray, use the pool's gateway URL (`drums pool serve`)"
        )
    return RAY_URL


def _unreadable(path: Path) -> str:
    try:
        path.read_text()
    except OSError as exc:
        return f"{path} is not readable ({exc.strerror or type(exc).__name__})"
    return f"{path} is empty"


def resolve_daemon(
    url: str | None = None,
    token: str | Secret | None = None,
    token_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    announce: bool = True,
) -> Daemon:
    """The daemon to use: explicit arguments first (a token over a token file), else DRUMS_URL,
    DRUMS_TOKEN, DRUMS_TOKEN_FILE, else the defaults. Empty strings count as unset. A missing
    token is not an error here (`require_token` raises); `announce` logs the first line."""
    env = os.environ if environ is None else environ
    url = url or None
    token = token or None
    token_file = token_file or None
    chosen = url or env.get("DRUMS_URL") or ""
    url_source = "config" if url else "DRUMS_URL" if env.get("DRUMS_URL") else "default"
    if _ray_url(chosen, "daemon_url" if url else url_source) is not None:
        pool = Daemon(RAY_URL, url_source, None, "each host's own (ray mode)", None)
        if announce:
            pool.announce()
        return pool
    if token is None and token_file is not None:
        # An explicit file beats DRUMS_TOKEN from the environment.
        env = {k: v for k, v in env.items() if k != "DRUMS_TOKEN"}
    settings = resolve_settings(url, token, token_file, environ=env)
    path: Path | None = None
    missing: str | None = None
    if token is not None:
        source = "config token"
    elif env.get("DRUMS_TOKEN"):
        source = "DRUMS_TOKEN"
    else:
        if token_file is not None:
            path, origin = Path(token_file), "config"
        elif env.get("DRUMS_TOKEN_FILE"):
            path, origin = Path(env["DRUMS_TOKEN_FILE"]), "DRUMS_TOKEN_FILE"
        else:
            path, origin = Path(DEFAULT_TOKEN_FILE), "default"
        source = f"{path} ({origin})"
        if settings.token is None:
            missing = f"DRUMS_TOKEN is unset and {_unreadable(path)} ({origin})"
    daemon = Daemon(
        url=settings.url,
        url_source=url_source,
        token=settings.token,
        token_source=source,
        token_file=path,
        missing=missing,
    )
    if announce:
        daemon.announce()
    return daemon


def setting(config: Any, name: str) -> Any:
    """`name` from a mapping or an object (a trainer's config), None when absent."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


@dataclass(frozen=True)
class DaemonSettings:
    """The explicit `daemon_url` / `token_file` a trainer adapter was configured with (either
    may be None); resolved at use, so a token file written later is still read."""

    url: str | None = None
    token_file: str | None = None

    @classmethod
    def first_of(cls, *configs: Any) -> DaemonSettings:
        """Each field from the first config (in order) that sets it."""
        url = next((v for c in configs if (v := setting(c, "daemon_url"))), None)
        token_file = next((v for c in configs if (v := setting(c, "token_file"))), None)
        return cls(str(url) if url else None, str(token_file) if token_file else None)

    def resolve(self, who: str = "", announce: bool = True) -> Daemon:
        daemon = resolve_daemon(url=self.url, token_file=self.token_file, announce=False)
        if announce:
            daemon.announce(who)
        return daemon


__all__ = [
    "DEFAULT_TOKEN_FILE",
    "DEFAULT_URL",
    "RAY_URL",
    "Daemon",
    "DaemonSettings",
    "DaemonSettingsError",
    "resolve_daemon",
]
