"""Scenario: the daemon starts, made its own token (0600, outside the config), and answers with it.

Needs no desktop: runs against any drumsd runtime.
"""

from __future__ import annotations

import shlex

from drums_http import DrumsHttp, MachineLike, Subtest, Target, check, plain_subtest

AUTHENTICATED_ROUTES = ("/v1/health", "/v1/slots", "/v1/checkpoints", "/v1/metrics", "/v1/tasks")


def run(machine: MachineLike, target: Target = Target(), subtest: Subtest = plain_subtest) -> None:
    api = DrumsHttp(machine, target)

    with subtest("the unit starts and listens"):
        machine.wait_for_unit(target.unit)
        machine.wait_for_open_port(target.port, target.host)
        api.wait_healthy()

    with subtest("a token was created: 32+ characters, mode 0600, owned by root"):
        mode_owner = machine.succeed(f"stat -c '%a %u' {shlex.quote(target.token_file)}").split()
        check(mode_owner[0] == "600", f"token file mode is {mode_owner[0]}, expected 600")
        token = machine.succeed(f"cat {shlex.quote(target.token_file)}").strip()
        check(len(token) >= 32, f"token is {len(token)} characters, expected 32 or more")

    if target.config_path is not None:
        with subtest("the token is not in the generated config"):
            machine.succeed(f"test -r {shlex.quote(target.config_path)}")
            machine.fail(f"grep -qF {shlex.quote(token)} {shlex.quote(target.config_path)}")

    with subtest("/healthz answers without a token"):
        reply = api.request("GET", "/healthz", token=False)
        check(reply.status == 200, f"/healthz answered {reply.status}: {reply.raw}")

    with subtest("every authenticated route refuses no token and a wrong token"):
        for route in AUTHENTICATED_ROUTES:
            for token_value in (False, "x" * 40, token + "x"):
                reply = api.request("GET", route, token=token_value)
                check(
                    reply.status == 401 and reply.error_code == "unauthorized",
                    f"GET {route} with token {'none' if token_value is False else 'wrong'} "
                    f"answered {reply.status} {reply.raw[:300]}, expected 401 unauthorized",
                )

    with subtest("the right token is accepted"):
        health = api.ok("GET", "/v1/health")
        check(health.get("status") in ("ok", "degraded"), f"health: {health!r}")
        check(bool(health.get("version")), f"health has no version: {health!r}")
