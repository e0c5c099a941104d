"""Everything the sync and async clients share, without I/O.

`BaseClient` turns a `Call` into an httpx request, reads answers into models or our exceptions,
decides retries, and remembers which envs and saved states this client owns. `EnvBase` holds what
an env knows about itself. `Client` and `AsyncClient` add only sending, sleeping and closing.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import (
    Any,
    Dict,
    Generic,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
    overload,
)

import httpx
import pydantic

from . import _exit_cleanup
from . import _routes as routes
from . import models as m
from ._config import Secret, Settings, resolve_settings
from ._exceptions import (
    CheckerFailed,
    CleanupFailed,
    ConnectionFailed,
    DrumsError,
    EnvGone,
    InvalidEpisode,
    InvalidRequest,
    NotFound,
    Quarantined,
    Unauthorized,
    bad_response,
    error_from_response,
    foreign_errors,
)
from ._observation import Observation
from ._retry import RetryPolicy, parse_retry_after
from ._routes import Call, Timeouts
from ._session import SESSION_HEADER, SessionBeat, ttl_of

log = logging.getLogger("drums")

T = TypeVar("T")
E = TypeVar("E", bound="EnvBase")
W = TypeVar("W", bound=m.WireModel)

TaskArg = Union[str, "os.PathLike[str]", Mapping[str, Any]]
ActionArg = Union[str, m.Action, Mapping[str, Any]]


def task_ref(task: TaskArg) -> m.TaskRef:
    """A task as the daemon takes it: an inline dict, or an id (or a path on the daemon's host).

    A string naming a file that exists here is read here and sent inline, so local task files work
    against a remote daemon; any other string is sent as is, for the daemon to resolve as an OSWorld
    id (or a path on its own host). A `Path` must exist.
    """
    if isinstance(task, Mapping):
        return dict(task)
    path = Path(task)
    if path.is_file():
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"task file {path} is not readable JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            kind = type(loaded).__name__
            raise InvalidRequest(f"task file {path} holds a {kind}, not an object")
        return loaded
    if isinstance(task, os.PathLike):
        raise InvalidRequest(f"task file {path} does not exist; pass an existing path or a task id")
    return str(task)


def wire(cls: Type[W], **fields: Any) -> W:
    """A request body from the caller's arguments; a bad value is InvalidRequest, not pydantic's
    ValidationError, and fails before anything is sent."""
    with foreign_errors(what=cls.__name__, env_id=None, timeout_s=0):
        return cls(**fields)


ShotArg = Union[bool, m.ScreenshotOptions, Mapping[str, Any]]


def shot_options(
    format: Optional[str] = None,
    quality: Optional[int] = None,
    width: Optional[int] = None,
    height: Optional[int] = None,
) -> m.ScreenshotOptions:
    return wire(m.ScreenshotOptions, format=format, quality=quality, width=width, height=height)


def action_request(
    action: Any,
    screenshot: ShotArg,
    dialect: Optional[str] = None,
    screen: Optional[Tuple[int, int]] = None,
    screenshot_each: bool = False,
) -> m.StepRequest:
    """pyautogui code, an `Action`, or an action dict ({"type": "click", "x": 10, "y": 20}).
    With a `dialect` (drums.dialects.DIALECTS): one vendor call (a dict, or an SDK model with
    `model_dump`) or a list of them, run in order; `screen` (width, height) is the model's.
    `screenshot`: True for a PNG after the step, or options ({"format": "jpeg", "width": 1280})."""
    fields: Dict[str, Any] = {}
    if dialect is not None:
        calls = action if isinstance(action, (list, tuple)) else [action]
        dumped = [c.model_dump(exclude_none=True) if hasattr(c, "model_dump") else c for c in calls]
        fields = {"dialect": dialect, "actions": dumped, "screenshot_each": screenshot_each}
        if screen is not None:
            fields["screen"] = {"width": screen[0], "height": screen[1]}
    else:
        if isinstance(action, Mapping):
            action = wire(m.Action, **action)
        fields = {"action": action}
    if isinstance(screenshot, Mapping):
        screenshot = wire(m.ScreenshotOptions, **screenshot)
    if isinstance(screenshot, m.ScreenshotOptions):
        return wire(m.StepRequest, **fields, screenshot=True, screenshot_options=screenshot)
    return wire(m.StepRequest, **fields, screenshot=screenshot)


class Forked(Sequence[E]):
    """The children of a fork (a sequence of envs), with the state they were restored from."""

    def __init__(self, children: List[E], state: m.Checkpoint, elapsed_s: float) -> None:
        self.children = children
        self.state = state
        self.elapsed_s = elapsed_s

    @overload
    def __getitem__(self, index: int) -> E: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[E]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[E, Sequence[E]]:
        return self.children[index]

    def __len__(self) -> int:
        return len(self.children)

    def __iter__(self) -> Iterator[E]:
        return iter(self.children)

    def __repr__(self) -> str:
        ids = ", ".join(c.id for c in self.children)
        return f"Forked([{ids}], state={self.state.id!r})"


class BaseClient(Generic[E]):
    """Request building, answer reading, retry decisions and ownership; no I/O."""

    _http: Union[httpx.Client, httpx.AsyncClient]

    def __init__(
        self,
        url: Optional[str],
        token: Union[str, Secret, None],
        token_file: Union[str, "os.PathLike[str]", None],
        timeouts: Union[float, Timeouts],
        retry: RetryPolicy,
    ) -> None:
        self._settings: Settings = resolve_settings(url, token, token_file)
        self.timeouts = timeouts if isinstance(timeouts, Timeouts) else Timeouts(default_s=timeouts)
        self.retry = retry
        # What this client created and must remove when it closes: env id -> env, state id -> state.
        self._owned_envs: Dict[str, E] = {}
        self._owned_states: Dict[str, m.Checkpoint] = {}
        self._closed = False
        # Names this client to a pool gateway, which frees its envs once it stops hearing from
        # it (`_session.py`); a drumsd ignores it.
        self._session = secrets.token_hex(8)
        self._beat: Optional[SessionBeat] = None
        # Whatever it still owns at interpreter exit or SIGTERM is destroyed then (no `with`).
        _exit_cleanup.track(self)

    @property
    def url(self) -> str:
        return self._settings.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, envs={len(self._owned_envs)})"

    # --- requests and answers -----------------------------------------------------------------

    def _build(self, call: Call[Any]) -> httpx.Request:
        if self._closed:
            raise ConnectionFailed(
                f"{call.what}: this client is closed; open a new one with drums.connect()",
                env_id=call.env_id,
            )
        headers = {"Accept": "application/json", SESSION_HEADER: self._session}
        token = self._settings.token
        if call.auth and token is not None:
            headers["Authorization"] = f"Bearer {token.reveal()}"
        timeout = httpx.Timeout(call.timeout_s, connect=min(call.timeout_s, 10.0))
        return self._http.build_request(
            call.method,
            call.path,
            json=call.json,
            params=call.params,
            headers=headers,
            timeout=timeout,
        )

    def _retry_delay(
        self, call: Call[Any], response: httpx.Response, attempt: int
    ) -> Optional[float]:
        """Seconds to wait before sending `call` again, or None to take this answer as final."""
        if response.status_code != 429:
            return None
        delay = self.retry.next_delay_s(attempt, response.headers.get("Retry-After"))
        if delay is not None:
            log.warning(
                "drumsd is overloaded; retrying %s in %.2f s (retry %d of %d)",
                call.what,
                delay,
                attempt + 1,
                self.retry.max_retries,
                extra={"env_id": call.env_id},
            )
        return delay

    def _finish(self, call: Call[T], response: httpx.Response, attempts: int) -> T:
        log.debug("%s -> %d", call.what, response.status_code, extra={"env_id": call.env_id})
        if self._beat is None:
            ttl = ttl_of(response.headers)
            if ttl is not None:
                self._beat = SessionBeat(self, self._session, ttl)
        if response.is_success:
            try:
                return call.parse(response)
            except pydantic.ValidationError as exc:
                raise bad_response(exc, what=call.what, env_id=call.env_id) from exc
        error = error_from_response(response, env_id=call.env_id, what=call.what)
        if isinstance(error, Unauthorized) and call.auth:
            error.message += (
                f"; token source: {self._settings.token_source}. Pass token=, set DRUMS_TOKEN, "
                "or point DRUMS_TOKEN_FILE at the daemon's token_file"
            )
        if response.status_code == 429:
            retry_after = response.headers.get("Retry-After")
            error.detail.setdefault("retry_after_s", parse_retry_after(retry_after))
            error.message += f" (gave up after {attempts} attempt(s); Retry-After: {retry_after})"
        raise error

    # --- ownership ----------------------------------------------------------------------------

    def _adopt_env(self, env: E) -> E:
        self._owned_envs[env.id] = env
        log.info("env %s created (episode %d)", env.id, env.slot.episode, extra={"env_id": env.id})
        return env

    def _forget_env(self, env_id: str) -> None:
        self._owned_envs.pop(env_id, None)

    def _adopt_state(self, state: m.Checkpoint) -> m.Checkpoint:
        self._owned_states[state.id] = state
        return state

    def _forget_state(self, state_id: str) -> None:
        self._owned_states.pop(state_id, None)

    @staticmethod
    def _leak_error(failures: Dict[str, DrumsError], kind: str) -> CleanupFailed:
        """kind: "env(s)" or "saved state(s)"."""
        ids = ", ".join(sorted(failures))
        first = next(iter(failures.values()))
        route = "/v1/slots/<id>" if kind.startswith("env") else "/v1/checkpoints/<id>"
        return CleanupFailed(
            f"could not remove {kind} {ids} ({first}); the daemon's lease reaper removes them "
            f"after their idle timeout, or remove them by hand (DELETE {route})",
            detail={"ids": sorted(failures)},
        )


def is_already_gone(error: DrumsError) -> bool:
    """A destroy or delete that finds nothing has nothing left to do."""
    return isinstance(error, (EnvGone, NotFound))


def gate_verdict(report: m.GateReport, env_id: str) -> Optional[m.GateReport]:
    """The report when every gate passed, None while some are pending; a failed gate raises."""
    failed = list(report.failed) or [
        g.name for g in report.gates if g.status == m.GateStatus.failed
    ]
    if failed or report.valid is False:
        evidence = {g.name: g.evidence for g in report.gates if g.name in failed}
        cls = Quarantined if "not_quarantined" in failed else InvalidEpisode
        raise cls(
            f"gate(s) failed: {', '.join(failed) or '?'}; the episode is invalid and the env is "
            "quarantined: close it, or release() then reset() it",
            env_id=env_id,
            detail={"failed_gates": failed, "verdict": "invalid", "evidence": evidence},
        )
    if report.valid is True:
        return report
    return None


def validity(report: m.GateReport) -> Dict[str, Any]:
    """The episode's gate verdict as the drop-ins report it (DesktopEnv.step's info, the MCP
    action tools): valid is True once every gate passed, False when one failed (the episode
    must not be trained on, even while others pend), None while some are still pending."""
    failed = list(report.failed) or [
        g.name for g in report.gates if g.status is m.GateStatus.failed
    ]
    valid = False if failed else report.valid
    return {
        "env_id": report.slot,
        "episode": report.episode,
        "valid": valid,
        "verdict": {True: "valid", False: "invalid", None: "pending"}[valid],
        "failed_gates": failed,
        "pending_gates": [g.name for g in report.gates if g.status is m.GateStatus.pending],
    }


def verify_outcome(result: m.VerifyResult, strict: bool) -> m.VerifyResult:
    """With strict, an invalid episode or a missing score raises instead of returning."""
    if not strict:
        return result
    if not result.valid:
        reasons = ", ".join(result.invalid_reasons or result.failed_gates) or result.verdict
        if result.verdict == "pending":
            reasons += "; the gates are not judged yet: wait_valid() first"
        raise InvalidEpisode(
            f"episode {result.episode} is invalid ({reasons}): no reward; do not train on it",
            env_id=result.slot,
            detail=result.model_dump(mode="json"),
        )
    if result.score is None:
        raise CheckerFailed(
            f"the checker gave no score ({result.checker_error or 'no error recorded'}): no reward",
            env_id=result.slot,
            detail=result.model_dump(mode="json"),
        )
    return result


class EnvBase:
    """What an env knows about itself; the I/O lives in `Env` and `AsyncEnv`."""

    def __init__(self, slot: m.Slot, owned: bool, instruction: Optional[str] = None) -> None:
        self.slot = slot
        self.owned = owned  # created by this client, so destroyed when the client closes
        self.closed = False
        self.actions = 0
        self._instruction = instruction

    @property
    def id(self) -> str:
        return self.slot.id

    @property
    def episode(self) -> int:
        return self.slot.episode

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.slot.state.value
        return f"{type(self).__name__}(id={self.id!r}, episode={self.episode}, state={state})"

    def _update(self, slot: m.Slot) -> m.Slot:
        if slot.episode != self.slot.episode:
            self.actions = 0
        self.slot = slot
        return slot

    def _needs_instruction(self) -> bool:
        return self._instruction is None and self.slot.task_id is not None

    def _observation(self, png: bytes, content_type: str = "image/png") -> Observation:
        return Observation(
            png=png,
            content_type=content_type,
            meta={
                "env_id": self.id,
                "episode": self.slot.episode,
                "episode_id": self.slot.episode_id,
                "task_id": self.slot.task_id,
                "instruction": self._instruction or "",
                "actions": self.actions,
            },
        )


def instruction_of(task: m.TaskRef) -> Optional[str]:
    if isinstance(task, dict):
        return str(task.get("instruction") or "")
    return None


__all__ = [
    "ActionArg",
    "BaseClient",
    "EnvBase",
    "Forked",
    "TaskArg",
    "Timeouts",
    "action_request",
    "gate_verdict",
    "instruction_of",
    "is_already_gone",
    "routes",
    "task_ref",
    "verify_outcome",
]
