"""The host history ring buffer (core/host_history.py) and the step log (core/step_log.py)."""

from __future__ import annotations

from drumsd.core.host_history import HostHistory
from drumsd.core.step_log import Step, StepLog, describe


def _add(h: HostHistory, now: float, creates: int, steps: int, ready: int = 2) -> dict:
    return h.add(
        now,
        slots_by_state={"ready": ready, "quarantined": 1, "destroyed": 7},
        op_counts={"create": creates, "reset": 1, "fork": 0, "step": steps},
        mem_available_mib=1000.0,
        mem_total_mib=4000.0,
    )


def test_rates_are_growth_per_second_and_a_window_reset_counts_from_zero() -> None:
    h = HostHistory(size=3)
    first = _add(h, 100.0, creates=2, steps=10)
    assert first["restores_per_s"] is None and first["slots"] == 3  # destroyed are not live
    second = _add(h, 110.0, creates=6, steps=30)
    assert second["restores_per_s"] == 0.4 and second["steps_per_s"] == 2.0
    third = _add(h, 120.0, creates=1, steps=5)  # the metrics window was reset in between
    assert third["restores_per_s"] == 0.2 and third["steps_per_s"] == 0.5
    _add(h, 130.0, creates=1, steps=5)
    rows = h.as_json()["samples"]
    assert [r["ts"] for r in rows] == [110.0, 120.0, 130.0]  # bounded: the oldest went
    assert [r["ts"] for r in h.as_json(since=120.0)["samples"]] == [130.0]


def test_describe_actions() -> None:
    assert describe("pyautogui.click(1,  2)\n") == ("pyautogui", "pyautogui.click(1, 2)")
    assert describe({"type": "execute", "command": ["ls", "-l"]}) == ("execute", "ls+-l")
    assert describe({"type": "hotkey", "keys": ["ctrl", "c"]}) == ("hotkey", "keys=ctrl+c")
    kind, detail = describe({"type": "typing", "text": "x" * 500})
    assert kind == "typing" and len(detail) == 120 and detail.endswith("…")


def test_step_log_is_bounded_per_slot_and_in_slots() -> None:
    log = StepLog(per_slot=2, max_slots=2)

    def step(i: int, ep: str = "e1") -> Step:
        return Step(1, ep, i, "click", "", float(i), 0.1)

    for i in range(3):
        log.add("a", step(i))
    assert [s.index for s in log.of("a")] == [1, 2]
    log.add("a", step(3, "e2"))
    assert [s.index for s in log.of("a", "e2")] == [3]
    log.add("b", step(1))
    log.add("c", step(1))  # "a" was stepped least recently
    assert log.of("a") == [] and len(log) == 2
    log.forget("b")
    assert log.of("b") == [] and len(log) == 1
