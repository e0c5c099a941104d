"""The Ray actors of the pool. A `HostAgent` holds every env one process has on its node's drumsd
(Ray owns it: its creator dying kills it); a `Keeper` per host, detached, destroys the envs of
agents that are gone however they went (owner died, SIGKILL, ray.kill), from their lease files.

Actor methods answer `("ok", value)` or `("err", fields)`: a DrumsError's code and detail
survive the trip through Ray exactly, whatever its pickling does with keyword arguments.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import httpx

from .. import _routes as routes
from .. import models as m
from .._base import wire
from .._client import Client, Env
from .._exceptions import ConnectionFailed, DrumsError, EnvGone, ShuttingDown
from ._registry import orphaned_leases, read_host, write_lease

log = logging.getLogger("drums.ray")
Reply = Tuple[str, Any]


def error_fields(exc: DrumsError) -> Dict[str, Any]:
    host_down = isinstance(exc, (ConnectionFailed, ShuttingDown))
    return {
        "type": "HostDown" if host_down else type(exc).__name__,
        "code": "host_down" if host_down else exc.code,
        "message": exc.message,
        "env_id": exc.env_id,
        "status": exc.status,
        "detail": exc.detail,
    }


def host_down_body(label: str, exc: BaseException) -> bytes:
    message = f"the drumsd of host {label} cannot be reached: {type(exc).__name__}"
    error = {"code": "host_down", "message": message, "detail": {"host": label}}
    return json.dumps({"error": error}).encode()


def _reply(fn: Callable[[], Any]) -> Reply:
    try:
        return ("ok", fn())
    except DrumsError as exc:
        return ("err", error_fields(exc))


def connect_host(label: str) -> Client:
    entry = read_host(label)
    return Client(entry.url, token_file=entry.token_file)


class HostAgent:
    """Every env this process holds on one host: one long-lived actor per (process, node), so a
    create is one drumsd call, not a new Ray worker. Owned by the process that made it (Ray
    kills it when that process dies); its lease file names all its envs for the keeper."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.client = connect_host(label)
        self.envs: Dict[str, Env] = {}
        self._lock = threading.Lock()

    def _lease(self, extra: Tuple[str, ...] = ()) -> None:
        with self._lock:
            write_lease(self.label, [*self.envs, *extra])

    def _env(self, env_id: str) -> Env:
        env = self.envs.get(env_id)
        if env is None:
            raise EnvGone(f"env {env_id} is not held on host {self.label}", env_id=env_id)
        return env

    def ready(self) -> int:
        return os.getpid()

    def create(self, kwargs: Dict[str, Any]) -> Reply:
        def run() -> Dict[str, Any]:
            env = self.client.create(**kwargs)
            with self._lock:
                self.envs[env.id] = env
            self._lease()
            return {"id": env.id, "pid": os.getpid(), "slot": env.slot}

        return _reply(run)

    def call(
        self, env_id: str, method: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Reply:
        return _reply(lambda: getattr(self._env(env_id), method)(*args, **kwargs))

    def call_stamped(
        self, env_id: str, method: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Tuple[Reply, float, float]:
        """`call`, with the wall-clock times (time.time) it started and ended here: the pool's
        benchmark splits a call into the way in, the daemon's work and the way back."""
        started = time.time()
        reply = self.call(env_id, method, args, kwargs)
        return reply, started, time.time()

    def branch(
        self, env_id: str, n: int, idle_timeout_s: Optional[float], ttl_s: Optional[float]
    ) -> Reply:
        """Fork children of `env_id` on this daemon, held here like any env (in the lease
        from the moment drumsd names them, so nothing is unowned in between)."""

        def run() -> Dict[str, Any]:
            env = self._env(env_id)
            t = env._t
            pre = wire(m.PreforkRequest, idle_timeout_s=idle_timeout_s)
            state = self.client._send(routes.prefork(env.id, pre, t))
            # The daemon reuses a young prefork of the same state: one an earlier fork kept stays.
            kept_before = state.id in self.client._owned_states
            self.client._adopt_state(state)
            request = wire(
                m.BranchRequest, n=n, idle_timeout_s=idle_timeout_s, ttl_s=ttl_s, prefork=state.id
            )
            result = self.client._send(routes.branch(env.id, request, t))
            ids = [s.id for s in result.children]
            self._lease(tuple(ids))
            for slot in result.children:
                child = self.client._adopt_env(Env(self.client, slot, owned=True))
                with self._lock:
                    self.envs[child.id] = child
            self._lease()
            return {
                "children": ids,
                "slots": list(result.children),
                "state": state,
                "kept_before": kept_before,
                "elapsed_s": result.elapsed_s,
            }

        return _reply(run)

    def delete_state(self, state_id: str) -> Reply:
        """Delete a state this client holds (a fork's prefork state, a save without keep)."""

        def run() -> None:
            deadline = time.monotonic() + self.client.timeouts.cleanup_s
            failed = self.client._delete_states([state_id], deadline)
            if failed:
                raise failed[state_id]

        return _reply(run)

    def client_call(self, method: str, args: Tuple[Any, ...]) -> Reply:
        return _reply(lambda: getattr(self.client, method)(*args))

    def close(self, env_id: str) -> Reply:
        def run() -> None:
            env = self.envs.get(env_id)
            if env is not None:
                env.close()
                with self._lock:
                    self.envs.pop(env_id, None)
                self._lease()

        return _reply(run)

    def __del__(self) -> None:  # the finalizer; the keeper covers a hard kill
        try:
            self.client.close()
            write_lease(self.label, [])
        except Exception:
            pass


class Keeper:
    """Per host, detached: every `interval_s`, destroy the envs of leases whose process is gone."""

    def __init__(self, label: str, interval_s: float = 0.5) -> None:
        self.label = label
        self.interval_s = interval_s
        self.destroyed: List[str] = []
        self._http: Optional[httpx.Client] = None
        threading.Thread(target=self._loop, daemon=True, name="drums-keeper").start()

    def _loop(self) -> None:
        while True:
            try:
                self.sweep()
            except Exception as exc:  # keep sweeping; the idle lease is the backstop
                log.warning("keeper %s: sweep failed: %s", self.label, exc)
            time.sleep(self.interval_s)

    def sweep(self) -> List[str]:
        gone = orphaned_leases(self.label)
        if not gone:
            return []
        done: List[str] = []
        with connect_host(self.label) as client:
            for path, env_ids in gone.items():
                for env_id in env_ids:
                    try:
                        client._send(routes.destroy_slot(env_id, client.timeouts.default_s))
                    except DrumsError as exc:
                        if exc.code not in ("env_gone", "not_found"):
                            raise
                    done.append(env_id)
                    log.info("keeper %s: destroyed env %s of a dead actor", self.label, env_id)
                path.unlink(missing_ok=True)
        self.destroyed.extend(done)
        return done

    def ping(self) -> List[str]:
        return list(self.destroyed)

    def forward(self, method: str, path: str, query: str, body: bytes) -> Tuple[int, str, bytes]:
        """One HTTP request to this host's drumsd, for the gateway (the token stays here)."""
        if self._http is None:
            entry = read_host(self.label)
            token = open(entry.token_file).read().strip()
            self._http = httpx.Client(
                base_url=entry.url, headers={"Authorization": f"Bearer {token}"}, timeout=600
            )
        try:
            r = self._http.request(
                method,
                path + (f"?{query}" if query else ""),
                content=body or None,
                headers={"Content-Type": "application/json"} if body else None,
            )
        except httpx.HTTPError as exc:
            return 503, "application/json", host_down_body(self.label, exc)
        return r.status_code, r.headers.get("content-type", "application/json"), r.content
