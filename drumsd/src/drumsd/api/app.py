"""The quart-trio app: routes from the table, bearer auth, the error envelope.

The app holds no desktops: it is handed a running Supervisor (started by `serve` in the root
nursery) and only translates HTTP to supervisor calls and back.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from typing import Any

from drums.models import ERROR_STATUS
from pydantic import BaseModel, ValidationError
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from drumsd.api.console import add_console, is_console_path
from drumsd.api.limits import (
    MAX_JSON_DEPTH,
    BodyBudget,
    TooDeep,
    declared_body_size,
    parse_json,
)
from drumsd.api.openapi import build_openapi
from drumsd.api.routes import ROUTES, Ctx, Raw, Route, handler_args
from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.runtime.supervisor import Supervisor

log = logging.getLogger("drumsd.api")

MAX_BODY_BYTES = 16 * 1024 * 1024
# Four bodies of the largest size may arrive from one peer at once; more wait for a 429.
PEER_BODY_BYTES = 4 * MAX_BODY_BYTES
OPEN_PATHS = frozenset({"/healthz"})


def error_response(
    code: str,
    message: str,
    detail: dict[str, Any] | None = None,
    *,
    status: int | None = None,
    retry_after_s: float | None = None,
) -> Response:
    body = {"error": {"code": code, "message": message, "detail": _jsonable(detail or {})}}
    if status is None and code not in ERROR_STATUS:
        # A code without a status is a failure behind the daemon (e.g. a task's setup), not a
        # crash of the daemon itself: a gateway error, logged so the code gets a status.
        log.warning("error code %r has no HTTP status in drums.models.ERROR_STATUS", code)
        status = 502
    response = Response(
        json.dumps(body),
        status=status or ERROR_STATUS[code],
        content_type="application/json",
    )
    if code == "overloaded" or retry_after_s:
        response.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s or 1)))
    if code == "unauthorized":
        response.headers["WWW-Authenticate"] = 'Bearer realm="drumsd"'
    return response


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _validation_detail(exc: ValidationError) -> dict[str, Any]:
    errors = [
        {"loc": ".".join(str(p) for p in e["loc"]) or "(body)", "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]
    return {"errors": errors[:50]}


def _describe(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    # With unions the first error is often "not a string"; the deepest one says what is wrong.
    first = max(errors, key=lambda e: len(e["loc"]))
    loc = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{loc}: {first['msg']}{more}"


async def _parse_body(route: Route) -> BaseModel | None:
    if route.request is None:
        return None
    raw = await request.get_data(as_text=False)
    if not raw.strip():
        if route.body_required:
            raise DrumsdError(
                "invalid_request",
                f"{route.method} {route.path} needs a JSON body ({route.request.__name__})",
            )
        return route.request()
    try:
        data = parse_json(raw, MAX_JSON_DEPTH)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DrumsdError("invalid_request", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DrumsdError(
            "invalid_request", f"the body must be a JSON object ({route.request.__name__})"
        )
    try:
        return route.request.model_validate(data)
    except ValidationError as exc:
        raise DrumsdError(
            "invalid_request",
            f"invalid {route.request.__name__}: {_describe(exc)}",
            **_validation_detail(exc),
        ) from None


def _unread(response: Response) -> Response:
    """A response sent with the request's body unread (it may be gigabytes, slow, or never
    sent): the connection closes after it, or the unread bytes would stall the next request on
    it until the server's timeout."""
    response.headers["Connection"] = "close"
    return response


def _to_response(route: Route, reply: Any) -> Response:
    if isinstance(reply, Raw):
        return Response(
            reply.body, status=route.status, content_type=reply.content_type, headers=reply.headers
        )
    return Response(reply.model_dump_json(), status=route.status, content_type="application/json")


def create_app(supervisor: Supervisor, config: Config, token: str) -> QuartTrio:
    app = QuartTrio("drumsd")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    expected = token.encode()
    openapi_doc = build_openapi(supervisor.version)
    openapi_doc["paths"]["/openapi.json"] = {
        "get": {
            "operationId": "openapi",
            "summary": "This schema",
            "responses": {
                "200": {
                    "description": "OpenAPI 3.1",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                "401": {
                    "description": "unauthorized",
                    "content": {
                        "application/json": {
                            "schema": {"$ref": "#/components/schemas/ErrorEnvelope"}
                        }
                    },
                },
            },
        }
    }
    openapi_text = json.dumps(openapi_doc)

    app.config["BODY_TIMEOUT"] = config.body_timeout_s
    bodies = BodyBudget(PEER_BODY_BYTES, unknown_size=MAX_BODY_BYTES)

    def bearer_ok() -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)

    @app.before_request
    async def _authenticate() -> Response | None:
        # The token is checked at the headers: a caller without it never has a body read
        # (issue 39, D6). /console checks its own session cookie (api/console.py).
        declared = declared_body_size(
            request.content_length, request.headers.get("Transfer-Encoding")
        )
        if not (request.path in OPEN_PATHS or is_console_path(request.path) or bearer_ok()):
            refused = error_response(
                "unauthorized",
                "missing or wrong bearer token: send Authorization: Bearer <token from token_file>",
            )
            return refused if declared == 0 else _unread(refused)
        if declared == 0 or (declared or 0) > MAX_BODY_BYTES:
            await request.get_data()  # nothing to wait for, or the 413 at once
            return None
        size = bodies.unknown_size if declared is None else declared
        peer = request.remote_addr or "unknown"
        if not bodies.take(peer, size):
            return _unread(
                error_response(
                    "overloaded",
                    f"{peer} already has {bodies.held(peer)} bytes of request bodies arriving "
                    f"(at most {bodies.per_peer} at once); retry when they have arrived",
                    {"peer": peer, "in_flight_bytes": bodies.held(peer), "limit": bodies.per_peer},
                    retry_after_s=1,
                )
            )
        try:
            # Receive the whole body before answering, within body_timeout_s (a RequestTimeout,
            # the 408 below, after it): a response sent while a body is still unread can stall
            # the next request on the same keep-alive connection (hypercorn h11).
            await request.get_data()
        finally:
            bodies.give_back(peer, size)
        return None

    def make_view(route: Route):
        async def view(**path: str) -> Response:
            try:
                body = await _parse_body(route)
            except TooDeep as exc:
                # A structural limit like the size's 413, not a field's 422.
                return error_response("invalid_request", str(exc), {"limit": exc.limit}, status=400)
            ctx = Ctx(supervisor=supervisor, config=config, query=dict(request.args))
            reply = await route.handler(ctx, **handler_args(route, body, path))
            return _to_response(route, reply)

        view.__name__ = route.name
        return view

    for route in ROUTES:
        app.add_url_rule(route.quart_path, route.name, make_view(route), methods=[route.method])

    async def openapi_view() -> Response:
        return Response(openapi_text, content_type="application/json")

    app.add_url_rule("/openapi.json", "openapi", openapi_view, methods=["GET"])
    add_console(app, supervisor, config, token)

    @app.errorhandler(DrumsdError)
    async def _drumsd_error(exc: DrumsdError) -> Response:
        if ERROR_STATUS.get(exc.code, 500) >= 500:
            log.warning("%s %s -> %s: %s", request.method, request.path, exc.code, exc.message)
        return error_response(exc.code, exc.message, exc.detail, retry_after_s=exc.retry_after_s)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if status == 404:
            return error_response(
                "not_found", f"no route {request.method} {request.path}; see /openapi.json"
            )
        if status == 405:
            return error_response(
                "invalid_request",
                f"{request.method} is not allowed on {request.path}",
                status=405,
            )
        if status == 408:
            return _unread(
                error_response(
                    "invalid_request",
                    f"the request body did not arrive within {config.body_timeout_s:g} s "
                    "(body_timeout_s); the connection is closed: send the whole body at once",
                    {"limit_s": config.body_timeout_s},
                    status=408,
                )
            )
        if status == 413:
            return _unread(
                error_response(
                    "invalid_request", f"the body is larger than {MAX_BODY_BYTES} bytes", status=413
                )
            )
        if status >= 500:
            log.error("%s %s -> HTTP %s", request.method, request.path, status)
            return error_response("runtime_error", exc.description or "server error", status=500)
        return error_response("invalid_request", exc.description or exc.name, status=status)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(
            "runtime_error",
            f"unexpected {type(exc).__name__} in drumsd; see the daemon log and report it",
            status=500,
        )

    return app
