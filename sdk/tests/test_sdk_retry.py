"""Backoff for 429: Retry-After honoured, capped, jittered, and a limit."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

from drums import RetryPolicy
from drums._retry import parse_retry_after


def test_retry_after_seconds_win_over_the_backoff() -> None:
    policy = RetryPolicy(max_retries=3, base_s=0.5, max_s=30, jitter=0.0)
    assert policy.delay_s(0, "7") == 7.0
    assert policy.delay_s(0, None) == 0.5
    assert policy.delay_s(2, None) == 2.0  # doubling
    assert policy.delay_s(3, "1") is None  # out of retries


def test_waits_are_capped_and_jittered_within_bounds() -> None:
    policy = RetryPolicy(max_retries=5, base_s=1, max_s=4, jitter=0.1)
    assert policy.delay_s(0, "3600") == 4  # a huge Retry-After is capped
    assert policy.delay_s(0, "2", rand=0.0) == 1.8
    assert policy.delay_s(0, "2", rand=0.999) <= 2.2
    assert RetryPolicy(max_retries=0).delay_s(0, "1") is None


def test_retry_after_as_an_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(later, now=now) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=5), usegmt=True), now=now) == 0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
