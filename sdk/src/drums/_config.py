"""Where the daemon's address and token come from: arguments first, then the environment.

DRUMS_URL (default http://127.0.0.1:7070), DRUMS_TOKEN, DRUMS_TOKEN_FILE (default /etc/drums/token).
The token is held in a `Secret` so it cannot end up in a repr, a log line or an exception.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, NoReturn, Optional, Union

DEFAULT_URL = "http://127.0.0.1:7070"
DEFAULT_TOKEN_FILE = "/etc/drums/token"


class Secret:
    """A string that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a drums Secret is not picklable, so it cannot leak through pickles")


@dataclass(frozen=True)
class Settings:
    url: str
    token: Optional[Secret]
    token_source: str  # where the token came from, for error messages ("DRUMS_TOKEN", a path ...)


def resolve_settings(
    url: Optional[str],
    token: Union[str, Secret, None],
    token_file: Union[str, "os.PathLike[str]", None] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Settings:
    """Arguments win over DRUMS_URL / DRUMS_TOKEN / DRUMS_TOKEN_FILE; a missing token is allowed
    (only /healthz works without one, and the first 401 explains where a token is looked for)."""
    env = os.environ if environ is None else environ
    resolved_url = (url or env.get("DRUMS_URL") or DEFAULT_URL).rstrip("/")
    if token is not None:
        secret = token if isinstance(token, Secret) else Secret(token.strip())
        return Settings(resolved_url, secret, "the token argument")
    if env.get("DRUMS_TOKEN"):
        return Settings(resolved_url, Secret(env["DRUMS_TOKEN"].strip()), "DRUMS_TOKEN")
    path = Path(token_file or env.get("DRUMS_TOKEN_FILE") or DEFAULT_TOKEN_FILE)
    try:
        text = path.read_text().strip()
    except OSError:
        return Settings(resolved_url, None, f"none (no DRUMS_TOKEN, and {path} is not readable)")
    return Settings(resolved_url, Secret(text) if text else None, str(path))
