"""Slot numbers and the host ports forwarded to each slot's guest ports (pure).

A slot gets the lowest number of `slot_range` no live slot holds, keeps it across resets and
frees it when destroyed; with `port_base` set, guest port `guest_port` of slot N is served on
the host at 127.0.0.1:port_base+N, and each `extra_ports` guest port at its base + N.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping


def free_numbers(taken: Iterable[int], low: int, high: int) -> Iterator[int]:
    """The numbers of [low, high] not in `taken`, lowest first."""
    held = set(taken)
    return (n for n in range(low, high + 1) if n not in held)


def forwarded_ports(
    number: int, port_base: int | None, guest_port: int, extra_ports: Mapping[int, int]
) -> dict[int, int]:
    """Guest port -> host port of slot `number`; {} when forwarding is off (no port_base)."""
    if port_base is None:
        return {}
    return {guest_port: port_base + number, **{g: b + number for g, b in extra_ports.items()}}
