"""Records' status checks and lease decisions."""

from __future__ import annotations

import pytest
from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.core.leases import (
    TOMBSTONE_KEEP_S,
    checkpoint_lease,
    expired_checkpoints,
    expired_slots,
    expires_at,
    prefork_reusable,
    slot_lease,
    stale_tombstones,
)
from drumsd.core.records import (
    CheckpointKind,
    CheckpointRecord,
    SlotRecord,
    SlotStatus,
    check_can_fork,
    check_can_release,
    check_can_reset,
    check_can_step,
    check_can_verify,
    check_is_known,
)


def slot(status: SlotStatus = SlotStatus.ready, **kw) -> SlotRecord:
    base = dict(id="s-1", created_at=100.0, last_used_at=100.0, checkpoint="tpl")
    base.update(kw)
    return SlotRecord(status=status, **base)


def cfg(**kw) -> Config:
    return Config.model_validate({"token_file": "/t", **kw})


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (SlotStatus.destroyed, "env_gone"),
        (SlotStatus.quarantined, "quarantined"),
        (SlotStatus.failed, "env_gone"),
        (SlotStatus.busy, "conflict"),
        (SlotStatus.creating, "conflict"),
    ],
)
def test_step_refused_with_the_code_of_the_status(status: SlotStatus, code: str) -> None:
    with pytest.raises(DrumsdError) as info:
        check_can_step(slot(status, quarantine_reason="gate x failed"))
    assert info.value.code == code
    assert "s-1" in info.value.message


def test_ready_slot_passes_every_check() -> None:
    rec = slot()
    for check in (check_can_step, check_can_reset, check_can_fork, check_can_verify):
        check(rec)


def test_quarantined_slot_refuses_reset_until_released() -> None:
    rec = slot(SlotStatus.quarantined, quarantine_reason="why")
    with pytest.raises(DrumsdError) as info:
        check_can_reset(rec)
    assert info.value.code == "quarantined"
    check_can_release(rec)
    with pytest.raises(DrumsdError):
        check_can_release(slot())


def test_unknown_slot_is_not_found() -> None:
    with pytest.raises(DrumsdError) as info:
        check_is_known(None, "s-nope")
    assert info.value.code == "not_found" and "s-nope" in info.value.message


def test_lease_overrides_win_over_config() -> None:
    c = cfg(lease={"env_idle_timeout_s": 50, "env_ttl_s": 500})
    assert slot_lease(c, None, None).idle_timeout_s == 50
    assert slot_lease(c, None, None).ttl_s == 500
    lease = slot_lease(c, 7, 9)
    assert (lease.idle_timeout_s, lease.ttl_s) == (7, 9)


def test_expiry_is_the_earlier_of_idle_and_ttl() -> None:
    assert expires_at(0, 100, 50, None) == 150
    assert expires_at(0, 100, 50, 120) == 120
    assert expires_at(0, 100, None, None) is None


def test_expired_slots_name_the_reason_and_skip_destroyed() -> None:
    idle = slot(id="a", idle_timeout_s=10)
    ttl = slot(id="b", idle_timeout_s=1000, ttl_s=5, last_used_at=104)
    fresh = slot(id="c", idle_timeout_s=1000)
    gone = slot(SlotStatus.destroyed, id="d", idle_timeout_s=1)
    out = dict((r.id, why) for r, why in expired_slots([idle, ttl, fresh, gone], 110.5))
    assert set(out) == {"a", "b"}
    assert "idle" in out["a"] and "ttl" in out["b"]


def test_renewal_keeps_a_slot_alive() -> None:
    rec = slot(idle_timeout_s=10)
    rec.last_used_at = 105
    assert expired_slots([rec], 114) == []
    assert len(expired_slots([rec], 115)) == 1


def cp(kind: CheckpointKind, **kw) -> CheckpointRecord:
    base = dict(id="c-1", created_at=100.0, last_used_at=100.0, dir="/x", ready=True)
    base.update(kw)
    return CheckpointRecord(kind=kind, **base)


def test_templates_never_expire_and_referenced_states_are_kept() -> None:
    c = cfg()
    assert checkpoint_lease(c, CheckpointKind.template, 1, 1).idle_timeout_s is None
    saved = cp(CheckpointKind.saved, id="st", idle_timeout_s=1)
    used = cp(CheckpointKind.saved, id="st2", idle_timeout_s=1)
    tpl = cp(CheckpointKind.template, id="tpl", idle_timeout_s=1)
    out = expired_checkpoints([saved, used, tpl], {"st2"}, 1000)
    assert [c.id for c, _ in out] == ["st"]


def test_prefork_lease_is_capped_by_max_age() -> None:
    lease = checkpoint_lease(cfg(prefork_max_age_s=30), CheckpointKind.prefork, None, None)
    assert lease.ttl_s == 30


def test_prefork_reuse_needs_same_state_and_young_age() -> None:
    rec = slot(episode=2, actions=5)
    pf = cp(CheckpointKind.prefork, source_slot="s-1", source_episode=2, source_actions=5)
    assert prefork_reusable(pf, rec, 150, 120)
    assert not prefork_reusable(pf, rec, 221, 120)  # too old
    rec.actions = 6
    assert not prefork_reusable(pf, rec, 150, 120)  # the slot acted since the dump


def test_tombstones_are_forgotten_after_a_week() -> None:
    gone = slot(SlotStatus.destroyed, destroyed_at=0.0)
    assert stale_tombstones([gone], TOMBSTONE_KEEP_S - 1) == []
    assert stale_tombstones([gone], TOMBSTONE_KEEP_S + 1) == [gone]
