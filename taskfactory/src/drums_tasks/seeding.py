"""Seeded randomness: every task is a pure function of (seed, family, index)."""

from __future__ import annotations

import hashlib
import random
import uuid


def _digest(seed: int, family: str, index: int) -> bytes:
    return hashlib.sha256(f"drums-tasks|{seed}|{family}|{index}".encode()).digest()


def task_rng(seed: int, family: str, index: int) -> random.Random:
    """A private generator for one task; never `random` module state, so order of work is free."""
    return random.Random(int.from_bytes(_digest(seed, family, index)[:16], "big"))


def task_id(seed: int, family: str, index: int) -> str:
    """A stable UUID-shaped id (OSWorld ids are UUIDs)."""
    return str(uuid.UUID(bytes=_digest(seed, family, index)[16:32], version=4))
