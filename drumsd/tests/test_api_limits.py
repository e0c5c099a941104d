"""Request-body limits (pure): JSON depth (what counts as a level, a deep body never recurses)
and the per-peer budget of bodies in flight."""

from __future__ import annotations

import json

import pytest
from drumsd.api.limits import (
    MAX_JSON_DEPTH,
    BodyBudget,
    TooDeep,
    declared_body_size,
    exceeds_depth,
    parse_json,
)


def chain(depth: int, leaf: object = 0) -> object:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [1, 2, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH])
def test_within_the_limit_parses(depth: int) -> None:
    for leaf in (0, [], {}):
        raw = json.dumps(chain(depth - (leaf != 0), leaf))
        assert parse_json(raw) == json.loads(raw)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 500, 999, 1_000, 100_000])
def test_beyond_the_limit_is_too_deep_not_recursion(depth: int) -> None:
    raw = "[" * depth + "]" * depth
    with pytest.raises(TooDeep, match=f"deeper than {MAX_JSON_DEPTH}"):
        parse_json(raw)


def test_levels_counted_only_for_arrays_and_objects() -> None:
    assert not exceeds_depth(5, 0)
    assert not exceeds_depth("[[[[[[", 1)
    assert exceeds_depth([], 0)
    assert not exceeds_depth([], 1)
    assert exceeds_depth([[]], 1)
    assert not exceeds_depth([[]], 2)
    assert exceeds_depth({"a": [0, {"b": []}]}, 3)
    assert not exceeds_depth({"a": [0, {"b": []}]}, 4)
    # The deep branch is found whichever sibling it is.
    assert exceeds_depth([0] * 1000 + [chain(10)], 10)
    assert exceeds_depth([chain(10)] + [0] * 1000, 10)


def test_wide_bodies_are_not_too_deep() -> None:
    assert not exceeds_depth([0] * 200_000, 1)
    assert not exceeds_depth([[] for _ in range(100_000)], 2)
    assert exceeds_depth([[] for _ in range(100_000)], 1)


def test_bad_json_keeps_its_own_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        parse_json("{nope")


def test_a_peers_bodies_in_flight_are_bounded_together() -> None:
    budget = BodyBudget(per_peer=100, unknown_size=40)
    assert budget.take("a", 60)
    assert budget.take("a", 40)
    assert not budget.take("a", 1)  # refused: nothing counted
    assert budget.held("a") == 100
    assert budget.take("b", 100)  # another peer has its own budget
    budget.give_back("a", 60)
    assert budget.take("a", 50) and budget.held("a") == 90
    budget.give_back("a", 90)
    assert budget.held("a") == 0 and "a" not in budget._held  # a gone peer leaves no entry


def test_a_body_declares_its_size_or_is_chunked_or_has_none() -> None:
    assert declared_body_size(123, None) == 123
    assert declared_body_size(0, "chunked") == 0  # Content-Length wins, as in h11
    assert declared_body_size(None, "gzip, Chunked") is None
    assert declared_body_size(None, None) == 0
