"""/console: every desktop of this host on one page, for an operator to look rather than read.

Behind the daemon's token like the API, but through a session: the login form posts the token
once and gets an HttpOnly, SameSite=Strict cookie back. Sessions are read-only unless actions
were asked for at login; actions also need the X-Drums-Console header (a cross-site form cannot
send it). Assets are this package's own files: the page works on a host without internet.
"""

from __future__ import annotations

import json
import logging
import tarfile
import urllib.parse
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import trio
import zstandard
from quart import Response, request
from quart_trio import QuartTrio

from drumsd.api import console_records, console_view, convert
from drumsd.api.console_frames import Frames, Picture
from drumsd.api.console_sessions import BEARER, COOKIE, SESSION_TTL_S, Session, Sessions
from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.runtime.supervisor import Supervisor

log = logging.getLogger("drumsd.console")

PREFIX = "/console"
ACTION_HEADER = "X-Drums-Console"
ASSETS = {
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def is_console_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def _asset(name: str) -> bytes:
    return resources.files("drumsd.api").joinpath("console_assets", name).read_bytes()


def _page(name: str, status: int = 200, **fill: str) -> Response:
    text = _asset(name).decode()
    for key, value in fill.items():
        text = text.replace("{{" + key + "}}", value)
    return _secure(Response(text, status=status, content_type="text/html; charset=utf-8"))


def _secure(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def _json(body: Any, status: int = 200) -> Response:
    return _secure(Response(json.dumps(body), status=status, content_type="application/json"))


def _refused(message: str, status: int = 401) -> Response:
    code = "unauthorized" if status == 401 else "forbidden"
    return _json({"error": {"code": code, "message": message, "detail": {}}}, status)


def _picture(picture: Picture | None, slot_id: str) -> Response:
    if picture is None:
        return _json(
            {
                "error": {
                    "code": "conflict",
                    "message": f"slot {slot_id} has no screen to show yet; retry shortly",
                    "detail": {"slot": slot_id},
                }
            },
            409,
        )
    etag = f'"{picture.etag}"'
    if request.headers.get("If-None-Match") == etag:
        response = Response(b"", status=304)
    else:
        response = Response(picture.png, content_type="image/png")
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = "private, no-cache"
    response.headers.update(SECURITY_HEADERS)
    return response


def add_console(app: QuartTrio, supervisor: Supervisor, config: Config, token: str) -> Sessions:
    """Register /console on `app`; returns its sessions (tests look at them)."""
    sessions = Sessions(token)
    frames = Frames(supervisor.glance)
    app.extensions["drums_console"] = {"sessions": sessions, "frames": frames}

    def session() -> Session | None:
        return sessions.get(request.cookies.get(COOKIE)) or sessions.bearer(
            request.headers.get("Authorization", "")
        )

    def route(path: str, name: str, methods: tuple[str, ...] = ("GET",)):
        def register(view: Callable[..., Awaitable[Response]]):
            app.add_url_rule(PREFIX + path, "console_" + name, view, methods=list(methods))
            return view

        return register

    def api(path: str, name: str, *, write: bool = False):
        """A JSON/PNG view that needs a session (a write session and the header for actions)."""

        def register(view: Callable[..., Awaitable[Response]]):
            async def guarded(**kw: str) -> Response:
                current = session()
                if current is None:
                    return _refused("no console session: log in at /console/login")
                if write and current is not BEARER:
                    if not current.write:
                        return _refused(
                            "this console session is read-only: log in again with actions on",
                            403,
                        )
                    if request.headers.get(ACTION_HEADER) != "1":
                        return _refused(f"console actions need the {ACTION_HEADER} header", 403)
                return await view(**kw)

            guarded.__name__ = view.__name__
            app.add_url_rule(
                PREFIX + "/api" + path,
                "console_api_" + name,
                guarded,
                methods=["POST" if write else "GET"],
            )
            return view

        return register

    # --- pages ------------------------------------------------------------------------------

    @route("", "index")
    async def index() -> Response:
        if session() is None:
            return _secure(Response("", status=303, headers={"Location": PREFIX + "/login"}))
        return _page("console.html")

    @route("/login", "login_form")
    async def login_form() -> Response:
        return _page("login.html", message="")

    @route("/login", "login", ("POST",))
    async def login() -> Response:
        fields = _form(await request.get_data(as_text=True))
        write = fields.get("actions", "") in ("on", "1", "true", "yes")
        new = sessions.login(fields.get("token", ""), write=write)
        if new is None:
            log.warning("console login refused from %s: wrong token", request.remote_addr)
            return _page("login.html", 401, message="That is not this daemon's token.")
        log.info("console login from %s (%s)", request.remote_addr, "actions" if write else "read")
        response = _secure(Response("", status=303, headers={"Location": PREFIX}))
        response.set_cookie(
            COOKIE,
            new.id,
            max_age=int(SESSION_TTL_S),
            path=PREFIX,
            httponly=True,
            samesite="Strict",
            secure=request.scheme == "https",
        )
        return response

    @route("/logout", "logout", ("POST",))
    async def logout() -> Response:
        sessions.logout(request.cookies.get(COOKIE))
        response = _secure(Response("", status=303, headers={"Location": PREFIX + "/login"}))
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    @route("/static/<name>", "static")
    async def static(name: str) -> Response:
        if name not in ASSETS:
            raise DrumsdError("not_found", f"no console asset {name!r}")
        response = Response(_asset(name), content_type=ASSETS[name])
        response.headers["Cache-Control"] = "no-cache"
        response.headers.update(SECURITY_HEADERS)
        return response

    # --- data -------------------------------------------------------------------------------

    @api("/session", "session")
    async def session_info() -> Response:
        current = session()
        return _json({"write": bool(current and current.write), "version": supervisor.version})

    @api("/slots", "slots")
    async def slots() -> Response:
        now = supervisor.clock()
        live = supervisor.list_slots()
        rows = [
            console_view.slot_row(r, now, supervisor.console.last_verify.get(r.id)) for r in live
        ]
        frames.forget_except({r.id for r in live})
        return _json({"slots": rows, "facets": console_view.facets(rows)})

    @api("/host", "host")
    async def host() -> Response:
        health = convert.health(await supervisor.health()).model_dump(mode="json")
        metrics = convert.metrics(supervisor.metrics_report()).model_dump(mode="json")
        return _json({"health": health, "metrics": metrics})

    @api("/history", "history")
    async def history() -> Response:
        # The host's samples over time for the charts; `since` (a sample's ts) sends only newer.
        try:
            since = float(request.args["since"]) if "since" in request.args else None
        except ValueError:
            raise DrumsdError(
                "invalid_request", "since: a sample's ts (seconds since the epoch)", field="since"
            ) from None
        return _json(supervisor.console.history.as_json(since))

    @api("/slots/<slot_id>", "slot")
    async def slot(slot_id: str) -> Response:
        rec = supervisor.get_slot(slot_id, renew=False)
        last = supervisor.console.last_verify.get(slot_id)
        return _json(
            {
                "slot": console_view.slot_row(rec, supervisor.clock(), last),
                "gates": convert.gate_report(rec).model_dump(mode="json"),
                "verify": last.model_dump(mode="json") if last is not None else None,
                "latencies": {
                    op: h.summary() for op, h in supervisor.slot_latency.get(slot_id, {}).items()
                },
            }
        )

    @api("/slots/<slot_id>/timeline", "timeline")
    async def slot_timeline(slot_id: str) -> Response:
        # Read from the journal's event file on request only (the page asks once, not per tick).
        supervisor.get_slot(slot_id, renew=False)
        lines = await supervisor.store.events_of(slot_id)
        events = await trio.to_thread.run_sync(console_view.timeline, lines)
        return _json({"slot": slot_id, "events": events})

    @api("/slots/<slot_id>/episode", "episode")
    async def slot_episode(slot_id: str) -> Response:
        # The current episode step by step: the steps the daemon kept in memory, with the
        # journal's events and gate changes of the same episode (read on request, like above).
        rec = supervisor.get_slot(slot_id, renew=False)
        steps = [s.as_json() for s in supervisor.console.step_log.of(slot_id, rec.episode_id)]
        lines = await supervisor.store.events_of(slot_id)
        entries = await trio.to_thread.run_sync(
            console_view.episode_timeline, lines, steps, rec.episode_id, rec.episode_started_at
        )
        return _json(
            {
                "slot": slot_id,
                "episode": rec.episode,
                "episode_id": rec.episode_id,
                "started_at": rec.episode_started_at,
                "actions": rec.actions,
                "steps_kept": len(steps),
                "entries": entries,
            }
        )

    @api("/slots/<slot_id>/thumbnail", "thumbnail")
    async def thumbnail(slot_id: str) -> Response:
        return _picture(await frames.thumbnail(slot_id), slot_id)

    @api("/slots/<slot_id>/frame", "frame")
    async def frame(slot_id: str) -> Response:
        return _picture(await frames.frame(slot_id), slot_id)

    # --- failure records: what destroyed slots left in forgotten_dir ----------------------------

    forgotten = config.forgotten_dir

    async def record_path(name: str):
        path = await trio.to_thread.run_sync(console_records.find_record, forgotten, name)
        if path is None:
            raise DrumsdError(
                "not_found", f"no failure record {name!r} in {forgotten}; list them first"
            )
        return path

    @api("/records", "records")
    async def records() -> Response:
        rows = await trio.to_thread.run_sync(console_records.list_records, forgotten)
        return _json({"records": rows, "dir": str(forgotten)})

    @api("/records/<name>", "record")
    async def record(name: str) -> Response:
        path = await record_path(name)
        try:
            body = await trio.to_thread.run_sync(console_records.read_record, path)
        except (OSError, ValueError, EOFError, zstandard.ZstdError, tarfile.TarError) as exc:
            raise DrumsdError(
                "runtime_error", f"failure record {path} cannot be read: {exc}", path=str(path)
            ) from None
        return _json({"name": name, **body})

    @api("/records/<name>/screenshot", "record_screenshot")
    async def record_screenshot(name: str) -> Response:
        path = await record_path(name)
        png = await trio.to_thread.run_sync(console_records.read_screenshot, path)
        if png is None:
            raise DrumsdError("not_found", f"failure record {name} kept no screenshot")
        return _secure(Response(png, content_type="image/png"))

    @api("/records/<name>/download", "record_download")
    async def record_download(name: str) -> Response:
        path = await record_path(name)
        data = await trio.to_thread.run_sync(path.read_bytes)
        kind = "application/zstd" if name.endswith(".zst") else "application/json"
        response = _secure(Response(data, content_type=kind))
        response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    @api("/slots/<slot_id>/destroy", "destroy", write=True)
    async def destroy(slot_id: str) -> Response:
        rec, already = await supervisor.destroy(slot_id, reason="console")
        log.info("slot %s destroyed from the console", slot_id)
        return _json({"id": rec.id, "destroyed": True, "already": already})

    @api("/slots/<slot_id>/quarantine", "quarantine", write=True)
    async def quarantine(slot_id: str) -> Response:
        rec = await supervisor.quarantine(slot_id, "quarantined from the console")
        return _json({"id": rec.id, "state": rec.status.value})

    @api("/slots/<slot_id>/release", "release", write=True)
    async def release(slot_id: str) -> Response:
        rec = await supervisor.release(slot_id)
        return _json({"id": rec.id, "state": rec.status.value})

    return sessions


def _form(raw: str) -> dict[str, str]:
    """A urlencoded or JSON body as one value per field."""
    raw = raw.strip()
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    return {k: v[-1] for k, v in urllib.parse.parse_qs(raw, keep_blank_values=True).items()}
