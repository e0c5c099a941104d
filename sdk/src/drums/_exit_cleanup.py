"""What a client made goes when its process ends, with or without `with` blocks.

A `with` block (or close()) is the normal way out. For the rest (a script that never closes
its client, a trainer stopped by SIGTERM, an interpreter shutting down after Ctrl-C) every
client is tracked here, and at exit, and on SIGTERM, the envs and states it still owns are
destroyed over a connection of our own: the client's pool may be mid-request (a signal lands
anywhere) and an async client's event loop may be gone. Bounded by the client's cleanup_s.

SIGTERM is only taken when nobody else handles it (the handler is SIG_DFL, in the main thread);
after cleanup the default action is restored and the signal raised again, so the process still
dies of SIGTERM (its parent sees -15). Issue 14, finding 8.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, List

import httpx

from . import _routes as routes

if TYPE_CHECKING:
    from ._base import BaseClient

log = logging.getLogger("drums")

_clients: "weakref.WeakSet[BaseClient[Any]]" = weakref.WeakSet()
_lock = threading.Lock()
_installed = False


def track(client: "BaseClient[Any]") -> None:
    """Remember `client` until it is garbage; install the exit hooks on first use."""
    global _installed
    with _lock:
        _clients.add(client)
        if _installed:
            return
        _installed = True
    atexit.register(clean_all, "interpreter exit")
    _take_sigterm()


def _take_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main interpreter
        pass


def _on_sigterm(signum: int, frame: Any) -> None:
    try:
        clean_all("SIGTERM")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def clean_all(why: str) -> int:
    """Destroy what every open client still owns; returns how many resources were removed."""
    with _lock:
        clients = [
            c for c in list(_clients) if not c._closed and (c._owned_envs or c._owned_states)
        ]
    removed = 0
    for client in clients:
        removed += clean_client(client, why)
    return removed


def clean_client(client: "BaseClient[Any]", why: str) -> int:
    transport = getattr(client._http, "_transport", None)
    if not isinstance(transport, (httpx.HTTPTransport, httpx.AsyncHTTPTransport)):
        return 0  # a test's in-process transport: there is no socket of our own to reach it by
    envs: List[str] = list(client._owned_envs)
    states: List[str] = list(client._owned_states)
    if not envs and not states:
        return 0
    log.warning(
        "%s: destroying %d env(s) and %d saved state(s) this client still owns",
        why,
        len(envs),
        len(states),
    )
    deadline = time.monotonic() + client.timeouts.cleanup_s
    t = client.timeouts.default_s
    calls: List[routes.Call[Any]] = [routes.destroy_slot(e, t) for e in envs]
    calls += [routes.delete_checkpoint(s, t) for s in states]
    removed = 0
    with httpx.Client() as http:
        for call in calls:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("%s: cleanup deadline passed; %s left", why, call.what)
                break
            request = client._build(call)
            request.extensions["timeout"] = httpx.Timeout(min(remaining, call.timeout_s)).as_dict()
            try:
                response = http.send(request)
            except httpx.HTTPError as error:
                log.warning("%s: %s failed: %s", why, call.what, error)
                continue
            if response.status_code < 300 or response.status_code in (404, 410):
                removed += 1
            else:
                log.warning("%s: %s answered %s", why, call.what, response.status_code)
    for env_id in envs:
        client._forget_env(env_id)
    for state_id in states:
        client._forget_state(state_id)
    return removed
