"""The design's documented config fields and routes, each with its status in this daemon, worked
out from the code (the config model, core/config_compat.py's mapping, the API's route table), so
docs/runtime.md's table cannot drift: a test renders it and compares.

The lists below are the design's (DESIGN.md, "Configuration" and "The daemon's API", and the
seed's field table as the design issues quote it); a test checks them against DESIGN.md where that
file is present.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel

from drumsd.api.routes import ROUTES
from drumsd.core import config_compat
from drumsd.core.config import Config

DOCUMENTED_FIELDS = (
    "listen",
    "allow_remote",
    "token_file",
    "state_dir",
    "journal_dir",
    *config_compat.OSW_KEYS,  # the runtime block: lower .. restore_cpu_boost, in its order
    "prefork_max_age_s",
    "crash_watch",
    "host_usd_per_hour",
    "quiesce.window_s",
    "quiesce.timeout_s",
    "quiesce.poll_ms",
    "quiesce.max_attempts",
    "quiesce.events",
    "admission.enabled",
    "admission.min_available_pct",
    "admission.min_available_mib",
    "admission.env_mib",
    "admission.capture_mib",
    "admission.max_memory_psi_some_avg10",
    "admission.min_state_free_mib",
    "lease.env_idle_timeout_s",
    "lease.env_ttl_s",
    "lease.state_idle_timeout_s",
    "lease.state_ttl_s",
    "lease.reap_interval_s",
    "retention.mode",
    "retention.summary_max_gib",
    "retention.full_max_gib",
    "forgotten_dir",
    "state_min_free_mib",
    "state_warn_free_pct",
    "tasks",
    # The seed's table, as the design issues name its keys.
    *(f"{config_compat.OSW_BLOCK}.{k}" for k in config_compat.OSW_KEYS),
    *config_compat.UNUSED,
    "extra_ports",
    "netns_fast",
    "restore_cpu_weight",
    "daemon_cpu_weight",
    "prefork_quiesce_window_s",
    "criu_log_level",
    "procview_dir",
)

# Documented and not in this daemon: why (a row without a reason is a test failure).
NOT_BUILT: dict[str, str] = {}

DOCUMENTED_ROUTES = (
    "GET /healthz",
    "GET /v1/health",
    "GET /v1/metrics",
    "POST /v1/metrics/reset",
    "GET /metrics",
    "GET /openapi.json",
    "GET /v1/checkpoints",
    "POST /v1/checkpoints",
    "GET /v1/checkpoints/{id}",
    "DELETE /v1/checkpoints/{id}",
    "GET /v1/slots",
    "POST /v1/slots",
    "GET /v1/slots/{id}",
    "DELETE /v1/slots/{id}",
    "POST /v1/slots/{id}/reset",
    "POST /v1/slots/{id}/step",
    "GET /v1/slots/{id}/screenshot",
    "GET /v1/slots/{id}/gates",
    "POST /v1/slots/{id}/capture",
    "POST /v1/slots/{id}/branch",
    "POST /v1/slots/{id}/prefork",
    "POST /v1/slots/{id}/quiescent",
    "POST /v1/slots/{id}/task",
    "POST /v1/slots/{id}/verify",
    "GET /v1/slots/{id}/metrics",
    "POST /v1/slots/{id}/quarantine",
    "POST /v1/slots/{id}/release",
    "GET /v1/tasks",
    "GET /v1/tasks/{id}",
)
# Served outside the route table (api/app.py answers it from the same models).
SERVED_APART = {"GET /openapi.json": "implemented (api/openapi.py, from the pydantic models)"}


@dataclass(frozen=True)
class Row:
    what: str
    status: str


def field_status(key: str) -> str:
    if _model_has(Config, key):
        return "implemented"
    for rule in config_compat.rules():
        if rule.key == key:
            return f"{rule.status}: {rule.here}"
    return NOT_BUILT.get(key, "missing")


def route_status(route: str) -> str:
    if route in SERVED_APART:
        return SERVED_APART[route]
    served = {f"{r.method} {_generic(r.path)}": r for r in ROUTES}
    found = served.get(route)
    if found is None:
        return "missing"
    if found.deprecated:
        fork = served.get(route.replace("/branch", "/fork"))
        named = f" of `{fork.method} {_generic(fork.path)}`" if fork else ""
        return f"implemented (a deprecated alias{named})"
    return "implemented"


def rows() -> list[Row]:
    return [Row(f"`{k}`", field_status(k)) for k in DOCUMENTED_FIELDS] + [
        Row(f"`{r}`", route_status(r)) for r in DOCUMENTED_ROUTES
    ]


def render() -> str:
    lines = ["| documented field or route | status here |", "|---|---|"]
    lines += [f"| {row.what} | {row.status} |" for row in rows()]
    return "\n".join(lines) + "\n"


def _generic(path: str) -> str:
    return re.sub(r"\{[a-z_]+\}", "{id}", path)


def _model_has(model: type[BaseModel], dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    info = model.model_fields.get(head)
    if info is None:
        return False
    if not rest:
        return True
    inner = info.annotation
    return isinstance(inner, type) and issubclass(inner, BaseModel) and _model_has(inner, rest)
