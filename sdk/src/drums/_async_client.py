"""The async client: `aconnect()`, `AsyncClient` and `AsyncEnv`, for asyncio and trio alike.

It mirrors `_client` call for call; httpx's async side runs on anyio, so one code path serves both
event loops. Every call runs under `anyio.fail_after`, and cleanup runs in a shielded scope with
its own deadline, so neither a wedged daemon nor a cancelled task leaks an env.
"""

from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager
from types import TracebackType
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Generator,
    List,
    Optional,
    Tuple,
    Type,
    TypeVar,
    Union,
)

import anyio
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
from ._shield import shielded

log = logging.getLogger("drums")
T = TypeVar("T")


class AsyncClient(BaseClient["AsyncEnv"]):
    """`async with drums.aconnect() as client:`; on exit every env it created is destroyed (and
    every state it saved with keep=False deleted), in a shielded scope, even when cancelled."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Union[str, Secret, None] = None,
        *,
        token_file: Union[str, "os.PathLike[str]", None] = None,
        timeout: Union[float, Timeouts] = Timeouts(),
        retry: RetryPolicy = RetryPolicy(),
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        super().__init__(url, token, token_file, timeout, retry)
        self._http: httpx.AsyncClient = httpx.AsyncClient(base_url=self.url, transport=transport)

    # --- I/O ----------------------------------------------------------------------------------

    async def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            request = self._build(call)
            with foreign_errors(what=call.what, env_id=call.env_id, timeout_s=call.timeout_s):
                # httpx's timeouts bound each network read; this bounds the whole call.
                with anyio.fail_after(call.timeout_s):
                    response = await self._http.send(request)
            delay = self._retry_delay(call, response, attempt)
            if delay is None:
                return self._finish(call, response, attempt + 1)
            await anyio.sleep(delay)
            attempt += 1

    async def _send_making(self, call: Call[T]) -> T:
        """A call that makes something on the daemon (an env, a state), shielded from the
        caller's cancellation (bounded by the call's own timeout): its answer must arrive so what
        it made is owned, and so destroyed on close. Cancelled mid-request, it leaked the env."""
        with anyio.CancelScope(shield=True):
            made = await self._send(call)
        return made  # outside the scope: mypy cannot tell a shield-only scope never swallows

    # --- daemon -------------------------------------------------------------------------------

    async def ping(self) -> bool:
        await self._send(routes.healthz(self.timeouts))
        return True

    async def health(self) -> m.Health:
        return await self._send(routes.health(self.timeouts))

    async def metrics(self) -> m.Metrics:
        return await self._send(routes.metrics(self.timeouts))

    async def reset_metrics(self) -> m.Metrics:
        return await self._send(routes.reset_metrics(self.timeouts))

    async def tasks(self) -> List[m.TaskInfo]:
        return await self._send(routes.list_tasks(self.timeouts))

    async def task(self, task_id: str) -> m.TaskInfo:
        return await self._send(routes.get_task(task_id, self.timeouts))

    # --- saved states -------------------------------------------------------------------------

    async def list_states(self) -> List[m.Checkpoint]:
        return await self._send(routes.list_checkpoints(self.timeouts))

    async def get_state(self, state: StateRef) -> m.Checkpoint:
        return await self._send(routes.get_checkpoint(routes.state_id(state), self.timeouts))

    async def delete_state(self, state: StateRef) -> None:
        sid = routes.state_id(state)
        await self._send(routes.delete_checkpoint(sid, self.timeouts.default_s))
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
    ) -> _EnvOpener:
        """`env = await client.create(...)` or `async with client.create(...) as env:`."""

        async def open_env() -> AsyncEnv:
            body = wire(
                m.SlotCreate,
                image=image,
                from_state=routes.state_id(from_state) if from_state is not None else None,
                task=task_ref(task) if task is not None else None,
                idle_timeout_s=idle_timeout_s,
                ttl_s=ttl_s,
                labels=labels or {},
            )
            slot = await self._send_making(routes.create_slot(body, self.timeouts))
            instruction = instruction_of(body.task) if body.task is not None else None
            return self._adopt_env(AsyncEnv(self, slot, owned=True, instruction=instruction))

        return _EnvOpener(open_env)

    def attach(self, env_id: str) -> _EnvOpener:
        """An existing env by id; not owned, so closing this client leaves it alone."""

        async def open_env() -> AsyncEnv:
            slot = await self._send(routes.get_slot(env_id, self.timeouts))
            return AsyncEnv(self, slot, owned=False)

        return _EnvOpener(open_env)

    async def list_envs(self, include_destroyed: bool = False) -> List[m.Slot]:
        return await self._send(routes.list_slots(include_destroyed, self.timeouts))

    # --- closing ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Destroy owned envs and states, then close the connection (CleanupFailed on leaks)."""
        await self._aclose(raise_leaks=True)

    async def _aclose(self, raise_leaks: bool) -> None:
        env_failures: Dict[str, DrumsError] = {}
        state_failures: Dict[str, DrumsError] = {}
        try:
            with shielded(self.timeouts.cleanup_s):
                env_failures = await _destroy_all(list(self._owned_envs.values()))
                state_failures = await self._delete_states(list(self._owned_states))
        finally:
            with anyio.CancelScope(shield=True):
                await self._http.aclose()
            self._closed = True
        for env_id in self._owned_envs:  # the cleanup deadline cut the loop short
            env_failures.setdefault(env_id, Timeout("cleanup deadline passed", env_id=env_id))
        if env_failures and raise_leaks:
            raise self._leak_error(env_failures, "env(s)")
        if state_failures and raise_leaks:
            raise self._leak_error(state_failures, "saved state(s)")

    async def _delete_states(self, state_ids: List[str]) -> Dict[str, DrumsError]:
        """Call inside a shielded scope; failures are returned, not raised."""
        failures: Dict[str, DrumsError] = {}
        for sid in state_ids:
            try:
                await self._send(routes.delete_checkpoint(sid, self.timeouts.default_s))
            except DrumsError as error:
                if not is_already_gone(error):
                    log.warning("could not delete saved state %s: %s", sid, error)
                    failures[sid] = error
                    continue
            self._forget_state(sid)
        return failures

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self._aclose(raise_leaks=exc is None)


class _EnvOpener:
    """Both awaitable (gives the env) and an async context manager (destroys it on exit)."""

    def __init__(self, open_env: Callable[[], Awaitable[AsyncEnv]]) -> None:
        self._open = open_env
        self._env: Optional[AsyncEnv] = None

    def __await__(self) -> Generator[Any, None, AsyncEnv]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncEnv:
        self._env = await self._open()
        return self._env

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        assert self._env is not None
        await self._env.__aexit__(exc_type, exc, tb)


class AsyncEnv(EnvBase):
    """One desktop, async. `async with` destroys it on exit."""

    def __init__(
        self, client: AsyncClient, slot: m.Slot, owned: bool, instruction: Optional[str] = None
    ) -> None:
        super().__init__(slot, owned, instruction)
        self._client = client

    async def _send(self, call: Call[T]) -> T:
        return await self._client._send(call)

    async def _send_making(self, call: Call[T]) -> T:
        return await self._client._send_making(call)

    @property
    def _t(self) -> Timeouts:
        return self._client.timeouts

    async def refresh(self) -> m.Slot:
        return self._update(await self._send(routes.get_slot(self.id, self._t)))

    async def wait_valid(self, timeout: float = 60.0) -> m.GateReport:
        """Wait until every gate passed; InvalidEpisode on a failed gate, Timeout if pending."""
        pause = 0.05
        try:
            with anyio.fail_after(timeout):
                while True:
                    report = gate_verdict(await self.gates(), self.id)
                    if report is not None:
                        return report
                    await anyio.sleep(pause)
                    pause = min(pause * 1.5, 1.0)
        except TimeoutError:
            raise Timeout(
                f"gates still pending after {timeout:g} s; pass a larger timeout or read "
                "env.gates() for the pending ones",
                env_id=self.id,
            ) from None

    async def gates(self) -> m.GateReport:
        return await self._send(routes.gates(self.id, self._t))

    async def terminal(self) -> m.TerminalOutput:
        """The desktop's terminal text (its xterm's scrollback and screen); not an action."""
        return await self._send(routes.terminal(self.id, self._t))

    async def accessibility_tree(self) -> m.AccessibilityTree:
        """The desktop's accessibility tree in OSWorld's XML (AT-SPI); not an action."""
        return await self._send(routes.accessibility_tree(self.id, self._t))

    async def observe(
        self,
        *,
        format: Optional[str] = None,
        quality: Optional[int] = None,
        width: Optional[int] = None,
        height: Optional[int] = None,
    ) -> Observation:
        if self._needs_instruction():
            try:
                self._instruction = (await self._client.task(self.slot.task_id or "")).instruction
            except NotFound:  # an inline task the daemon does not list by id
                self._instruction = ""
        if format is None and quality is None and width is None and height is None:
            png = await self._send(routes.screenshot(self.id, self._t))
            return self._observation(png)
        options = shot_options(format, quality, width, height)
        data, content_type = await self._send(routes.screenshot_as(self.id, options, self._t))
        return self._observation(data, content_type)

    async def step(
        self,
        action: Any,
        *,
        screenshot: ShotArg = False,
        dialect: Optional[str] = None,
        screen: Optional[Tuple[int, int]] = None,
        screenshot_each: bool = False,
    ) -> m.StepResult:
        """As `Env.step`."""
        request = action_request(action, screenshot, dialect, screen, screenshot_each)
        result = await self._send(routes.step(self.id, request, self._t))
        self.actions = result.actions
        return result

    async def reset(self) -> m.Slot:
        return self._update(await self._send(routes.reset_slot(self.id, self._t)))

    async def load_task(self, task: TaskArg) -> m.TaskInfo:
        ref = task_ref(task)
        loaded = await self._send(routes.load_task(self.id, wire(m.TaskLoad, task=ref), self._t))
        self._instruction = loaded.task.instruction
        self.slot = self.slot.model_copy(update={"task_id": loaded.task.id})
        return loaded.task

    async def wait_quiescent(
        self, timeout: Optional[float] = None, window_s: Optional[float] = None
    ) -> m.QuiescentResult:
        body = wire(m.QuiescentRequest, timeout_s=timeout, window_s=window_s)
        return await self._send(routes.quiescent(self.id, body, self._t))

    async def save(
        self,
        *,
        keep: bool = True,
        idle_timeout_s: Optional[float] = None,
        ttl_s: Optional[float] = None,
    ) -> m.Checkpoint:
        """Save the desktop as a state; it lives until its lease on the daemon runs out (or
        delete_state()), or, with keep=False, until this client closes (see `Env.save`)."""
        body = wire(m.CaptureRequest, idle_timeout_s=idle_timeout_s, ttl_s=ttl_s)
        state = await self._send_making(routes.capture(self.id, body, self._t))
        if not keep:
            self._client._adopt_state(state)
        return state

    @asynccontextmanager
    async def fork(
        self,
        n: int,
        *,
        keep_state: bool = False,
        idle_timeout_s: Optional[float] = None,
        ttl_s: Optional[float] = None,
    ) -> AsyncIterator[Forked[AsyncEnv]]:
        """`async with env.fork(4) as children:`; children destroyed on exit, and the prefork
        state too unless keep_state=True (then it lives until the client closes). With
        keep_state=False the state is marked for deletion as soon as the children are up: no
        new slot can start from it, and the daemon deletes it when the last child is destroyed,
        even if this process dies first."""
        request = wire(m.ForkRequest, n=n, idle_timeout_s=idle_timeout_s, ttl_s=ttl_s)
        prefork = wire(m.PreforkRequest, idle_timeout_s=idle_timeout_s)
        state = await self._send_making(routes.prefork(self.id, prefork, self._t))
        # The daemon reuses a young prefork of the same state: one an earlier fork kept stays.
        kept_before = state.id in self._client._owned_states
        self._client._adopt_state(state)
        children: List[AsyncEnv] = []
        try:
            request = request.model_copy(update={"prefork": state.id})
            result = await self._send_making(routes.fork(self.id, request, self._t))
            children = [
                self._client._adopt_env(
                    AsyncEnv(self._client, s, owned=True, instruction=self._instruction)
                )
                for s in result.children
            ]
            if not (keep_state or kept_before):
                try:
                    await self._send(routes.delete_checkpoint(state.id, self._t.default_s, True))
                except DrumsError as error:  # the exit below deletes it all the same
                    log.warning("could not mark state %s for deletion: %s", state.id, error)
            yield Forked(children, state, result.elapsed_s)
        finally:
            with shielded(self._t.cleanup_s):
                await _destroy_all(children)
                if not (keep_state or kept_before):
                    await self._client._delete_states([state.id])

    async def verify(
        self, *, strict: bool = True, timeout: Optional[float] = None, gates_timeout: float = 60.0
    ) -> m.VerifyResult:
        """Run the checker. strict=True waits for the gates first, then raises InvalidEpisode /
        CheckerFailed instead of returning something that is not a trainable reward."""
        if strict:
            await self.wait_valid(timeout=gates_timeout)
        result = await self._send(
            routes.verify(self.id, wire(m.VerifyRequest, timeout_s=timeout), self._t)
        )
        return verify_outcome(result, strict)

    async def metrics(self) -> m.SlotMetrics:
        return await self._send(routes.slot_metrics(self.id, self._t))

    async def quarantine(self, reason: str) -> m.Slot:
        body = wire(m.QuarantineRequest, reason=reason)
        return self._update(await self._send(routes.quarantine(self.id, body, self._t)))

    async def release(self) -> m.Slot:
        return self._update(await self._send(routes.release(self.id, self._t)))

    async def aclose(self) -> None:
        """Destroy the env (idempotent), shielded from cancellation."""
        with shielded(self._t.cleanup_s):
            error = await self._destroy()
        if error is not None:
            raise error

    close = aclose

    async def _destroy(self) -> Optional[DrumsError]:
        """Destroy; returns the error instead of raising. Call inside a shielded scope."""
        if self.closed:
            return None
        try:
            await self._send(routes.destroy_slot(self.id, self._t.default_s))
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

    async def __aenter__(self) -> AsyncEnv:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        with shielded(self._t.cleanup_s):
            error = await self._destroy()
        if error is not None and exc is None:
            raise error


async def _destroy_all(envs: List[AsyncEnv]) -> Dict[str, DrumsError]:
    """Destroy envs concurrently (a fork of 64 must not take 64 round trips); call inside a
    shielded scope. Returns the failures by env id."""
    failures: Dict[str, DrumsError] = {}

    async def destroy(env: AsyncEnv) -> None:
        error = await env._destroy()
        if error is not None:
            failures[env.id] = error

    async with anyio.create_task_group() as tg:
        for env in envs:
            tg.start_soon(destroy, env)
    return failures


def aconnect(
    url: Optional[str] = None,
    token: Union[str, Secret, None] = None,
    **kwargs: Any,
) -> AsyncClient:
    """`async with drums.aconnect() as client:` (same arguments and defaults as `connect`)."""
    return AsyncClient(url, token, **kwargs)
