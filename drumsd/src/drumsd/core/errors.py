"""The typed error every layer raises when an operation cannot proceed.

One code per failure (the stable codes of `drums.models.ErrorCode`); the API maps it to an HTTP
status and the error envelope in one place.
"""

from __future__ import annotations

from typing import Any


class DrumsdError(Exception):
    """An operation refused or failed; `message` says what to do next."""

    def __init__(
        self, code: str, message: str, *, retry_after_s: float | None = None, **detail: Any
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail
        self.retry_after_s = retry_after_s

    def __repr__(self) -> str:
        return f"DrumsdError({self.code!r}, {self.message!r})"
