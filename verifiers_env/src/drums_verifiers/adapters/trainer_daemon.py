"""Which drumsd the verl and SkyRL adapters talk to, and the log line that says so.

Explicit config (`daemon_url`, `token_file` in the tool config / SkyRL env config or extras) wins;
else the SDK's own DRUMS_URL / DRUMS_TOKEN / DRUMS_TOKEN_FILE; else its defaults. Unset values are
passed to the SDK as None so it does the environment lookup itself (one rule for every client).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from drums._config import resolve_settings


@dataclass(frozen=True)
class Daemon:
    url: str | None
    token_file: str | None

    def describe(self, environ: Mapping[str, str] | None = None) -> str:
        env = os.environ if environ is None else environ
        settings = resolve_settings(self.url, None, self.token_file, env)
        if self.url:
            origin = "config"
        elif env.get("DRUMS_URL"):
            origin = "DRUMS_URL"
        else:
            origin = "default"
        return f"drumsd {settings.url} (url from {origin}, token from {settings.token_source})"


def setting(config: Any, name: str) -> Any:
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


def daemon_from(*configs: Any) -> Daemon:
    """The first config (of those given, in order) that sets each field wins."""
    url = next((v for c in configs if (v := setting(c, "daemon_url"))), None)
    token_file = next((v for c in configs if (v := setting(c, "token_file"))), None)
    return Daemon(str(url) if url else None, str(token_file) if token_file else None)


def announce(log: logging.Logger, who: str, daemon: Daemon) -> None:
    log.info("%s uses %s", who, daemon.describe())
