"""Request-body limits: how many body bytes one peer may have in flight, and JSON nesting depth
(checked before a body reaches a model).

A body is held in memory while it arrives (quart buffers it), so bodies in flight are bounded
per peer: `BodyBudget` refuses a body at its headers when the peer's bodies still arriving
would exceed the budget together (issue 39, D6: 24 slow 16 MiB bodies added 353 MiB).

A body nested ~1,000 deep makes `json.loads` (and pydantic, and any `json.dumps` of it later)
raise RecursionError. `parse_json` turns that into TooDeep, and refuses bodies that parsed but
nest deeper than MAX_JSON_DEPTH, so nothing downstream walks a deep value. The walk is
iterative and visits only containers: its cost is below the parse's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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


@dataclass
class BodyBudget:
    """Bytes of request bodies still arriving, per peer, at most `per_peer` together.

    A body counts its declared length (Content-Length), or `unknown_size` when it is chunked."""

    per_peer: int
    unknown_size: int
    _held: dict[str, int] = field(default_factory=dict)

    def held(self, peer: str) -> int:
        return self._held.get(peer, 0)

    def take(self, peer: str, size: int) -> bool:
        """Count `size` bytes for `peer`, or False (nothing counted) if that is over budget."""
        if self.held(peer) + size > self.per_peer:
            return False
        self._held[peer] = self.held(peer) + size
        return True

    def give_back(self, peer: str, size: int) -> None:
        left = self.held(peer) - size
        if left > 0:
            self._held[peer] = left
        else:
            self._held.pop(peer, None)


def declared_body_size(content_length: int | None, transfer_encoding: str | None) -> int | None:
    """The bytes a request says its body holds: Content-Length, None for a chunked body of
    unknown size, 0 when it has none."""
    if content_length is not None:
        return content_length
    if transfer_encoding and "chunked" in transfer_encoding.lower():
        return None
    return 0
