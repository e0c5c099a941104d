"""The Ray actors of the pool. A `HostAgent` holds every env one process has on its node's drumsd
(Ray owns it: its creator dying kills it); a `Keeper` per host, detached, destroys the envs of
agents that are gone however they went (owner died, SIGKILL, ray.kill), from their lease files,
carries out closes that could not reach the daemon once it answers again, and makes Ray's free
desktops follow the daemon: a slot no pool env holds (made by the gateway, a plain client, a
dead driver not yet swept) holds a ghost seat, so every placer sees the same capacity.

Actor methods answer `("ok", value)` or `("err", fields)`: a DrumsError's code and detail
survive the trip through Ray exactly, whatever its pickling does with keyword arguments.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from functools import partial
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import httpx

from .. import _routes as routes
from .. import models as m
from .._base import wire
from .._client import Client, Env
from .._exceptions import ConnectionFailed, DrumsError, EnvGone, ShuttingDown
from ._placement import DESKTOPS, ghost_changes
from ._registry import (
    POOL_LABEL,
    clear_tombstone,
    held_env_ids,
    key_alive,
    orphaned_leases,
    process_key,
    read_host,
    tombstones,
    write_lease,
    write_tombstone,
)

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


def host_down_body(label: str, exc: BaseException, buried: bool = False) -> bytes:
    message = f"the drumsd of host {label} cannot be reached: {type(exc).__name__}"
    if buried:
        message += "; the destroy is recorded and carried out when the host answers again"
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
            # The label marks the slot as this agent's from the moment drumsd makes it (fork
            # children inherit it), before any lease names it: the keeper counts it as a pool
            # env's, and destroys it if this agent dies before it was leased.
            labels = {**(kwargs.get("labels") or {}), POOL_LABEL: process_key()}
            env = self.client.create(**{**kwargs, "labels": labels})
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

    def fork(
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
                m.ForkRequest, n=n, idle_timeout_s=idle_timeout_s, ttl_s=ttl_s, prefork=state.id
            )
            result = self.client._send(routes.fork(env.id, request, t))
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
        """Destroy an env. A destroy that fails (its drumsd down or restarting) is still final:
        the env leaves this agent and its lease, and the keeper destroys it once the daemon
        answers (a restarted daemon adopts its slots; this one must not come back)."""

        def run() -> None:
            env = self.envs.get(env_id)
            if env is None:
                return
            try:
                env.close()
            except DrumsError:
                write_tombstone(self.label, env_id)
                self.client._forget_env(env_id)
                raise
            finally:
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


GHOST = "drums-ghost"  # name prefix of a keeper's placement groups: drums-ghost:<host>:<slot>
_SLOT_PATH = re.compile(r"^/v1/slots/([^/]+)(/fork|/branch)?$")  # /branch: the old /fork


class Keeper:
    """Per host, detached: every `interval_s`, destroy the envs of leases whose process is gone
    and of closes that could not reach the daemon, and hold one ghost seat (a `drums_desktops`
    placement group pinned to this node) per live slot that no pool env holds."""

    def __init__(self, label: str, interval_s: float = 0.5) -> None:
        import ray

        self.label = label
        self.interval_s = interval_s
        self.destroyed: List[str] = []
        self._http: Optional[httpx.Client] = None
        self._node_id = ray.get_runtime_context().get_node_id()
        self._seats = threading.Lock()
        self.ghosts: Dict[str, Any] = {}  # slot id -> its placement group
        self._foreign_before: Set[str] = set()
        self._known: Set[str] = set()  # slots the gateway made through this keeper
        self._remove_ghosts_of_earlier_keepers()
        threading.Thread(target=self._loop, daemon=True, name="drums-keeper").start()

    def _loop(self) -> None:
        while True:
            for step in (self.sweep, self.bury, self.follow_daemon):
                try:
                    step()
                except Exception as exc:  # keep going; the idle lease is the backstop
                    log.warning("keeper %s: %s failed: %s", self.label, step.__name__, exc)
            time.sleep(self.interval_s)

    def sweep(self) -> List[str]:
        done: List[str] = []
        for path, env_ids in orphaned_leases(self.label).items():
            done += self._destroy_all(env_ids, "of a dead actor")
            path.unlink(missing_ok=True)
        return done

    def bury(self) -> List[str]:
        """Carry out the closes that could not reach the daemon, now that it answers."""
        pending = tombstones(self.label)
        # Raises while the daemon is still away; the tombstones stay for the next round.
        return self._destroy_all(
            pending, "closed while away", then=partial(clear_tombstone, self.label)
        )

    def _destroy_all(
        self, env_ids: Iterable[str], why: str, then: Callable[[str], None] = lambda _: None
    ) -> List[str]:
        """Destroy each env on this host (gone already counts), `then(env_id)` after each."""
        env_ids = list(env_ids)
        if not env_ids:
            return []
        done: List[str] = []
        try:
            with connect_host(self.label) as client:
                for env_id in env_ids:
                    self._destroy(client, env_id)
                    then(env_id)
                    done.append(env_id)
                    log.info("keeper %s: destroyed env %s %s", self.label, env_id, why)
        finally:
            self.destroyed.extend(done)
        return done

    @staticmethod
    def _destroy(client: Client, env_id: str) -> None:
        try:
            client._send(routes.destroy_slot(env_id, client.timeouts.default_s))
        except DrumsError as exc:
            if exc.code not in ("env_gone", "not_found"):
                raise

    # --- capacity: Ray's free desktops follow the daemon -------------------------------------

    def follow_daemon(self) -> None:
        """Ghost seats for the daemon's live slots that no pool env holds; none for the rest.
        A slot is a pool env's when a live agent's lease names it or its `drums.pool` label
        names a live agent (a create or fork still on its way); a slot labelled by an agent
        that died is destroyed, as its lease's envs are. A daemon that does not answer changes
        nothing (its slots may come back adopted)."""
        status, _, raw = self.forward("GET", "/v1/slots", "", b"", track=False)
        if status != 200:
            return
        slots = json.loads(raw).get("slots", [])
        live = {str(s["id"]) for s in slots}
        held = held_env_ids(self.label)
        orphans = []
        for s in slots:
            key = (s.get("labels") or {}).get(POOL_LABEL)
            if key is None:
                continue
            if key_alive(key):
                held.add(str(s["id"]))
            elif str(s["id"]) not in held:
                orphans.append(str(s["id"]))
        with self._seats:
            add, remove = ghost_changes(
                live, held, self._foreign_before, set(self.ghosts), self._known
            )
            self._foreign_before = live - held
            self._known &= live
            self._apply(add, remove, wait_s=0.0)
        self._destroy_all(orphans, "of a dead agent")

    def ghost_seats(self) -> List[str]:
        with self._seats:
            return sorted(self.ghosts)

    def _apply(self, add: Set[str], remove: Set[str], wait_s: float) -> None:
        from ray.util.placement_group import (
            NODE_ID_LABEL_KEY,
            placement_group,
            remove_placement_group,
        )

        for slot_id in remove:
            pg = self.ghosts.pop(slot_id, None)
            if pg is not None:
                remove_placement_group(pg)
        made = []
        for slot_id in add:
            self.ghosts[slot_id] = pg = placement_group(
                [{DESKTOPS: 1}],
                strategy="STRICT_PACK",
                bundle_label_selector=[{NODE_ID_LABEL_KEY: self._node_id}],
                name=f"{GHOST}:{self.label}:{slot_id}",
                lifetime="detached",  # outlives the driver that started this keeper
            )
            made.append(pg)
        for pg in made if wait_s > 0 else ():
            pg.wait(wait_s)  # placed: Ray's free count shows it before the gateway answers

    def _track(self, method: str, path: str, status: int, raw: bytes) -> None:
        """The gateway's own creates, forks and destroys change the seats at once."""
        match = _SLOT_PATH.match(path) if method in ("POST", "DELETE") else None
        if path == "/v1/slots" and method == "POST" and status < 300:
            made = {str(json.loads(raw)["id"])}
        elif match and match.group(2) and method == "POST" and status < 300:
            made = {str(c["id"]) for c in json.loads(raw).get("children", [])}
        elif match and not match.group(2) and method == "DELETE" and status in (200, 404, 410):
            with self._seats:
                self._known.discard(match.group(1))
                self._apply(set(), {match.group(1)}, wait_s=0.0)
            return
        else:
            return
        with self._seats:
            self._known |= made
            self._apply(made - set(self.ghosts), set(), wait_s=5.0)

    def _remove_ghosts_of_earlier_keepers(self) -> None:
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import (
            PlacementGroup,
            placement_group_table,
            remove_placement_group,
        )

        prefix = f"{GHOST}:{self.label}:"
        for pg_id, info in placement_group_table().items():
            if str(info.get("name", "")).startswith(prefix) and info.get("state") != "REMOVED":
                remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))

    def ping(self) -> List[str]:
        return list(self.destroyed)

    def forward(
        self, method: str, path: str, query: str, body: bytes, track: bool = True
    ) -> Tuple[int, str, bytes]:
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
            slot = _SLOT_PATH.match(path)
            if track and method == "DELETE" and slot and not slot.group(2):
                write_tombstone(self.label, slot.group(1))
                return 503, "application/json", host_down_body(self.label, exc, buried=True)
            return 503, "application/json", host_down_body(self.label, exc)
        status, ctype = r.status_code, r.headers.get("content-type", "application/json")
        if track and ctype.startswith("application/json"):
            self._track(method, path, status, r.content)
        return status, ctype, r.content
