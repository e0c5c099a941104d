"""`drums pool serve`: one HTTP endpoint with drumsd's API over every host of the pool, for
clients that are not Ray programs (prime-rl's env workers, curl, the plain SDK via DRUMS_URL).

It is a Ray driver under hypercorn (asyncio), not a Ray Serve deployment: every request is
forwarded by its host's keeper actor to that host's loopback drumsd, so the gateway needs no
replicas, no Serve controller and no HTTP proxy actor of its own, and one process can be
restarted in a second. Env and state ids carry their host (`h1~s-0123abcd`), so it holds no
routing table a restart could lose.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple

from .._session import RENEW_PATH, SESSION_HEADER, TTL_HEADER

Forward = Callable[[str, str, str, str, bytes], Awaitable[Tuple[int, str, bytes]]]
log = logging.getLogger("drums.ray")
SEP = "~"
_ID = re.compile(r"^(s|st|pf|tpl)-[A-Za-z0-9._-]+$")
_ROUTED = ("/v1/slots/", "/v1/checkpoints/")


# ---------------------------------------------------------------- ids (pure)

# The API's fields that hold env or state ids (drums.models and the console's rows: a slot's `id`,
# `checkpoint`, `parent`, a branch's `children`, a create's `from_state` or `image`, ...). Only
# their values are rewritten: an id-shaped string anywhere else is the user's (a command's stdout,
# a label, a file's text) and passes through unchanged.
ID_KEYS = frozenset(
    {
        "id",
        "checkpoint",
        "checkpoints",
        "parent",
        "children",
        "from_state",
        "image",
        "prefork",
        "slot",
        "slots",
        "source_slot",
        "template",
        "members",
        "destroyed",
        "adopted",
        "swept",
    }
)
# Containers that are the user's data, not the API's: never walked, whatever keys they hold.
USER_DATA_KEYS = frozenset({"task", "labels", "action", "actions", "output", "text", "tree"})


def _map_ids(value: Any, change: Callable[[str], str], under_id_key: bool = False) -> Any:
    if isinstance(value, dict):
        return {
            k: v if k in USER_DATA_KEYS else _map_ids(v, change, k in ID_KEYS)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_map_ids(v, change, under_id_key) for v in value]
    if under_id_key and isinstance(value, str):
        return change(value)
    return value


def tag_ids(value: Any, label: str) -> Any:
    """Every env or state id in the API fields of a drumsd answer, prefixed with its host."""

    def tag(v: str) -> str:
        return f"{label}{SEP}{v}" if _ID.match(v) else v

    return _map_ids(value, tag)


def untag_ids(value: Any, hosts: List[str]) -> Tuple[Any, Optional[str]]:
    """Ids in a request body's API fields back to the host's own, and the host they name."""
    found: List[str] = []

    def untag(v: str) -> str:
        label, sep, rest = v.partition(SEP)
        if sep and label in hosts and _ID.match(rest):
            found.append(label)
            return rest
        return v

    return _map_ids(value, untag), (found[0] if found else None)


def split_path(path: str) -> Tuple[Optional[str], str]:
    """`/v1/slots/h1~s-1/step` -> ("h1", "/v1/slots/s-1/step"); other paths: (None, path)."""
    for prefix in _ROUTED:
        if path.startswith(prefix):
            head, _, tail = path[len(prefix) :].partition("/")
            label, sep, own = head.partition(SEP)
            if sep:
                return label, prefix + own + (f"/{tail}" if tail else "")
    return None, path


# ---------------------------------------------------------------- aggregation (pure)


def _sum_numbers(parts: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Numbers under the same key added (nested dicts likewise); a flag true if any host's is."""
    out: Dict[str, Any] = {}
    for part in parts:
        for key, value in (part or {}).items():
            if isinstance(value, bool):
                out[key] = bool(out.get(key)) or value
            elif isinstance(value, (int, float)):
                out[key] = round(out.get(key, 0) + value, 3)
            elif isinstance(value, dict):
                out[key] = _sum_numbers([out.get(key) or {}, value])
    return out


def merge_admission(up: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """The pool's admission: admitting if any host admits; memory and state space summed; one
    more slot costs what the dearest host charges; PSI is the worst host's."""
    each = [h.get("admission") or {} for h in up.values()]
    admitting = any(a.get("admitting") for a in each)

    def total(key: str) -> Optional[float]:
        values = [a[key] for a in each if a.get(key) is not None]
        return round(sum(values), 1) if values else None

    def worst(key: str) -> Optional[float]:
        values = [a[key] for a in each if a.get(key) is not None]
        return max(values) if values else None

    return {
        "enabled": any(a.get("enabled") for a in each) if each else True,
        "admitting": admitting,
        "reason": None if admitting else "no host of the pool admits more envs",
        "mem_available_mib": total("mem_available_mib"),
        "mem_total_mib": total("mem_total_mib"),
        "state_free_mib": total("state_free_mib"),
        "group_memory_limit_mib": total("group_memory_limit_mib"),
        "slot_cost_mib": worst("slot_cost_mib"),
        "psi_memory_some_avg10": worst("psi_memory_some_avg10"),
    }


def merge_health(per_host: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """One /v1/health in drumsd's schema: slots summed, admission and KSM over the pool,
    degraded if any host is degraded or down; each host's spares and crash watch under its
    label, and each host's own answer under `pools.hosts`."""
    up = {label: h for label, h in per_host.items() if "error" not in h}
    first = next(iter(up.values()), None)
    slots: Dict[str, int] = {}
    checkpoints: List[Any] = []
    warnings: List[str] = []
    for label, health in up.items():
        for state, n in health.get("slots_by_state", {}).items():
            slots[state] = slots.get(state, 0) + n
        checkpoints += tag_ids(health.get("checkpoints", []), label)
        warnings += [f"{label}: {w}" for w in health.get("warnings", [])]
    warnings += [f"{label}: host_down" for label in per_host if label not in up]
    spares = {lb: (h.get("pools") or {}).get("spares") for lb, h in up.items()}
    return {
        "status": "ok" if up and len(up) == len(per_host) and not warnings else "degraded",
        "version": first["version"] if first else "?",
        "profile": first["profile"] if first else "?",
        "slots_by_state": slots,
        "checkpoints": checkpoints,
        "admission": merge_admission(up),
        "crash_watch": {lb: h.get("crash_watch") or {} for lb, h in up.items()},
        "ksm": _sum_numbers([h.get("ksm") or {} for h in up.values()]),
        "forgotten_gib": round(sum(h.get("forgotten_gib") or 0 for h in up.values()), 3),
        "pools": {
            "hosts": per_host,
            "spares": {lb: v for lb, v in spares.items() if v is not None},
        },
        "warnings": warnings,
    }


def merge_metrics(per_host: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Counts summed; latency summaries are the worst host's (percentiles do not add)."""
    up = [m for m in per_host.values() if "error" not in m]
    out: Dict[str, Any] = {
        "window_started_at": min((m["window_started_at"] for m in up), default=None),
        "window_s": max((m["window_s"] for m in up), default=0.0),
        "latencies": {},
        "episodes_by_verdict": {},
        "failures_by_class": {},
        "counters": {},
        "cost": {},
    }
    for m in up:
        for key in ("episodes_by_verdict", "failures_by_class", "counters"):
            for k, v in m.get(key, {}).items():
                out[key][k] = out[key].get(k, 0) + v
        for k, summary in m.get("latencies", {}).items():
            best = out["latencies"].get(k)
            if best is None or (summary.get("p50") or 0) > (best.get("p50") or 0):
                out["latencies"][k] = summary
    return out


def merge_prometheus(per_host: Dict[str, str]) -> str:
    """Each host's /metrics with a `host` label on every sample; HELP/TYPE lines once."""
    seen: set[str] = set()
    lines: List[str] = []
    for label, text in per_host.items():
        for line in text.splitlines():
            if line.startswith("#"):
                if line not in seen:
                    seen.add(line)
                    lines.append(line)
                continue
            if not line.strip():
                continue
            name, _, rest = line.partition(" ")
            if "{" in name:
                base, _, labels = name.partition("{")
                name = f'{base}{{host="{label}",{labels}'
            else:
                name = f'{name}{{host="{label}"}}'
            lines.append(f"{name} {rest}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the ASGI app


@dataclass
class Session:
    """What the gateway knows of one client session: when it was last heard, its envs."""

    last_seen: float = field(default_factory=time.monotonic)
    envs: Set[str] = field(default_factory=set)
    busy: int = 0  # requests of this session on their way


def _error(status: int, code: str, message: str, **detail: Any) -> Tuple[int, str, bytes]:
    body = {"error": {"code": code, "message": message, "detail": detail}}
    return status, "application/json", json.dumps(body).encode()


class Gateway:
    """The ASGI app. `forward(label, method, path, query, body)` sends to a host's drumsd,
    `hosts(fresh=False)` lists each host's label and free desktops as Ray counts them (which
    follow the daemons: a host's keeper holds a ghost seat for every slot no pool env holds,
    the gateway's included), `token` is the gateway's own."""

    def __init__(
        self,
        token: str,
        forward: Forward,
        hosts: Callable[..., Awaitable[List[Tuple[str, int]]]],
        retry_after_s: float = 5.0,
        session_ttl_s: float = 10.0,
    ) -> None:
        self.token = token
        self.forward = forward
        self.hosts = hosts
        self.retry_after_s = retry_after_s
        # Fate-sharing: a client session (X-Drums-Session) not heard from for session_ttl_s
        # loses its envs, as a Ray driver's go with its job (the SDK renews while it lives).
        self.session_ttl_s = session_ttl_s
        self.sessions: Dict[str, Session] = {}
        self._reaper: Optional[asyncio.Task[None]] = None
        # Creates on their way, per host: Ray counts a desktop once its keeper seats it, which
        # is before the create answers; these cover the creates still in flight.
        self.creating: Dict[str, int] = {}
        from drums.ray._gateway_console import GatewayConsole  # it uses this module's merges

        async def labels() -> List[str]:
            return [label for label, _ in await self.hosts()]

        self.console = GatewayConsole(token, forward, labels)

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                self._reaper = self._reaper or asyncio.create_task(self.serve_sessions())
                await send({"type": "lifespan.startup.complete"})
            if self._reaper is not None:
                self._reaper.cancel()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = dict(scope["headers"])
        if scope["path"] == "/console" or scope["path"].startswith("/console/"):
            # The console: its own session cookie, not the bearer token (_gateway_console.py).
            status, sent, out = await self.console.handle(
                scope["method"],
                scope["path"],
                scope.get("query_string", b"").decode(),
                headers,
                body,
            )
            await send({"type": "http.response.start", "status": status, "headers": sent})
            await send({"type": "http.response.body", "body": out})
            return
        session = headers.get(SESSION_HEADER.lower().encode(), b"").decode()[:64]
        status, ctype, out = await self.handle(
            scope["method"],
            scope["path"],
            scope.get("query_string", b"").decode(),
            headers.get(b"authorization", b"").decode(),
            body,
            session=session,
        )
        extra = [(b"retry-after", str(int(self.retry_after_s)).encode())] if status == 429 else []
        if session and status != 401:
            extra.append((TTL_HEADER.encode(), f"{self.session_ttl_s:g}".encode()))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", ctype.encode()), *extra],
            }
        )
        await send({"type": "http.response.body", "body": out})

    async def handle(
        self, method: str, path: str, query: str, auth: str, body: bytes, session: str = ""
    ) -> Tuple[int, str, bytes]:
        if path == "/healthz":
            return 200, "application/json", b'{"ok": true}'
        if not secrets.compare_digest(auth, f"Bearer {self.token}"):
            return _error(401, "unauthorized", "missing or wrong gateway token")
        if session:
            held = self.sessions.setdefault(session, Session())
            held.last_seen = time.monotonic()
            if method == "POST" and path == RENEW_PATH:
                renewed = {"session": session, "ttl_s": self.session_ttl_s, "envs": len(held.envs)}
                return 200, "application/json", json.dumps(renewed).encode()
        if not session:
            return await self._handle(method, path, query, body)
        # A request on its way keeps its session alive (a create can outlast the TTL).
        held.busy += 1
        try:
            answer = await self._handle(method, path, query, body)
        finally:
            held.busy -= 1
            held.last_seen = time.monotonic()
            self.sessions.setdefault(session, held)
        self._note(held, method, path, answer)
        return answer

    async def _handle(
        self, method: str, path: str, query: str, body: bytes
    ) -> Tuple[int, str, bytes]:
        hosts = await self.hosts()
        labels = [label for label, _ in hosts]
        if not labels:
            return _error(503, "host_down", "no drums host is in the pool")
        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                return _error(400, "invalid_request", "the body is not JSON")
        label, own_path = split_path(path)
        if label is not None:
            if label not in labels:
                return _error(503, "host_down", f"host {label} is not in the pool", host=label)
            return await self._to(label, method, own_path, query, parsed)
        if method == "POST" and path == "/v1/slots":
            return await self._create(query, parsed)
        if (method == "POST" and path == "/v1/metrics/reset") or path == "/v1/metrics":
            return await self._merged(labels, method, path, merge_metrics)
        if path == "/v1/health":
            return await self._merged(labels, "GET", path, merge_health)
        if path == "/metrics":
            texts = await self._each(labels, "GET", path, query)
            good = {lb: r[2].decode() for lb, r in texts.items() if r[0] == 200}
            return 200, "text/plain; version=0.0.4", merge_prometheus(good).encode()
        if method == "GET" and path in ("/v1/slots", "/v1/checkpoints"):
            key = path.rsplit("/", 1)[1]
            answers = await self._each(labels, method, path, query)
            items: List[Any] = []
            for lb, (status, _, raw) in answers.items():
                if status == 200:
                    items += tag_ids(json.loads(raw).get(key, []), lb)
            return 200, "application/json", json.dumps({key: items}).encode()
        # tasks, openapi: every host serves the same; the first answers.
        return await self._to(labels[0], method, path, query, parsed)

    async def _to(
        self, label: str, method: str, path: str, query: str, parsed: Any
    ) -> Tuple[int, str, bytes]:
        body = b""
        if parsed is not None:
            parsed, _ = untag_ids(parsed, [label])
            body = json.dumps(parsed).encode()
        status, ctype, raw = await self.forward(label, method, path, query, body)
        if ctype.startswith("application/json") and raw and not path.startswith("/v1/tasks"):
            raw = json.dumps(tag_ids(json.loads(raw), label)).encode()
        return status, ctype, raw

    # --- sessions: a client's envs go when the client does -----------------------------------

    def _note(self, held: Session, method: str, path: str, answer: Tuple[int, str, bytes]) -> None:
        status, ctype, raw = answer
        envs = held.envs
        if method == "DELETE" and path.startswith("/v1/slots/"):
            if status < 300 or status in (404, 410):
                envs.discard(path[len("/v1/slots/") :])
            return
        if method != "POST" or status >= 300 or not ctype.startswith("application/json"):
            return
        if path == "/v1/slots":
            envs.add(str(json.loads(raw)["id"]))
        elif path.startswith("/v1/slots/") and path.endswith(("/fork", "/branch")):
            envs.update(str(c["id"]) for c in json.loads(raw).get("children", []))

    async def reap_sessions(self, now: Optional[float] = None) -> List[str]:
        """Destroy the envs of every session silent for longer than the TTL; the env ids."""
        now = time.monotonic() if now is None else now
        gone = [
            s
            for s, held in self.sessions.items()
            if not held.busy and now - held.last_seen > self.session_ttl_s
        ]
        destroyed: List[str] = []
        for session in gone:
            held = self.sessions.pop(session)
            for env_id in sorted(held.envs):
                label, own = split_path(f"/v1/slots/{env_id}")
                if label is None:
                    continue
                status, _, _ = await self._to(label, "DELETE", own, "", None)
                if status < 300 or status in (404, 410):
                    destroyed.append(env_id)
                else:  # its host is away: its keeper buried it (see Keeper.forward)
                    log.warning("session %s: env %s not destroyed (%d)", session, env_id, status)
            if held.envs:
                log.info("session %s silent: destroyed %s", session, ", ".join(destroyed))
        return destroyed

    async def serve_sessions(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.session_ttl_s / 4))
            try:
                await self.reap_sessions()
            except Exception as exc:  # keep reaping; drumsd's idle lease is the backstop
                log.warning("session reaper: %s", exc)

    async def _create(self, query: str, parsed: Any) -> Tuple[int, str, bytes]:
        hosts = await self.hosts(fresh=True)  # a create places against the daemons' count now
        _, on = untag_ids(parsed or {}, [lb for lb, _ in hosts])
        free = {lb: n - self.creating.get(lb, 0) for lb, n in hosts}
        order = [on] if on else sorted((lb for lb in free if free[lb] > 0), key=lambda x: -free[x])
        last: Optional[Tuple[int, str, bytes]] = None
        for label in order:
            self.creating[label] = self.creating.get(label, 0) + 1
            try:
                last = await self._to(label, "POST", "/v1/slots", query, parsed)
            finally:
                self.creating[label] -= 1
            if last[0] != 503:  # a host down: the next one
                return last
        if last is None:
            return _error(
                429,
                "overloaded",
                f"every drums host is full; retry in {self.retry_after_s:.0f}s",
                retry_after_s=self.retry_after_s,
            )
        return last

    async def _each(
        self, labels: List[str], method: str, path: str, query: str
    ) -> Dict[str, Tuple[int, str, bytes]]:
        answers = await asyncio.gather(
            *(self.forward(lb, method, path, query, b"") for lb in labels)
        )
        return dict(zip(labels, answers))

    async def _merged(
        self, labels: List[str], method: str, path: str, merge: Callable[[Any], Any]
    ) -> Tuple[int, str, bytes]:
        answers = await self._each(labels, method, path, "")
        per_host = {
            lb: json.loads(raw) if status == 200 else {"error": json.loads(raw or b"{}")}
            for lb, (status, _, raw) in answers.items()
        }
        return 200, "application/json", json.dumps(merge(per_host)).encode()
