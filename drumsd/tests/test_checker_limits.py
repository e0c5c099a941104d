"""Issue 39, D5: checker calls run under a memory and a CPU limit and a bound on how many run at
once, which admission counts. A 63 MiB XML drove one checker to 1.5 GiB and 30.7 s outside every
limit. The calls here run in the real checker venv, through the resident worker and as fresh
processes; the live proof through verify is tests/live/test_checker_isolation_live.py."""

from __future__ import annotations

import dataclasses
import resource
import signal
import time
from pathlib import Path

import pytest
import trio
from drumsd.core.admission import HostSample
from drumsd.tasks.checker import (
    CheckerCall,
    CheckerOutcome,
    CheckerSlots,
    run_checker,
    verifier_call,
)
from drumsd.tasks.checker_pool import CheckerPool
from drumsd.tasks.checker_worker import death_answer
from drumsd.tasks.getters import FileArg
from drumsd.tasks.model import TaskContext
from drumsd.tasks.testing import checker_context
from harness import create, error_of, open_api

VERIFIER = """
import xml.etree.ElementTree as ET

def parse(paths, options):
    return float(len(ET.parse(paths["big.xml"]).getroot()) > 0)

def spin(paths, options):
    while True:
        pass

def small(paths, options):
    return 1.0
"""


def big_xml(mib: int) -> bytes:
    """Agent-made XML of `mib` MiB in small elements (ElementTree holds ~20x the text)."""
    row = b"<r a='1'>x</r>"
    return b"<d>" + row * (mib * 2**20 // len(row)) + b"</d>"


def test_a_sigxcpu_death_is_the_cpu_limit_and_others_say_how_they_ended() -> None:
    assert death_answer(signal.SIGXCPU, 2.0)["error_class"] == "cpu_limit"
    killed = death_answer(signal.SIGSEGV, 0.1)
    assert killed["error_class"] == "crash" and "SIGSEGV" in killed["error"]
    exited = death_answer(9 << 8, 0.1)
    assert exited["error_class"] == "crash" and "without an answer" in exited["error"]


async def test_checker_slots_bound_the_calls_at_once_and_reserve_their_memory() -> None:
    slots = CheckerSlots(2, 512)
    running = peak = 0
    reserved: list[float] = []

    async def call(_: CheckerCall) -> CheckerOutcome:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        reserved.append(slots.reserved_mib())
        await trio.sleep(0.05)
        running -= 1
        return CheckerOutcome(score=1.0)

    bounded = slots.bounded(call)
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(bounded, CheckerCall(request={}))
        await trio.sleep(0.01)
        assert slots.health()["waiting"] == 3
    assert peak == 2 and max(reserved) == 1024.0
    assert slots.reserved_mib() == 0.0 and slots.health()["running"] == 0


async def test_admission_counts_the_running_checkers(tmp_path: Path) -> None:
    # 7000 MiB available admits a 1024 MiB slot over the 4096 MiB floor; with 2 GiB held by
    # running checkers it does not.
    def sample(_: Path) -> HostSample:
        return HostSample(time.time(), 7000, 24_000, 0.0, 50_000, 100_000)

    async with open_api(tmp_path, sampler=sample) as api:
        await create(api)

        class Verifying:
            def checker_reserved_mib(self) -> float:
                return 2048.0

        api.sup.verifier = Verifying()  # type: ignore[assignment]
        err = error_of(await api.client.post("/v1/slots", json={}), 429, "overloaded")
        assert err["detail"]["limit"] == "admission.min_available_mib"


# ---- real calls in the checker venv ------------------------------------------------------------


@pytest.fixture(scope="module")
def limited_ctx() -> TaskContext:
    ctx = checker_context()
    assert ctx.checker is not None
    env = dataclasses.replace(ctx.checker, memory_mib=256, cpu_s=3.0)
    return ctx.model_copy(update={"checker": env})


def calls(tmp_path: Path) -> dict[str, CheckerCall]:
    module_dir = tmp_path / "v"
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / "drums_verifier_limits.py").write_text(VERIFIER)
    files = {"big.xml": FileArg("result0/big.xml", big_xml(40))}
    return {
        check: verifier_call(module_dir, "drums_verifier_limits", check, [files, {}], None)
        for check in ("parse", "spin", "small")
    }


async def _limits_hold(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    made = calls(tmp_path)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    parsed = await run(made["parse"])
    assert parsed.error_class == "memory_limit" and parsed.score is None, parsed
    assert "checker_memory_mib=256" in (parsed.error or "")
    spun = await run(made["spin"])
    assert spun.error_class == "cpu_limit" and spun.score is None, spun
    assert time.monotonic() - started < 30  # not the eval timeout: the limits ended them
    assert (await run(made["small"])).score == 1.0  # a checker within its limits scores
    # The parse ran in the checker's process, not here.
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 200, grown_mib


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_a_huge_file_and_a_spinning_checker_fail_at_their_limits(
    limited_ctx: TaskContext, tmp_path: Path
) -> None:
    env = limited_ctx.checker
    assert env is not None
    pool = CheckerPool(env)
    try:
        await _limits_hold(lambda call: pool.run(call, 60), tmp_path / "resident")
        assert pool.figures.fallback_calls == 0 and pool.figures.replaced == 0
    finally:
        await pool.aclose()
    await _limits_hold(lambda call: run_checker(call, env, 60), tmp_path / "fresh")
