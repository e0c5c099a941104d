"""The synchronous client: `connect()`, `Client` and `Env`.

Everything but sending, sleeping and closing is in `_base`. Cleanup on exit runs with SIGINT
held (the sync form of a shielded cancel scope), bounded by `Timeouts.cleanup_s`, so a Ctrl-C
during an episode still destroys every env the client created.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Dict, Iterator, List, Optional, Tuple, Type, TypeVar, Union

import httpx

from . import _routes as routes
from . import models as m
from ._base import (
    BaseClient,
    EnvBase,
    Forked,
    ShotArg,
    TaskArg,
    action_request,
    gate_verdict,
    instruction_of,
    is_already_gone,
    shot_options,
    task_ref,
    verify_outcome,
    wire,
)
from ._config import Secret
from ._exceptions import DrumsError, NotFound, Timeout, foreign_errors
from ._observation import Observation
from ._retry import RetryPolicy
from ._routes import Call, StateRef, Timeouts
from ._shield import sigint_held

log = logging.getLogger("drums")
T = TypeVar("T")


class Client(BaseClient["Env"]):
    """A connection to drumsd. Use it as a context manager: on exit it destroys every env it
    created and every state it saved with keep=False, even on Ctrl-C."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Union[str, Secret, None] = None,
        *,
        token_file: Union[str, "os.PathLike[str]", None] = None,
        timeout: Union[float, Timeouts] = Timeouts(),
        retry: RetryPolicy = RetryPolicy(),
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        super().__init__(url, token, token_file, timeout, retry)
        self._http: httpx.Client = httpx.Client(base_url=self.url, transport=transport)

    # --- I/O ----------------------------------------------------------------------------------

    def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            request = self._build(call)
            with foreign_errors(what=call.what, env_id=call.env_id, timeout_s=call.timeout_s):
                response = self._http.send(request)
            delay = self._retry_delay(call, response, attempt)
            if delay is None:
                return self._finish(call, response, attempt + 1)
            time.sleep(delay)
            attempt += 1

    # --- daemon -------------------------------------------------------------------------------

    def ping(self) -> bool:
        """True when the daemon answers /healthz (no token needed)."""
        self._send(routes.healthz(self.timeouts))
        return True

    def health(self) -> m.Health:
        return self._send(routes.health(self.timeouts))

    def metrics(self) -> m.Metrics:
        return self._send(routes.metrics(self.timeouts))

    def reset_metrics(self) -> m.Metrics:
        """Start a new metrics window; returns the window that just ended."""
        return self._send(routes.reset_metrics(self.timeouts))

    def tasks(self) -> List[m.TaskInfo]:
        return self._send(routes.list_tasks(self.timeouts))

    def task(self, task_id: str) -> m.TaskInfo:
        return self._send(routes.get_task(task_id, self.timeouts))

    # --- saved states -------------------------------------------------------------------------

    def list_states(self) -> List[m.Checkpoint]:
        """Every checkpoint the daemon holds (templates, saved states, prefork states)."""
        return self._send(routes.list_checkpoints(self.timeouts))

    def get_state(self, state: StateRef) -> m.Checkpoint:
        return self._send(routes.get_checkpoint(routes.state_id(state), self.timeouts))

    def delete_state(self, state: StateRef) -> None:
        sid = routes.state_id(state)
        self._send(routes.delete_checkpoint(sid, self.timeouts.default_s))
        self._forget_state(sid)

    # --- envs ---------------------------------------------------------------------------------

    def create(
        self,
        task: Optional[TaskArg] = None,
        *,
        image: Optional[str] = None,
        from_state: Optional[StateRef] = None,
        idle_timeout_s: Optional[float] = None,
        ttl_s: Optional[float] = None,
        labels: Optional[Dict[str, str]] = None,
    ) -> Env:
        """A new env, owned by this client. `task` is an OSWorld id, a JSON file or a dict."""
        body = wire(
            m.SlotCreate,
            image=image,
            from_state=routes.state_id(from_state) if from_state is not None else None,
            task=task_ref(task) if task is not None else None,
            idle_timeout_s=idle_timeout_s,
            ttl_s=ttl_s,
            labels=labels or {},
        )
        slot = self._send(routes.create_slot(body, self.timeouts))
        instruction = instruction_of(body.task) if body.task is not None else None
        return self._adopt_env(Env(self, slot, owned=True, instruction=instruction))

    def attach(self, env_id: str) -> Env:
        """An existing env by id. Not owned: closing this client leaves it alone."""
        return Env(self, self._send(routes.get_slot(env_id, self.timeouts)), owned=False)

    def list_envs(self, include_destroyed: bool = False) -> List[m.Slot]:
        return self._send(routes.list_slots(include_destroyed, self.timeouts))

    # --- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Destroy owned envs and states, then close the connection. Raises CleanupFailed if
        something could not be removed (after trying everything)."""
        self._close(raise_leaks=True)

    def _close(self, raise_leaks: bool) -> None:
        try:
            with sigint_held():
                deadline = time.monotonic() + self.timeouts.cleanup_s
                env_failures = {}
                for env in list(self._owned_envs.values()):
                    error = env._destroy(deadline)
                    if error is not None:
                        env_failures[env.id] = error
                state_failures = self._delete_states(list(self._owned_states), deadline)
        finally:
            self._http.close()
            self._closed = True
        if env_failures and raise_leaks:
            raise self._leak_error(env_failures, "env(s)")
        if state_failures and raise_leaks:
            raise self._leak_error(state_failures, "saved state(s)")

    def _delete_states(self, state_ids: List[str], deadline: float) -> Dict[str, DrumsError]:
        failures: Dict[str, DrumsError] = {}
        for sid in state_ids:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise Timeout("cleanup deadline passed before this state was deleted")
                timeout = min(self.timeouts.default_s, remaining)
                self._send(routes.delete_checkpoint(sid, timeout))
            except DrumsError as error:
                if not is_already_gone(error):
                    log.warning("could not delete saved state %s: %s", sid, error)
                    failures[sid] = error
                    continue
            self._forget_state(sid)
        return failures

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._close(raise_leaks=exc is None)


class Env(EnvBase):
    """One desktop. A context manager that destroys it on exit."""

    def __init__(
        self, client: Client, slot: m.Slot, owned: bool, instruction: Optional[str] = None
    ) -> None:
        super().__init__(slot, owned, instruction)
        self._client = client

    def _send(self, call: Call[T]) -> T:
        return self._client._send(call)

    @property
    def _t(self) -> Timeouts:
        return self._client.timeouts

    def refresh(self) -> m.Slot:
        return self._update(self._send(routes.get_slot(self.id, self._t)))

    def wait_valid(self, timeout: float = 60.0) -> m.GateReport:
        """Wait until every gate of the episode passed. A failed gate raises InvalidEpisode;
        gates still pending after `timeout` seconds raise Timeout."""
        deadline = time.monotonic() + timeout
        pause = 0.05
        while True:
            report = gate_verdict(self.gates(), self.id)
            if report is not None:
                return report
            if time.monotonic() + pause > deadline:
                raise Timeout(
                    f"gates still pending after {timeout:g} s; pass a larger timeout or read "
                    "env.gates() for the pending ones",
                    env_id=self.id,
                )
            time.sleep(pause)
            pause = min(pause * 1.5, 1.0)

    def gates(self) -> m.GateReport:
        return self._send(routes.gates(self.id, self._t))

    def terminal(self) -> m.TerminalOutput:
        """The desktop's terminal text (its xterm's scrollback and screen); not an action."""
        return self._send(routes.terminal(self.id, self._t))

    def accessibility_tree(self) -> m.AccessibilityTree:
        """The desktop's accessibility tree in OSWorld's XML (AT-SPI); not an action."""
        return self._send(routes.accessibility_tree(self.id, self._t))

    def observe(
        self,
        *,
        format: Optional[str] = None,
        quality: Optional[int] = None,
        width: Optional[int] = None,
        height: Optional[int] = None,
    ) -> Observation:
        """The screenshot now, with the episode's metadata (instruction and more). By default a
        full-size PNG; `format` jpeg or webp (with a `quality`, 1..100) and a `width` and/or
        `height` have the daemon encode a smaller image (once, in the desktop)."""
        if self._needs_instruction():
            try:
                self._instruction = self._client.task(self.slot.task_id or "").instruction
            except NotFound:  # an inline task the daemon does not list by id
                self._instruction = ""
        if format is None and quality is None and width is None and height is None:
            png = self._send(routes.screenshot(self.id, self._t))
            return self._observation(png)
        options = shot_options(format, quality, width, height)
        data, content_type = self._send(routes.screenshot_as(self.id, options, self._t))
        return self._observation(data, content_type)

    def step(
        self,
        action: Any,
        *,
        screenshot: ShotArg = False,
        dialect: Optional[str] = None,
        screen: Optional[Tuple[int, int]] = None,
        screenshot_each: bool = False,
    ) -> m.StepResult:
        """Run pyautogui code (a str) or an action dict/`Action`. With screenshot=True the result
        carries the PNG after the step (base64 in `screenshot_png_b64`); options such as
        {"format": "jpeg", "quality": 70, "width": 1280} give that image instead (base64 in
        `screenshot_b64`); `result.screenshot_bytes()` decodes either.

        With `dialect` ("anthropic-2026-08", "openai", ...; see drums.dialects) `action` is one
        of that vendor's computer-tool calls or a list of them, run in order in one request;
        `screen` is the model's (width, height): its coordinates are scaled to the desktop and
        screenshots and cursor positions back. Per-call results (cursor, zoom images) are in
        `result.results`; `screenshot_each` gives every call its screenshot."""
        request = action_request(action, screenshot, dialect, screen, screenshot_each)
        result = self._send(routes.step(self.id, request, self._t))
        self.actions = result.actions
        return result

    def reset(self) -> m.Slot:
        """A new episode: the env is restored to its checkpoint (gates start again)."""
        return self._update(self._send(routes.reset_slot(self.id, self._t)))

    def load_task(self, task: TaskArg) -> m.TaskInfo:
        ref = task_ref(task)
        loaded = self._send(routes.load_task(self.id, wire(m.TaskLoad, task=ref), self._t))
        self._instruction = loaded.task.instruction
        self.slot = self.slot.model_copy(update={"task_id": loaded.task.id})
        return loaded.task

    def wait_quiescent(
        self, timeout: Optional[float] = None, window_s: Optional[float] = None
    ) -> m.QuiescentResult:
        """Wait until the desktop's processes are idle (NotQuiescent if they never settle)."""
        body = wire(m.QuiescentRequest, timeout_s=timeout, window_s=window_s)
        return self._send(routes.quiescent(self.id, body, self._t))

    def save(
        self,
        *,
        keep: bool = True,
        idle_timeout_s: Optional[float] = None,
        ttl_s: Optional[float] = None,
    ) -> m.Checkpoint:
        """Save the running desktop as a state that `create(from_state=...)` restores.

        The state lives until its lease on the daemon runs out (`idle_timeout_s` unused, the
        daemon's lease.state_idle_timeout_s by default, 30 min; a restore or fork from it renews
        it; `ttl_s` after it was made) or delete_state(), whether or not this client is still
        open. keep=False ties it to this client instead: deleted when the client closes.
        """
        body = wire(m.CaptureRequest, idle_timeout_s=idle_timeout_s, ttl_s=ttl_s)
        state = self._send(routes.capture(self.id, body, self._t))
        if not keep:
            self._client._adopt_state(state)
        return state

    @contextmanager
    def fork(
        self,
        n: int,
        *,
        keep_state: bool = False,
        idle_timeout_s: Optional[float] = None,
        ttl_s: Optional[float] = None,
    ) -> Iterator[Forked[Env]]:
        """`with env.fork(4) as children:` N copies of this desktop as it is now.

        On exit the children are destroyed, and the prefork state too unless keep_state=True
        (then it lives until the client closes: `children.state` can seed `create(from_state=)`).
        With keep_state=False the state is marked for deletion as soon as the children are up:
        no new slot can start from it, and the daemon deletes it when the last child is
        destroyed, even if this process dies first.
        """
        request = wire(m.ForkRequest, n=n, idle_timeout_s=idle_timeout_s, ttl_s=ttl_s)
        prefork = wire(m.PreforkRequest, idle_timeout_s=idle_timeout_s)
        state = self._send(routes.prefork(self.id, prefork, self._t))
        # The daemon reuses a young prefork of the same state: one an earlier fork kept stays.
        kept_before = state.id in self._client._owned_states
        self._client._adopt_state(state)
        children: List[Env] = []
        try:
            request = request.model_copy(update={"prefork": state.id})
            result = self._send(routes.fork(self.id, request, self._t))
            children = [
                self._client._adopt_env(
                    Env(self._client, s, owned=True, instruction=self._instruction)
                )
                for s in result.children
            ]
            if not (keep_state or kept_before):
                try:
                    self._send(routes.delete_checkpoint(state.id, self._t.default_s, True))
                except DrumsError as error:  # the exit below deletes it all the same
                    log.warning("could not mark state %s for deletion: %s", state.id, error)
            yield Forked(children, state, result.elapsed_s)
        finally:
            with sigint_held():
                deadline = time.monotonic() + self._t.cleanup_s
                for child in children:
                    child._destroy(deadline)
                if not (keep_state or kept_before):
                    self._client._delete_states([state.id], deadline)

    def verify(
        self, *, strict: bool = True, timeout: Optional[float] = None, gates_timeout: float = 60.0
    ) -> m.VerifyResult:
        """Run the task's checker (`timeout` bounds one checker run on the daemon).

        strict=True first waits for the episode's gates (up to `gates_timeout`), then raises
        InvalidEpisode for an invalid episode and CheckerFailed for a missing score: what
        returns is a reward you may train on. strict=False returns whatever the daemon says.
        """
        if strict:
            self.wait_valid(timeout=gates_timeout)
        result = self._send(
            routes.verify(self.id, wire(m.VerifyRequest, timeout_s=timeout), self._t)
        )
        return verify_outcome(result, strict)

    def metrics(self) -> m.SlotMetrics:
        return self._send(routes.slot_metrics(self.id, self._t))

    def quarantine(self, reason: str) -> m.Slot:
        body = wire(m.QuarantineRequest, reason=reason)
        return self._update(self._send(routes.quarantine(self.id, body, self._t)))

    def release(self) -> m.Slot:
        return self._update(self._send(routes.release(self.id, self._t)))

    def close(self) -> None:
        """Destroy the env (idempotent: closing a gone env is fine)."""
        error = self._destroy(time.monotonic() + self._t.cleanup_s)
        if error is not None:
            raise error

    def _destroy(self, deadline: float) -> Optional[DrumsError]:
        """Destroy within `deadline` (time.monotonic); returns the error instead of raising."""
        if self.closed:
            return None
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise Timeout(
                    "cleanup deadline passed before this env was destroyed", env_id=self.id
                )
            self._send(routes.destroy_slot(self.id, min(self._t.default_s, remaining)))
        except DrumsError as error:
            if not is_already_gone(error):
                log.warning(
                    "could not destroy env %s: %s", self.id, error, extra={"env_id": self.id}
                )
                return error
        self.closed = True
        self._client._forget_env(self.id)
        log.info("env %s destroyed", self.id, extra={"env_id": self.id})
        return None

    def __enter__(self) -> Env:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        with sigint_held():
            error = self._destroy(time.monotonic() + self._t.cleanup_s)
        if error is not None and exc is None:
            raise error


def connect(
    url: Optional[str] = None,
    token: Union[str, Secret, None] = None,
    **kwargs: Any,
) -> Client:
    """`with drums.connect() as client:` (DRUMS_URL, DRUMS_TOKEN, DRUMS_TOKEN_FILE by default)."""
    return Client(url, token, **kwargs)
