"""Admission decisions: admit or refuse create, capture and fork from a host sample.

A refusal names the limit that would be crossed, and carries a Retry-After hint; nothing starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from drumsd.core.config import AdmissionConfig


@dataclass(frozen=True)
class HostSample:
    """What the admission sampler read; None where the host cannot say (e.g. no PSI)."""

    taken_at: float
    mem_available_mib: float | None
    mem_total_mib: float | None
    psi_memory_some_avg10: float | None
    state_free_mib: float | None
    state_total_mib: float | None = None


@dataclass(frozen=True)
class Decision:
    admit: bool
    limit: str | None = None  # the config key whose threshold refused
    reason: str | None = None
    retry_after_s: float = 0.0


ADMIT = Decision(admit=True)

# Below this a measured slot cost is noise (a slot caught between restore and first fault).
MIN_SLOT_COST_MIB = 16.0


def slot_cost_mib(env_mib: float, charged_mib: Sequence[float]) -> float:
    """What one more slot costs: the mean memory charged to the live slots, which counts a
    KSM-merged page once (the kernel charges it to one cgroup), so slots that share pages admit
    more slots. `env_mib` stays the ceiling, and the answer while no slot has been measured."""
    measured = [m for m in charged_mib if m > 0]
    if not measured:
        return float(env_mib)
    return min(float(env_mib), max(MIN_SLOT_COST_MIB, sum(measured) / len(measured)))


def decide(
    sample: HostSample | None,
    config: AdmissionConfig,
    cost_mib: float,
    *,
    pending_mib: float = 0,
    state_mib: float = 0,
) -> Decision:
    """Would starting an operation costing `cost_mib` of memory (plus `pending_mib` already
    admitted and not yet visible in the sample) and `state_mib` of state dir (this operation's
    dump plus the admitted dumps still being written) keep the host above every floor?"""
    if not config.enabled:
        return ADMIT
    if sample is None:
        return Decision(
            False, "admission", "no host sample yet; retry in a second", retry_after_s=1.0
        )
    need = cost_mib + pending_mib
    if sample.mem_available_mib is not None:
        after = sample.mem_available_mib - need
        if after < config.min_available_mib:
            return Decision(
                False,
                "admission.min_available_mib",
                f"MemAvailable {sample.mem_available_mib:.0f} MiB minus {need:.0f} MiB would go "
                f"below admission.min_available_mib={config.min_available_mib}; destroy idle "
                "slots or retry later",
                retry_after_s=5.0,
            )
        if sample.mem_total_mib:
            pct = 100.0 * after / sample.mem_total_mib
            if pct < config.min_available_pct:
                return Decision(
                    False,
                    "admission.min_available_pct",
                    f"MemAvailable would be {pct:.1f}% of RAM, below "
                    f"admission.min_available_pct={config.min_available_pct:g}",
                    retry_after_s=5.0,
                )
    if (
        sample.psi_memory_some_avg10 is not None
        and sample.psi_memory_some_avg10 > config.max_memory_psi_some_avg10
    ):
        return Decision(
            False,
            "admission.max_memory_psi_some_avg10",
            f"memory pressure (PSI some avg10) is {sample.psi_memory_some_avg10:.1f}, above "
            f"admission.max_memory_psi_some_avg10={config.max_memory_psi_some_avg10:g}",
            retry_after_s=10.0,
        )
    if (
        sample.state_free_mib is not None
        and sample.state_free_mib - state_mib < config.min_state_free_mib
    ):
        return Decision(
            False,
            "admission.min_state_free_mib",
            f"state dir has {sample.state_free_mib:.0f} MiB free, {state_mib:.0f} MiB of it for "
            f"admitted dumps, which would leave less than "
            f"admission.min_state_free_mib={config.min_state_free_mib}; delete saved states",
            retry_after_s=30.0,
        )
    return ADMIT


def state_space_warnings(
    sample: HostSample | None, min_free_mib: int, warn_free_pct: float
) -> list[str]:
    if sample is None or sample.state_free_mib is None:
        return []
    warnings = []
    if sample.state_free_mib < min_free_mib:
        warnings.append(
            f"state dir has {sample.state_free_mib:.0f} MiB free, below state_min_free_mib="
            f"{min_free_mib}: captures are refused"
        )
    if sample.state_total_mib:
        pct = 100.0 * sample.state_free_mib / sample.state_total_mib
        if pct < warn_free_pct:
            warnings.append(
                f"state dir is {100 - pct:.0f}% full (warn below state_warn_free_pct="
                f"{warn_free_pct:g}% free)"
            )
    return warnings


def group_memory_limit_mib(
    configured_mib: int | None, mem_total_mib: float | None, reserve_mib: int
) -> int | None:
    """The memory limit of the cgroup above all slots at start, before the first host sample: the
    configured value; when none is set, the host's memory less admission's floor. The admission
    service then moves it with MemAvailable (`floor_group_limit_mib`). 0 = no limit."""
    if configured_mib is not None:
        return configured_mib or None
    if not mem_total_mib:
        return None
    return max(MIN_GROUP_LIMIT_MIB, int(mem_total_mib) - reserve_mib)


# The slots' group is never limited below this, whatever the host says (a limit near zero only
# turns every page fault of every slot into reclaim).
MIN_GROUP_LIMIT_MIB = 256


def memory_floor_mib(config: AdmissionConfig, mem_total_mib: float | None) -> float:
    """The MemAvailable admission keeps: the larger of min_available_mib and min_available_pct."""
    pct_mib = (config.min_available_pct / 100.0) * mem_total_mib if mem_total_mib else 0.0
    return max(float(config.min_available_mib), pct_mib)


def floor_group_limit_mib(
    configured_mib: int | None,
    group_usage_mib: float,
    mem_available_mib: float,
    floor_mib: float,
) -> int | None:
    """The memory limit of all slots together that keeps MemAvailable at or above `floor_mib`:
    what the slots use now plus what the host can still give before the floor. A fixed
    "MemTotal less the floor" ignored memory used outside slots, so slots could take the host
    thousands of MiB under the floor (issue 39, D7). Memory used outside slots shrinks it; it
    never goes below what the slots already use (the kernel would have to reclaim or OOM-kill
    at once for a dip the next sample may undo), nor above a configured `group_memory_mib`.
    None = no limit (`group_memory_mib` 0)."""
    if configured_mib == 0:
        return None
    limit = max(group_usage_mib, group_usage_mib + mem_available_mib - floor_mib)
    limit = max(float(MIN_GROUP_LIMIT_MIB), limit)
    if configured_mib is not None:
        limit = min(limit, float(configured_mib))
    return int(limit)
