"""harness.day_sample: CI's daily sample of slow live cases takes each in turn."""

from __future__ import annotations

from harness import day_sample


def test_consecutive_days_take_every_item_in_turn() -> None:
    items = list("abcdefg")
    days = [day_sample(items, 3, 700_000 + k) for k in range(3)]
    assert all(len(d) == 3 and len(set(d)) == 3 for d in days)
    assert set().union(*days) == set(items)
    assert days[1][0] == items[(items.index(days[0][-1]) + 1) % len(items)]


def test_a_sample_larger_than_the_items_is_every_item_once() -> None:
    assert sorted(day_sample([1, 2], 5, 3)) == [1, 2]
