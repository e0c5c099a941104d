"""Admission decisions and retention decisions."""

from __future__ import annotations

from drumsd.core.admission import (
    HostSample,
    decide,
    floor_group_limit_mib,
    group_memory_limit_mib,
    memory_floor_mib,
    state_space_warnings,
)
from drumsd.core.config import AdmissionConfig, Config
from drumsd.core.records import GateEntry, SlotRecord
from drumsd.core.retention import GIB, Archived, files_to_delete, forgotten_warnings, keep_kind


def sample(**kw) -> HostSample:
    base = dict(
        taken_at=0.0,
        mem_available_mib=20_000.0,
        mem_total_mib=24_000.0,
        psi_memory_some_avg10=0.0,
        state_free_mib=50_000.0,
        state_total_mib=100_000.0,
    )
    base.update(kw)
    return HostSample(**base)


def test_admits_when_every_floor_holds() -> None:
    assert decide(sample(), AdmissionConfig(), 1024).admit


def test_refusal_names_the_limit_it_would_cross() -> None:
    cases = {
        "admission.min_available_mib": sample(mem_available_mib=4500),
        "admission.max_memory_psi_some_avg10": sample(psi_memory_some_avg10=55.0),
        "admission.min_state_free_mib": sample(state_free_mib=100),
    }
    for limit, s in cases.items():
        d = decide(s, AdmissionConfig(), 1024)
        assert not d.admit and d.limit == limit and d.retry_after_s > 0
        assert limit.split(".")[1] in (d.reason or "")


def test_percentage_floor() -> None:
    d = decide(
        sample(mem_available_mib=10_000),
        AdmissionConfig(min_available_mib=0, min_available_pct=50),
        1024,
    )
    assert not d.admit and d.limit == "admission.min_available_pct"


def test_pending_admissions_count_against_the_floor() -> None:
    config = AdmissionConfig()
    s = sample(mem_available_mib=6000)
    assert decide(s, config, 1024).admit
    assert not decide(s, config, 1024, pending_mib=1024).admit


def test_missing_psi_is_not_a_refusal_and_disabled_admits_everything() -> None:
    assert decide(sample(psi_memory_some_avg10=None), AdmissionConfig(), 1).admit
    assert decide(None, AdmissionConfig(enabled=False), 1).admit
    assert not decide(None, AdmissionConfig(), 1).admit


def test_state_space_warnings() -> None:
    assert state_space_warnings(sample(), 1024, 15) == []
    warnings = state_space_warnings(sample(state_free_mib=500), 1024, 15)
    assert len(warnings) == 2 and "state_min_free_mib" in warnings[0]


def rec(**kw) -> SlotRecord:
    return SlotRecord(id="s", created_at=0, last_used_at=0, checkpoint="c", **kw)


def test_keep_full_for_failed_invalid_quarantined_summary_for_valid() -> None:
    assert keep_kind(rec(verdicts=["valid"]), "failures_full") == "summary"
    assert keep_kind(rec(verdicts=["valid", "invalid"]), "failures_full") == "full"
    assert keep_kind(rec(failure="restore_failed"), "failures_full") == "full"
    assert keep_kind(rec(quarantine_reason="x"), "failures_full") == "full"
    assert keep_kind(rec(gates=[GateEntry(name="netns", status="fail")]), "failures_full") == "full"
    assert keep_kind(rec(verdicts=["valid"]), "keep_all") == "full"


def test_caps_delete_oldest_first() -> None:
    config = Config.model_validate(
        {"token_file": "/t", "retention": {"summary_max_gib": 1, "full_max_gib": 2}}
    )
    files = [
        Archived("/a", "summary", int(0.6 * GIB), 1),
        Archived("/b", "summary", int(0.6 * GIB), 2),
        Archived("/c", "full", int(1.5 * GIB), 3),
        Archived("/d", "full", int(1.0 * GIB), 4),
    ]
    doomed = [f.path for f in files_to_delete(files, config)]
    assert doomed == ["/a", "/c"]


def test_overall_cap_and_warning() -> None:
    config = Config.model_validate(
        {
            "token_file": "/t",
            "forgotten_max_gib": 1,
            "retention": {"summary_max_gib": 5, "full_max_gib": 5, "forgotten_warn_gib": 0.5},
        }
    )
    files = [
        Archived("/a", "summary", int(0.7 * GIB), 1),
        Archived("/b", "full", int(0.7 * GIB), 2),
    ]
    assert [f.path for f in files_to_delete(files, config)] == ["/a"]
    assert "forgotten_warn_gib" in forgotten_warnings(files, config)[0]


def test_slot_cost_is_env_mib_until_a_slot_is_measured() -> None:
    from drumsd.core.admission import slot_cost_mib

    assert slot_cost_mib(1024, []) == 1024.0
    assert slot_cost_mib(1024, [0.0]) == 1024.0  # a slot not yet charged says nothing


def test_slot_cost_is_the_mean_merged_charge_bounded_by_env_mib() -> None:
    from drumsd.core.admission import MIN_SLOT_COST_MIB, slot_cost_mib

    assert slot_cost_mib(1024, [10.0, 30.0]) == 20.0  # KSM-merged desktops: ~20 MiB each
    assert slot_cost_mib(1024, [3000.0, 1000.0]) == 1024.0  # never above the configured cost
    assert slot_cost_mib(1024, [1.0]) == MIN_SLOT_COST_MIB


def test_merged_slots_admit_more_than_a_fixed_env_mib() -> None:
    from drumsd.core.admission import slot_cost_mib

    config = AdmissionConfig(min_available_mib=4096, min_available_pct=0)
    host = sample(mem_available_mib=4096 + 200.0)
    assert not decide(host, config, config.env_mib).admit
    assert decide(host, config, slot_cost_mib(config.env_mib, [15.0] * 8)).admit


def test_group_memory_limit_is_host_memory_less_the_admission_floor_unless_set() -> None:
    # 50 slots x 2 GiB on a 24 GiB host: together they stop 4 GiB short of the host's memory.
    assert group_memory_limit_mib(None, 24_000, 4096) == 24_000 - 4096
    assert group_memory_limit_mib(16_384, 24_000, 4096) == 16_384
    assert group_memory_limit_mib(0, 24_000, 4096) is None  # 0 = no limit
    assert group_memory_limit_mib(None, None, 4096) is None  # the host cannot say
    assert group_memory_limit_mib(None, 2_000, 4096) == 256  # never below a floor


def test_group_limit_follows_mem_available_so_memory_outside_slots_cannot_sink_the_floor() -> None:
    # Slots use 3,000 MiB, the host has 6,000 available, the floor is 4,096: the slots may grow
    # by 1,904 more, not to MemTotal less the floor (issue 39, D7).
    assert floor_group_limit_mib(None, 3_000, 6_000, 4_096) == 3_000 + 6_000 - 4_096
    # A hog outside slots took the host under the floor: slots keep what they have, no more.
    assert floor_group_limit_mib(None, 3_000, 2_000, 4_096) == 3_000
    assert floor_group_limit_mib(None, 0, 1_000, 4_096) == 256  # never near zero
    assert floor_group_limit_mib(2_000, 1_000, 20_000, 4_096) == 2_000  # a set value caps it
    assert floor_group_limit_mib(0, 1_000, 20_000, 4_096) is None  # 0 = no limit


def test_memory_floor_is_the_larger_of_the_mib_and_pct_settings() -> None:
    config = AdmissionConfig(min_available_mib=1_024, min_available_pct=10)
    assert memory_floor_mib(config, 24_000) == 2_400
    assert memory_floor_mib(config, None) == 1_024
    assert (
        memory_floor_mib(AdmissionConfig(min_available_mib=4_096, min_available_pct=1), 24_000)
        == 4_096
    )
