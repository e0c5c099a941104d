"""Every error class, raised by the sync and the async client (under asyncio and trio).

Daemon error codes are injected in front of the app (FaultInjector), so these tests check the
SDK's mapping whatever app is served; the natural ones (404, 410, 401, 423) come from the app.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable

import pytest
from sdk_harness import TOKEN, Daemon

import drums
from drums import models as m
from drums._exceptions import ERROR_CLASSES

Run = Callable[..., Any]
CODES = sorted(ERROR_CLASSES)
GATES = "/v1/slots/{}/gates"


def check(err: drums.DrumsError, code: str, env_id: str) -> None:
    assert type(err) is ERROR_CLASSES[code]
    assert err.code == code and err.env_id == env_id and err.status == m.ERROR_STATUS[code]
    assert "injected" in err.message and env_id in str(err)


@pytest.mark.parametrize("code", CODES)
def test_each_daemon_code_raises_its_class_sync(daemon: Daemon, code: str) -> None:
    with daemon.client() as client:
        env = client.create()
        daemon.faults.error("GET", GATES.format(env.id), code, detail={"why": 1}, times=10)
        with pytest.raises(drums.DrumsError) as err:
            env.gates()
        check(err.value, code, env.id)
        assert err.value.detail["why"] == 1


@pytest.mark.parametrize("code", CODES)
def test_each_daemon_code_raises_its_class_async(daemon: Daemon, run_async: Run, code: str) -> None:
    async def body() -> None:
        async with daemon.aclient() as client:
            env = await client.create()
            daemon.faults.error("GET", GATES.format(env.id), code, times=10)
            with pytest.raises(drums.DrumsError) as err:
                await env.gates()
            check(err.value, code, env.id)

    run_async(body)


def test_overloaded_is_retried_then_succeeds_or_gives_up(daemon: Daemon, run_async: Run) -> None:
    faults = daemon.faults
    faults.error("POST", "/v1/slots", "overloaded", headers={"Retry-After": "0"}, times=2)
    with daemon.client() as client:
        client.create()
        assert faults.count("POST", "/v1/slots") == 3
        faults.error("POST", "/v1/slots", "overloaded", headers={"Retry-After": "0"}, times=99)
        with pytest.raises(drums.Overloaded, match="gave up after 4 attempt") as err:
            client.create()
        assert err.value.retry_after_s == 0.0
    assert faults.count("POST", "/v1/slots") == 3 + 4  # 1 try + 3 retries (FAST_RETRY)

    async def body() -> None:
        faults.faults.clear()
        faults.error("POST", "/v1/slots", "overloaded", headers={"Retry-After": "0"}, times=2)
        async with daemon.aclient() as client:
            await client.create()

    before = faults.count("POST", "/v1/slots")
    run_async(body)
    assert faults.count("POST", "/v1/slots") - before == 3


def test_retry_after_is_honoured(daemon: Daemon, run_async: Run) -> None:
    policy = drums.RetryPolicy(max_retries=1, base_s=0.0, max_s=5.0, jitter=0.0)
    daemon.faults.error("GET", "/v1/health", "overloaded", headers={"Retry-After": "0.3"})
    with daemon.client(retry=policy) as client:
        started = time.monotonic()
        client.health()
        assert time.monotonic() - started >= 0.3

    async def body() -> float:
        import anyio

        daemon.faults.error("GET", "/v1/health", "overloaded", headers={"Retry-After": "0.3"})
        async with daemon.aclient(retry=policy) as client:
            started = anyio.current_time()
            await client.health()
            return anyio.current_time() - started

    assert run_async(body) >= 0.3


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_connection_failed_is_ours_not_httpx(run_async: Run) -> None:
    url = _closed_port_url()
    with drums.connect(url, TOKEN) as client:
        with pytest.raises(drums.ConnectionFailed, match="cannot reach drumsd") as err:
            client.health()
    assert err.value.__cause__ is not None  # the httpx error is chained, not raised

    async def body() -> None:
        async with drums.aconnect(url, TOKEN) as client:
            with pytest.raises(drums.ConnectionFailed):
                await client.list_envs()

    run_async(body)


def test_a_wedged_call_times_out(daemon: Daemon, run_async: Run) -> None:
    quick = drums.Timeouts(default_s=0.3)
    daemon.faults.hang("GET", "/v1/tasks")
    with daemon.client(timeout=quick) as client:
        started = time.monotonic()
        with pytest.raises(drums.Timeout, match=r"no answer within 0\.3 s"):
            client.tasks()
        assert time.monotonic() - started < 5

    async def body() -> None:
        daemon.faults.hang("GET", "/v1/tasks")
        async with daemon.aclient(timeout=quick) as client:
            with pytest.raises(drums.Timeout):
                await client.tasks()
            assert await client.tasks()  # the next call is fine

    run_async(body)


def test_answers_the_sdk_cannot_read(daemon: Daemon, run_async: Run) -> None:
    faults = daemon.faults
    faults.respond("GET", "/v1/health", 200, {"nonsense": True})
    faults.respond("GET", "/v1/metrics", 500, b"<html>proxy error</html>")
    faults.respond("GET", "/v1/tasks", 409, {"error": {"code": "brand_new", "message": "hm"}})
    with daemon.client() as client:
        with pytest.raises(drums.BadResponse, match="versions"):
            client.health()
        with pytest.raises(drums.DaemonUnavailable, match="without an error envelope"):
            client.metrics()
        with pytest.raises(drums.Conflict) as err:  # unknown code: class from the status
            client.tasks()
        assert err.value.code == "brand_new"

    async def body() -> None:
        faults.respond("GET", "/v1/health", 200, {"nonsense": True})
        async with daemon.aclient() as client:
            with pytest.raises(drums.BadResponse):
                await client.health()

    run_async(body)


def test_natural_errors_from_the_app(daemon: Daemon, run_async: Run) -> None:
    with daemon.client() as client:
        with pytest.raises(drums.NotFound):
            client.attach("no-such-env")
        with pytest.raises(drums.NotFound):
            client.create(from_state="no-such-state")
        with pytest.raises(drums.UnsupportedTask, match="googledrive"):
            client.create(task="task-gdrive")
        env = client.create()
        env.close()
        with pytest.raises(drums.EnvGone):
            env.observe()

    async def body() -> None:
        async with daemon.aclient(token="wrong") as bad:
            with pytest.raises(drums.Unauthorized):
                await bad.list_envs()
        async with daemon.aclient() as client:
            env = await client.create()
            await env.quarantine("test")
            with pytest.raises(drums.Quarantined):
                await env.verify()
            with pytest.raises(drums.NotFound):
                await client.task("no-such-task")

    run_async(body)


def test_bad_arguments_fail_before_any_request(daemon: Daemon) -> None:
    with daemon.client() as client:
        env = client.create()
        sent = len(daemon.faults.seen)
        with pytest.raises(drums.InvalidRequest, match="type"):
            env.step({"type": "teleport"})
        with pytest.raises(drums.InvalidRequest):
            env.quarantine("")
        with pytest.raises(drums.InvalidRequest, match="idle_timeout_s"):
            client.create(idle_timeout_s=-1)
        with pytest.raises(drums.InvalidRequest):
            with env.fork(0):
                pass
        with pytest.raises(drums.InvalidRequest, match="ttl_s"):
            env.save(ttl_s=-1)
        with pytest.raises(drums.InvalidRequest, match="timeout_s"):
            env.verify(strict=False, timeout=0)
        with pytest.raises(drums.InvalidRequest, match="timeout_s"):
            env.wait_quiescent(timeout=-5)
        assert len(daemon.faults.seen) == sent


def _report(env_id: str, status: str) -> dict[str, Any]:
    gates = [
        {"name": "guest_ready", "status": "pass"},
        {"name": "alive_after_resume", "status": status},
    ]
    valid = {"pass": True, "fail": False, "pending": None}[status]
    failed = ["alive_after_resume"] if status == "fail" else []
    return {"slot": env_id, "episode": 1, "episode_id": "e", "profile": "hardened",
            "gates": gates, "valid": valid, "failed": failed}  # fmt: skip


def test_wait_valid_polls_pending_gates_and_raises_on_a_failed_one(
    daemon: Daemon, run_async: Run
) -> None:
    with daemon.client() as client:
        env = client.create()
        path = GATES.format(env.id)
        daemon.faults.respond("GET", path, 200, _report(env.id, "pending"), times=2)
        assert env.wait_valid(timeout=10).valid is True
        assert daemon.faults.count("GET", path) == 3

        daemon.faults.respond("GET", path, 200, _report(env.id, "pending"), times=1000)
        with pytest.raises(drums.Timeout, match="pending"):
            env.wait_valid(timeout=0.3)
        daemon.faults.faults.clear()

        env.quarantine("a gate failed")  # the app's not_quarantined gate now fails
        with pytest.raises(drums.InvalidEpisode) as err:
            env.wait_valid()
        assert err.value.failed_gates == ["not_quarantined"] and err.value.env_id == env.id

    async def body() -> None:
        async with daemon.aclient() as client:
            env = await client.create()
            path = GATES.format(env.id)
            daemon.faults.respond("GET", path, 200, _report(env.id, "pending"), times=1)
            daemon.faults.respond("GET", path, 200, _report(env.id, "fail"), times=1)
            with pytest.raises(drums.InvalidEpisode) as err:
                await env.wait_valid(timeout=10)
            assert err.value.failed_gates == ["alive_after_resume"]
            daemon.faults.respond("GET", path, 200, _report(env.id, "pending"), times=1000)
            with pytest.raises(drums.Timeout):
                await env.wait_valid(timeout=0.3)
            daemon.faults.faults.clear()

    run_async(body)


def _verdict(env_id: str, **fields: Any) -> dict[str, Any]:
    base = {"slot": env_id, "episode": 1, "task_id": "task-ok", "score": 1.0, "valid": True,
            "verdict": "valid"}  # fmt: skip
    return dict(base, **fields)


def test_strict_verify_never_returns_an_untrainable_reward(daemon: Daemon, run_async: Run) -> None:
    invalid = {
        "score": None,
        "valid": False,
        "verdict": "invalid",
        "invalid_reasons": ["gate no_app_crash failed"],
        "failed_gates": ["no_app_crash"],
    }
    no_score = {"score": None, "checker_error": "ZeroDivisionError"}
    with daemon.client() as client:
        env = client.create(task="task-ok")
        path = f"/v1/slots/{env.id}/verify"
        daemon.faults.respond("POST", path, 200, _verdict(env.id, **invalid), times=2)
        with pytest.raises(drums.InvalidEpisode) as err:
            env.verify()
        assert err.value.failed_gates == ["no_app_crash"]
        assert err.value.invalid_reasons == ["gate no_app_crash failed"]
        assert env.verify(strict=False).valid is False
        daemon.faults.respond("POST", path, 200, _verdict(env.id, **no_score), times=2)
        with pytest.raises(drums.CheckerFailed, match="ZeroDivisionError"):
            env.verify()
        assert env.verify(strict=False).score is None

    async def body() -> None:
        async with daemon.aclient() as client:
            env = await client.create(task="task-ok")
            path = f"/v1/slots/{env.id}/verify"
            daemon.faults.respond("POST", path, 200, _verdict(env.id, **invalid))
            with pytest.raises(drums.InvalidEpisode):
                await env.verify()
            daemon.faults.respond("POST", path, 200, _verdict(env.id, **no_score))
            with pytest.raises(drums.CheckerFailed):
                await env.verify()

    run_async(body)
