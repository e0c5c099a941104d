"""The pool gateway's `/console`: every host's desktops on one page.

The page, script and style are drumsd's own (fetched from a host: every host serves the same);
the data is each host's `/console/api/*`, asked through its keeper (which holds that host's
token; a host opens its console's data to its bearer token) and merged here: slot rows and ids
carry their host (`h1~s-0123abcd`) like the rest of the gateway's answers, so a card's
thumbnail, its slot page and its actions route to the right host. Logging in exchanges the
gateway's own token for a session cookie (HttpOnly, SameSite=Strict, Path=/console), read-only
unless actions were asked for; actions also need the X-Drums-Console header.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple

import anyio

from drums.ray._gateway import SEP, merge_health, merge_metrics, tag_ids

Forward = Callable[[str, str, str, str, bytes], Awaitable[Tuple[int, str, bytes]]]
Headers = List[Tuple[bytes, bytes]]
Answer = Tuple[int, Headers, bytes]

COOKIE = "drums_console"
PREFIX = "/console"
SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 64
SECURITY = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
# Numeric fields of a host history sample that add up over hosts.
SUMMED = (
    "slots",
    "ready",
    "quarantined",
    "busy",
    "restores_per_s",
    "steps_per_s",
    "mem_available_mib",
    "mem_total_mib",
    "ksm_saved_mib",
    "spares_parked",
)


def is_console_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


# ---------------------------------------------------------------- merging (pure)


def merge_slots(per_host: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Every host's grid rows, ids tagged with the host, a `host` field and facet."""
    rows: List[Dict[str, Any]] = []
    facets: Dict[str, Set[Any]] = {}
    for label, body in per_host.items():
        for row in body.get("slots", []):
            tagged = tag_ids(row, label)
            tagged["host"] = label
            rows.append(tagged)
        for name, values in body.get("facets", {}).items():
            facets.setdefault(name, set()).update(values)
    facets["host"] = set(per_host)
    return {"slots": rows, "facets": {k: sorted(v) for k, v in facets.items()}}


def merge_history(
    per_host: Dict[str, Dict[str, Any]], since: Optional[float] = None
) -> Dict[str, Any]:
    """One history for the pool: samples of the same interval summed over hosts (each host
    samples on its own clock; a sample lands in the interval its ts falls in); with `since`,
    only intervals that start after it."""
    every = max((float(b.get("every_s") or 0) for b in per_host.values()), default=5.0) or 5.0
    buckets: Dict[int, Dict[str, Any]] = {}
    for body in per_host.values():
        for sample in body.get("samples", []):
            slot = int(sample["ts"] // every)
            out = buckets.setdefault(slot, {"ts": slot * every, "hosts": 0})
            out["hosts"] += 1
            for key in SUMMED:
                value = sample.get(key)
                if value is not None:
                    out[key] = (out.get(key) or 0) + value
    samples = [buckets[k] for k in sorted(buckets) if since is None or buckets[k]["ts"] > since]
    for sample in samples:
        for key in SUMMED:
            sample.setdefault(key, None)
    size = max((int(b.get("size") or 0) for b in per_host.values()), default=0) or None
    return {"every_s": every, "size": size, "samples": samples, "hosts": sorted(per_host)}


def merge_records(per_host: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Every host's failure records, newest first, names tagged with the host."""
    rows = []
    for label, body in per_host.items():
        for row in body.get("records", []):
            rows.append({**row, "name": f"{label}{SEP}{row['name']}", "host": label})
    rows.sort(key=lambda r: r.get("stamp", ""), reverse=True)
    dirs = ", ".join(f"{lb}:{b.get('dir', '?')}" for lb, b in per_host.items())
    return {"records": rows, "dir": dirs}


def split_host(rest: str, labels: List[str]) -> Tuple[Optional[str], str]:
    """`h1~s-1/thumbnail` -> ("h1", "s-1/thumbnail"); (None, rest) when no host is named."""
    head, sep, own = rest.partition(SEP)
    if sep and head in labels:
        return head, own
    return None, rest


# ---------------------------------------------------------------- sessions


class Sessions:
    def __init__(self, token: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._token = token.encode()
        self._clock = clock
        self._by_id: Dict[str, Tuple[bool, float]] = {}  # id -> (write, expires_at)

    def login(self, given: str, write: bool) -> Optional[str]:
        if not secrets.compare_digest(given.strip().encode(), self._token):
            return None
        now = self._clock()
        for sid in [s for s, (_, exp) in self._by_id.items() if exp <= now]:
            del self._by_id[sid]
        while len(self._by_id) >= MAX_SESSIONS:
            del self._by_id[min(self._by_id, key=lambda s: self._by_id[s][1])]
        sid = secrets.token_urlsafe(32)
        self._by_id[sid] = (write, now + SESSION_TTL_S)
        return sid

    def get(self, sid: Optional[str]) -> Optional[bool]:
        """The session's write flag, or None when there is no such live session."""
        entry = self._by_id.get(sid or "")
        if entry is None or entry[1] <= self._clock():
            self._by_id.pop(sid or "", None)
            return None
        return entry[0]

    def logout(self, sid: Optional[str]) -> None:
        self._by_id.pop(sid or "", None)


def _cookie(headers: Dict[bytes, bytes]) -> Optional[str]:
    raw = headers.get(b"cookie", b"").decode("latin-1")
    for part in raw.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return None


def _json(body: Any, status: int = 200) -> Answer:
    return status, [(b"content-type", b"application/json"), *SECURITY], json.dumps(body).encode()


def _refused(status: int, code: str, message: str) -> Answer:
    return _json({"error": {"code": code, "message": message, "detail": {}}}, status)


def _redirect(to: str, *extra: Tuple[bytes, bytes]) -> Answer:
    return 303, [(b"location", to.encode()), *SECURITY, *extra], b""


# ---------------------------------------------------------------- the console


class GatewayConsole:
    def __init__(
        self,
        token: str,
        forward: Forward,
        labels: Callable[[], Awaitable[List[str]]],
    ) -> None:
        self.sessions = Sessions(token)
        self.forward = forward
        self.labels = labels

    async def handle(
        self, method: str, path: str, query: str, headers: Dict[bytes, bytes], body: bytes
    ) -> Answer:
        sid = _cookie(headers)
        write = self.sessions.get(sid)
        labels = await self.labels()
        if path == PREFIX + "/login" and method == "POST":
            return self._login(body)
        if path == PREFIX + "/logout" and method == "POST":
            self.sessions.logout(sid)
            expired = f"{COOKIE}=; Max-Age=0; Path={PREFIX}; HttpOnly; SameSite=Strict"
            return _redirect(PREFIX + "/login", (b"set-cookie", expired.encode()))
        if not labels:
            return _refused(503, "host_down", "no drums host is in the pool")
        if path == PREFIX + "/login" or path.startswith(PREFIX + "/static/"):
            return await self._page(labels[0], path)  # the page's own files: no data
        if write is None:
            if path.startswith(PREFIX + "/api/"):
                return _refused(401, "unauthorized", "no console session: log in at /console/login")
            return _redirect(PREFIX + "/login")
        if path == PREFIX:
            return await self._page(labels[0], PREFIX)
        if not path.startswith(PREFIX + "/api/"):
            return _refused(404, "not_found", f"no console page {path}")
        return await self._api(method, path[len(PREFIX + "/api") :], query, headers, write, labels)

    def _login(self, body: bytes) -> Answer:
        fields = {
            k: v[-1] for k, v in urllib.parse.parse_qs(body.decode("utf-8", "replace")).items()
        }
        write = fields.get("actions", "") in ("on", "1", "true", "yes")
        sid = self.sessions.login(fields.get("token", ""), write)
        if sid is None:
            return 401, [(b"content-type", b"text/plain"), *SECURITY], b"not the gateway's token"
        cookie = f"{COOKIE}={sid}; Max-Age={int(SESSION_TTL_S)}; Path={PREFIX}; HttpOnly; "
        return _redirect(PREFIX, (b"set-cookie", (cookie + "SameSite=Strict").encode()))

    async def _page(self, label: str, path: str) -> Answer:
        status, ctype, raw = await self.forward(label, "GET", path, "", b"")
        if path == PREFIX and ctype.startswith("text/html"):
            # Which console this is: the pool's, over these hosts (the page is the host's).
            raw = raw.replace(b"<title>drums console", b"<title>drums pool console", 1)
        return status, [(b"content-type", ctype.encode()), *SECURITY], raw

    async def _each(self, labels: List[str], path: str, query: str = "") -> Dict[str, Any]:
        # anyio, not asyncio.gather: the gateway runs on asyncio, its tests on trio.
        answers: List[Tuple[int, str, bytes]] = [(503, "", b"")] * len(labels)

        async def ask(i: int) -> None:
            answers[i] = await self.forward(labels[i], "GET", PREFIX + "/api" + path, query, b"")

        async with anyio.create_task_group() as group:
            for i in range(len(labels)):
                group.start_soon(ask, i)
        return {
            lb: json.loads(raw) for lb, (status, _, raw) in zip(labels, answers) if status == 200
        }

    async def _api(
        self,
        method: str,
        sub: str,
        query: str,
        headers: Dict[bytes, bytes],
        write: bool,
        labels: List[str],
    ) -> Answer:
        if method == "GET" and sub == "/session":
            return _json({"write": write, "version": "pool", "hosts": labels})
        if method == "GET" and sub == "/slots":
            return _json(merge_slots(await self._each(labels, sub)))
        if method == "GET" and sub == "/history":
            since = urllib.parse.parse_qs(query).get("since", [None])[-1]
            try:
                after = float(since) if since is not None else None
            except ValueError:
                return _refused(422, "invalid_request", "since: a sample's ts (seconds)")
            return _json(merge_history(await self._each(labels, sub, query), after))
        if method == "GET" and sub == "/records":
            return _json(merge_records(await self._each(labels, sub)))
        if method == "GET" and sub == "/host":
            per = await self._each(labels, sub)
            down = {lb: {"error": "host_down"} for lb in labels if lb not in per}
            health = merge_health({**{lb: b["health"] for lb, b in per.items()}, **down})
            metrics = merge_metrics({lb: b["metrics"] for lb, b in per.items()})
            return _json({"health": health, "metrics": metrics})
        for kind in ("/slots/", "/records/"):
            if sub.startswith(kind):
                label, own = split_host(sub[len(kind) :], labels)
                if label is None:
                    return _refused(404, "not_found", f"{sub}: name a pool host, h1~id")
                if method == "POST":
                    if not write:
                        return _refused(403, "forbidden", "this console session is read-only")
                    if headers.get(b"x-drums-console") != b"1":
                        return _refused(403, "forbidden", "actions need the X-Drums-Console header")
                elif method != "GET":
                    break
                return await self._host(label, method, PREFIX + "/api" + kind + own, query)
        return _refused(404, "not_found", f"no console data at {sub}")

    async def _host(self, label: str, method: str, path: str, query: str) -> Answer:
        status, ctype, raw = await self.forward(label, method, path, query, b"")
        if ctype.startswith("application/json") and raw:
            try:
                raw = json.dumps(tag_ids(json.loads(raw), label)).encode()
            except ValueError:
                pass
        extra: Headers = []
        if path.endswith("/download"):
            name = path.rsplit("/", 2)[-2]
            extra.append((b"content-disposition", f'attachment; filename="{name}"'.encode()))
        return status, [(b"content-type", ctype.encode()), *SECURITY, *extra], raw
