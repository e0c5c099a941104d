"""Request-body limits checked before a body reaches a model: JSON nesting depth.

A body nested ~1,000 deep makes `json.loads` (and pydantic, and any `json.dumps` of it later)
raise RecursionError. `parse_json` turns that into TooDeep, and refuses bodies that parsed but
nest deeper than MAX_JSON_DEPTH, so nothing downstream walks a deep value. The walk is
iterative and visits only containers: its cost is below the parse's own.
"""

from __future__ import annotations

import json
from typing import Any

MAX_JSON_DEPTH = 64
_CONTAINERS = frozenset({list, dict})  # what json.loads builds that can nest


class TooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the JSON body nests deeper than {limit} arrays/objects")
        self.limit = limit


def exceeds_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` (parsed JSON) nests more than `limit` arrays/objects deep."""
    if not isinstance(value, (list, dict)):
        return False
    if limit < 1:
        return True
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        # Types first (C speed): a long run of scalars is skipped without a Python loop.
        if _CONTAINERS.isdisjoint(map(type, children)):
            continue
        if depth == limit:
            return True  # a container child one level too deep
        # Empty containers add a level but nothing below it: not worth a trip through the stack.
        stack.extend(
            (child, depth + 1) for child in children if child and type(child) in _CONTAINERS
        )
    return False


def parse_json(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads`, raising TooDeep (not RecursionError) for a body nested beyond `limit`.

    Other errors are json.loads' own (JSONDecodeError, UnicodeDecodeError).
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        raise TooDeep(limit) from None
    if exceeds_depth(value, limit):
        raise TooDeep(limit)
    return value
