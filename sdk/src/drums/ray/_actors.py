"""The Ray actors of the pool. An `EnvActor` holds one env on its node's drumsd (Ray owns it:
its creator dying kills it); a `Keeper` per host, detached, destroys the envs of env actors
that are gone however they went (owner died, SIGKILL, ray.kill), from their lease files.

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
from .._exceptions import ConnectionFailed, DrumsError, ShuttingDown
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


class EnvActor:
    """One env on this node's drumsd: created here, or attached (a fork child) and owned."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.client = connect_host(label)
        self.env: Optional[Env] = None

    def _lease(self) -> None:
        write_lease(self.label, [] if self.env is None else [self.env.id])

    def create(self, kwargs: Dict[str, Any]) -> Reply:
        def run() -> Dict[str, Any]:
            self.env = self.client.create(**kwargs)
            self._lease()
            return {"id": self.env.id, "pid": os.getpid()}

        return _reply(run)

    def adopt(self, env_id: str) -> Reply:
        """Own a fork child the parent's actor made (same node, same drumsd)."""

        def run() -> Dict[str, Any]:
            slot = self.client._send(routes.get_slot(env_id, self.client.timeouts))
            self.env = self.client._adopt_env(Env(self.client, slot, owned=True))
            self._lease()
            return {"id": env_id, "pid": os.getpid()}

        return _reply(run)

    def call(self, method: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Reply:
        assert self.env is not None, "call before create"
        return _reply(lambda: getattr(self.env, method)(*args, **kwargs))

    def branch(self, n: int, idle_timeout_s: Optional[float]) -> Reply:
        """Fork children on this daemon; their actors adopt them (the parent's actor holds
        them in its lease until then, so nothing is unowned in between)."""
        env = self.env
        assert env is not None

        def run() -> Dict[str, Any]:
            t = env._t
            pre = wire(m.PreforkRequest, idle_timeout_s=idle_timeout_s)
            state = self.client._send(routes.prefork(env.id, pre, t))
            request = wire(m.BranchRequest, n=n, idle_timeout_s=idle_timeout_s, prefork=state.id)
            result = self.client._send(routes.branch(env.id, request, t))
            ids = [s.id for s in result.children]
            write_lease(self.label, [env.id, *ids])
            with_state = {"children": ids, "state": state.id, "elapsed_s": result.elapsed_s}
            self.client._adopt_state(state)  # the prefork state goes with the parent
            return with_state

        return _reply(run)

    def handed_over(self) -> Reply:
        return _reply(self._lease)

    def client_call(self, method: str, args: Tuple[Any, ...]) -> Reply:
        return _reply(lambda: getattr(self.client, method)(*args))

    def close(self) -> Reply:
        def run() -> None:
            self.client.close()
            self.env = None
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
