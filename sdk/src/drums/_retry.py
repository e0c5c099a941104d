"""When to retry an `overloaded` (429) answer, and how long to wait first.

The daemon refuses a create/fork/save before starting anything when the host is short of memory or
space, and says when to come back (Retry-After). Waiting and retrying a few times turns a create
storm into a queue; past the limit the caller gets `Overloaded`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Optional


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5  # retries after the first attempt; 0 turns retrying off
    base_s: float = 0.5  # first backoff when the daemon gives no Retry-After
    max_s: float = 30.0  # no single wait is longer than this, whatever Retry-After says
    jitter: float = 0.1  # +-10% so many clients told the same Retry-After do not return together

    def delay_s(
        self, attempt: int, retry_after: Optional[str], rand: float = 0.5
    ) -> Optional[float]:
        """Seconds to wait before retry number `attempt + 1`, or None when out of retries.

        `rand` in [0, 1) is the jitter draw (0.5 means none); tests pass it to be deterministic.
        """
        if attempt >= self.max_retries:
            return None
        told = parse_retry_after(retry_after)
        wait = told if told is not None else self.base_s * (2**attempt)
        wait *= 1.0 + self.jitter * (2.0 * rand - 1.0)
        return max(0.0, min(wait, self.max_s))

    def next_delay_s(self, attempt: int, retry_after: Optional[str]) -> Optional[float]:
        return self.delay_s(attempt, retry_after, rand=random.random())


def parse_retry_after(value: Optional[str], now: Optional[datetime] = None) -> Optional[float]:
    """Retry-After is either delay-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())
