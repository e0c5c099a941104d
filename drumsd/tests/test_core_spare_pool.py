"""Warm-spare pool sizing: pure functions."""

from drumsd.core.spare_pool import (
    DEFAULT_RESTORE_S,
    MIN_SPARES,
    RATE_WINDOW_S,
    PoolStats,
    share_host,
    spare_target,
)


def test_never_claimed_keeps_configured_maximum():
    assert spare_target(None, 0.2, 4) == 4


def test_disabled_pool_is_empty():
    assert spare_target(None, 0.2, 0) == 0
    assert spare_target(10.0, 0.2, 0) == 0


def test_quiet_checkpoint_keeps_the_minimum():
    assert spare_target(0.0, 0.2, 4) == MIN_SPARES
    assert spare_target(1 / 60, 0.2, 4) == MIN_SPARES
    assert spare_target(0.0, 0.2, 1) == 1  # never above the configured bound


def test_target_grows_with_rate_and_restore_time():
    # 1 claim/s, 0.25 s restore, headroom 2: ceil(0.5) = 1, floored at MIN_SPARES
    assert spare_target(1.0, 0.25, 8) == MIN_SPARES
    assert spare_target(6.0, 0.25, 8) == 3
    # 8 claims/s, 0.3 s restore: ceil(4.8) = 5
    assert spare_target(8.0, 0.3, 8) == 5
    assert spare_target(8.0, 0.6, 8) == 8  # bounded by per_checkpoint


def test_share_host_fits_and_spreads():
    assert share_host({"a": 4, "b": 4}, 16) == {"a": 4, "b": 4}
    assert share_host({"a": 6, "b": 1, "c": 2}, 4) == {"a": 2, "b": 1, "c": 1}
    assert share_host({"a": 3}, 0) == {"a": 0}
    assert sum(share_host({"a": 9, "b": 9, "c": 9}, 7).values()) == 7


def test_pool_stats_rate_hits_misses():
    p = PoolStats()
    assert p.claims_per_s(100.0, 0.0) is None
    assert p.typical_restore_s() == DEFAULT_RESTORE_S
    for i in range(10):
        p.record(100.0 + i, spare=i % 2 == 0, seconds=0.02 if i % 2 == 0 else 0.2)
    assert (p.hits, p.misses) == (5, 5)
    assert p.typical_restore_s() == 0.2
    # 10 claims over a 120 s window
    assert abs(p.claims_per_s(200.0, 0.0) - 10 / RATE_WINDOW_S) < 1e-9
    # a young pool: the window is its age
    assert abs(p.claims_per_s(110.0, 100.0) - 1.0) < 1e-9
    # old claims leave the window
    assert p.claims_per_s(100.0 + 10 + RATE_WINDOW_S, 0.0) == 0.0
    s = p.summary()
    assert s["hit_ratio"] == 0.5 and s["claim_p50_s"] == 0.02
