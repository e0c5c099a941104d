"""Every error the SDK raises, and the one place where foreign errors become ours.

    DrumsError                  code, message, env_id, status, detail
    ├── ConnectionFailed        the daemon cannot be reached (client side)
    ├── Timeout                 no answer within the call's deadline, or the daemon's 504
    ├── BadResponse             the daemon answered something this SDK cannot read
    ├── CleanupFailed           envs or saved states could not be removed on close (ids in detail)
    ├── Unauthorized            401: missing or wrong token
    ├── NotFound                404: no such env, state or task
    ├── EnvGone                 410: the env was destroyed (by you, a lease, or the reaper)
    ├── InvalidRequest          422: bad arguments
    │   ├── UnsupportedTask     the host cannot run this task (the reason says why)
    │   └── ActionFailed        the desktop could not perform the action
    ├── Conflict                409: the env's state forbids this now
    │   └── NotQuiescent        the process tree did not settle in time
    ├── InvalidEpisode          409: a gate failed: the episode must not be trained on
    │   └── Quarantined         423: the env is out of service (release() then reset())
    ├── Overloaded              429: the host refuses more work (after the SDK's retries)
    ├── StateDirFull            507: no room for another slot or saved state
    ├── RestoreFailed           502: CRIU could not restore the desktop
    ├── CheckerFailed           502: the task's checker crashed or hung: no reward
    ├── SetupFailed             502: the task's setup steps failed in the env
    └── DaemonUnavailable       503: the daemon's runtime failed
        └── ShuttingDown        503: the daemon is stopping

Nothing here ever holds the bearer token: messages are built from codes, paths and env ids only.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Type

import httpx
import pydantic


class DrumsError(Exception):
    """Base of every SDK error. `code` is the daemon's stable error code."""

    default_code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        env_id: Optional[str] = None,
        status: Optional[int] = None,
        detail: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.env_id = env_id
        self.status = status
        self.detail: Dict[str, Any] = dict(detail or {})

    def __str__(self) -> str:
        where = f" (env {self.env_id})" if self.env_id else ""
        return f"[{self.code}] {self.message}{where}"

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(code={self.code!r}, env_id={self.env_id!r}, message={self.message!r})"


class ConnectionFailed(DrumsError):
    default_code = "connection_failed"


class Timeout(DrumsError):
    default_code = "timeout"


class BadResponse(DrumsError):
    default_code = "bad_response"


class CleanupFailed(DrumsError):
    default_code = "cleanup_failed"


class Unauthorized(DrumsError):
    default_code = "unauthorized"


class NotFound(DrumsError):
    default_code = "not_found"


class EnvGone(DrumsError):
    default_code = "env_gone"


class InvalidRequest(DrumsError):
    default_code = "invalid_request"


class UnsupportedTask(InvalidRequest):
    default_code = "unsupported_task"


class ActionFailed(InvalidRequest):
    default_code = "action_failed"


class Conflict(DrumsError):
    default_code = "conflict"


class NotQuiescent(Conflict):
    default_code = "not_quiescent"


class InvalidEpisode(DrumsError):
    """The episode is invalid (a gate failed): its reward must not be trained on.

    `failed_gates` names the gates, `invalid_reasons` says why, `verdict` is the daemon's word.
    """

    default_code = "invalid_episode"

    @property
    def failed_gates(self) -> List[str]:
        return list(self.detail.get("failed_gates") or self.detail.get("failed") or [])

    @property
    def invalid_reasons(self) -> List[str]:
        return list(self.detail.get("invalid_reasons") or [])

    @property
    def verdict(self) -> Optional[str]:
        return self.detail.get("verdict")


class Quarantined(InvalidEpisode):
    """A quarantined env's episode is invalid by definition (its not_quarantined gate failed), so
    `except InvalidEpisode` catches both: drop the episode, then release() and reset()."""

    default_code = "quarantined"


class Overloaded(DrumsError):
    default_code = "overloaded"

    @property
    def retry_after_s(self) -> Optional[float]:
        value = self.detail.get("retry_after_s")
        return float(value) if value is not None else None


class StateDirFull(DrumsError):
    default_code = "state_dir_full"


class RestoreFailed(DrumsError):
    default_code = "restore_failed"


class CheckerFailed(DrumsError):
    default_code = "checker_failed"


class SetupFailed(DrumsError):
    default_code = "setup_failed"


class DaemonUnavailable(DrumsError):
    default_code = "runtime_error"


class ShuttingDown(DaemonUnavailable):
    default_code = "shutting_down"


# One class per daemon error code (drums.models.ErrorCode); a test keeps the two in step.
ERROR_CLASSES: Dict[str, Type[DrumsError]] = {
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "env_gone": EnvGone,
    "invalid_request": InvalidRequest,
    "unsupported_task": UnsupportedTask,
    "action_failed": ActionFailed,
    "conflict": Conflict,
    "not_quiescent": NotQuiescent,
    "invalid_episode": InvalidEpisode,
    "quarantined": Quarantined,
    "overloaded": Overloaded,
    "state_dir_full": StateDirFull,
    "restore_failed": RestoreFailed,
    "checker_failed": CheckerFailed,
    "setup_failed": SetupFailed,
    "timeout": Timeout,
    "runtime_error": DaemonUnavailable,
    "shutting_down": ShuttingDown,
}

# A newer daemon may send a code this SDK does not know: fall back on the status.
_STATUS_CLASSES: Dict[int, Type[DrumsError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    410: EnvGone,
    422: InvalidRequest,
    423: Quarantined,
    429: Overloaded,
    502: RestoreFailed,
    503: DaemonUnavailable,
    504: Timeout,
    507: StateDirFull,
}


def error_from_response(
    response: httpx.Response, *, env_id: Optional[str], what: str
) -> DrumsError:
    """Turn a non-2xx answer into our exception, keeping the daemon's code, message and detail."""
    code: Optional[str] = None
    message = ""
    detail: Dict[str, Any] = {}
    try:
        body = json.loads(response.content)
        error = body["error"]
        code = str(error["code"])
        message = str(error.get("message") or "")
        detail = dict(error.get("detail") or {})
    except (ValueError, KeyError, TypeError):
        text = response.content[:200].decode("utf-8", "replace")
        message = f"{what} answered HTTP {response.status_code} without an error envelope: {text!r}"
    if not message:
        message = f"{what} failed with {code}"
    if env_id is None and isinstance(detail.get("slot"), str):
        env_id = detail["slot"]
    cls = ERROR_CLASSES.get(code or "") or _STATUS_CLASSES.get(response.status_code)
    if cls is None:
        cls = DaemonUnavailable if response.status_code >= 500 else DrumsError
    return cls(message, code=code, env_id=env_id, status=response.status_code, detail=detail)


@contextmanager
def foreign_errors(*, what: str, env_id: Optional[str], timeout_s: float) -> Iterator[None]:
    """Map httpx, pydantic and timeout errors raised inside the block to DrumsError subclasses.

    This is the only place a foreign error is translated; everything else raises ours directly.
    """
    try:
        yield
    except DrumsError:
        raise
    except (httpx.TimeoutException, TimeoutError) as exc:
        raise Timeout(
            f"{what}: no answer within {timeout_s:g} s; pass a larger timeout or check the daemon "
            "(drumsd logs, GET /v1/health)",
            env_id=env_id,
        ) from exc
    except httpx.TransportError as exc:
        raise ConnectionFailed(
            f"{what}: cannot reach drumsd ({type(exc).__name__}: {exc}); is `drumsd serve` "
            "running, and do DRUMS_URL / url= point at it?",
            env_id=env_id,
        ) from exc
    except httpx.HTTPError as exc:
        raise ConnectionFailed(
            f"{what}: HTTP error {type(exc).__name__}: {exc}", env_id=env_id
        ) from exc
    except pydantic.ValidationError as exc:
        raise InvalidRequest(
            f"{what}: invalid arguments: {_first_errors(exc)}", env_id=env_id
        ) from exc


def bad_response(exc: pydantic.ValidationError, *, what: str, env_id: Optional[str]) -> BadResponse:
    """The daemon's answer does not fit the wire model: usually an SDK/daemon version mismatch."""
    return BadResponse(
        f"{what}: unexpected answer shape ({_first_errors(exc)}); are the SDK and drumsd versions "
        "compatible?",
        env_id=env_id,
    )


def _first_errors(exc: pydantic.ValidationError, limit: int = 3) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc or '(root)'}: {err.get('msg')}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
