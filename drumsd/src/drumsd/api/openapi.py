"""/openapi.json (OpenAPI 3.1), generated from the route table and the wire models."""

from __future__ import annotations

from typing import Any, Literal

from drums import models as wire
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from drumsd.api.routes import ROUTES, Route

REF = "#/components/schemas/{model}"

ERROR_RESPONSES = {
    "401": "missing or wrong bearer token (unauthorized)",
    "404": "unknown slot, checkpoint or task (not_found)",
    "410": "the slot was destroyed (env_gone)",
    "422": "malformed JSON, wrong types or out-of-range values (invalid_request)",
    "429": "admission refused (overloaded); see Retry-After",
}


def build_openapi(version: str) -> dict[str, Any]:
    Mode = Literal["validation", "serialization"]
    models: list[tuple[type[BaseModel], Mode]] = [(wire.ErrorEnvelope, "serialization")]
    for route in ROUTES:
        if route.request is not None:
            models.append((route.request, "validation"))
        if route.response is not None:
            models.append((route.response, "serialization"))
    unique = list(dict.fromkeys(models))
    keys, schema = models_json_schema(unique, ref_template=REF)
    components = schema.get("$defs", {})
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, keys)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "drumsd",
            "version": version,
            "description": "Isolated Linux desktops restored from CRIU checkpoints, as RL "
            "environments. Every route but /healthz needs Authorization: Bearer <token>.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _ref(keys: dict[Any, Any], model: type[BaseModel], mode: str) -> dict[str, Any]:
    return keys[(model, mode)]


def _operation(route: Route, keys: dict[Any, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": route.name, "summary": route.summary}
    if route.deprecated:
        op["deprecated"] = True
    if not route.auth:
        op["security"] = []
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in route.path_params
    ]
    params += [
        {
            "name": q.name,
            "in": "query",
            "required": False,
            "description": q.description,
            "schema": {"type": q.kind},
        }
        for q in route.query
    ]
    if params:
        op["parameters"] = params
    if route.request is not None:
        op["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": _ref(keys, route.request, "validation")}},
        }
    if route.response is not None:
        content = {"application/json": {"schema": _ref(keys, route.response, "serialization")}}
    elif route.content_type == "image/png":
        content = {"image/png": {"schema": {"type": "string", "format": "binary"}}}
    elif route.content_type == "text/plain":
        content = {"text/plain": {"schema": {"type": "string"}}}
    else:
        content = {"application/json": {"schema": {"type": "object"}}}
    error = {
        "content": {"application/json": {"schema": _ref(keys, wire.ErrorEnvelope, "serialization")}}
    }
    responses: dict[str, Any] = {str(route.status): {"description": "success", "content": content}}
    for code, text in ERROR_RESPONSES.items():
        if code == "401" and not route.auth:
            continue
        responses[code] = {"description": text, **error}
    responses["default"] = {"description": "an error, in the envelope", **error}
    op["responses"] = responses
    return op
