"""The admission book on its own: a reservation is given back on every exit (return, error,
cancellation), reserved memory and dumps count against the next decision, state_dir space is
refused with a clear error, the slot cost follows the slots' last charge."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from drumsd.core.admission import HostSample
from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.core.metrics import MetricsWindow
from drumsd.runtime.admission_book import AdmissionBook

pytestmark = pytest.mark.unit


def config_in(tmp_path) -> Config:
    return Config(state_dir=tmp_path, token_file=tmp_path / "token")


def book(tmp_path, *, available_mib: float = 20_000, state_free_mib: float = 50_000):
    config = config_in(tmp_path)
    out = AdmissionBook(config, MetricsWindow(started_at=0.0))
    out.sample = HostSample(0.0, available_mib, 24_000, 0.0, state_free_mib, 100_000)
    return out


def test_a_reservation_is_given_back_on_return_and_on_error(tmp_path) -> None:
    b = book(tmp_path)
    with b.reserve("create", 700):
        with b.reserve("capture", 300, state_mib=300):
            assert (b.pending_mib, b.pending_state_mib) == (1000, 300)
            assert b.reserved == {"create": 700, "capture": 300}
    assert (b.pending_mib, b.pending_state_mib, b.reserved) == (0, 0, {})
    with pytest.raises(RuntimeError), b.reserve("fork", 2000):
        raise RuntimeError("the restore failed")
    assert (b.pending_mib, b.reserved) == (0, {})


async def test_a_reservation_is_given_back_when_its_operation_is_cancelled(tmp_path) -> None:
    b = book(tmp_path)
    with trio.move_on_after(0.01):
        with b.reserve("create", 700):
            await trio.sleep_forever()
    assert (b.pending_mib, b.reserved) == (0, {})


def test_reserved_memory_counts_against_the_next_admission(tmp_path) -> None:
    b = book(tmp_path, available_mib=8_000)
    floor = b.config.admission.min_available_mib
    cost = (8_000 - floor) / 2
    b.admit("create", cost)  # fits alone
    assert b.last_decision is not None and b.last_decision.admit
    with b.reserve("create", cost + 1):
        with pytest.raises(DrumsdError) as err:
            b.admit("create", cost)
    assert err.value.code == "overloaded" and "create refused" in err.value.message
    assert not b.last_decision.admit
    b.admit("create", cost)  # the reservation is back


def test_dumps_being_written_count_against_state_dir_space(tmp_path) -> None:
    b = book(tmp_path, state_free_mib=b_floor(tmp_path) + 500)
    b.check_state_space("capture", 400)
    with b.reserve("prefork", 100, state_mib=200), pytest.raises(DrumsdError) as err:
        b.check_state_space("capture", 400)
    assert err.value.code == "state_dir_full"
    assert str(tmp_path) in err.value.message and "DELETE /v1/checkpoints" in err.value.message
    b.check_state_space("capture", 400)


def b_floor(tmp_path) -> float:
    return config_in(tmp_path).state_min_free_mib


def test_the_slot_cost_follows_the_live_slots_last_charge(tmp_path) -> None:
    b = book(tmp_path)
    env = b.config.admission.env_mib
    assert b.slot_cost_mib(["s1"]) == env  # no charge read yet: the estimate
    b.charge("s1", 100)
    b.charge("s2", 200)
    b.charge("gone", 900)  # not live: does not count
    assert b.slot_cost_mib(["s1", "s2"]) == 150
    b.forget("s1")
    assert b.slot_cost_mib(["s1", "s2"]) == 200


async def test_waiting_for_room_asks_again_until_admitted_work_ends_or_time_is_up(
    tmp_path, autojump_clock
) -> None:
    b = book(tmp_path, available_mib=8_000)
    cost = 8_000 - b.config.admission.min_available_mib - 100
    costs: list[float] = []

    def cost_now() -> float:
        costs.append(cost)
        return cost

    async def create_for(seconds: float) -> None:
        with b.reserve("create", 500):
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(create_for, 2.0)
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
        decision = await b.wait_for_room(cost_now, 5.0)
        assert decision.admit and 2.0 <= trio.current_time() - t0 <= 2.5
        assert len(costs) > 2  # asked again, the cost read each time

        nursery.start_soon(create_for, 10.0)
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
        decision = await b.wait_for_room(cost_now, 5.0)
        assert not decision.admit and decision.limit == "admission.min_available_mib"
        assert trio.current_time() - t0 == pytest.approx(5.0)
