"""What the supervisor's facade answers where no wire model fits as it is: a step's screenshot as
the guest encoded it, the records of a fork's children, a health or metrics report whose times are
epoch seconds. `drumsd.api.convert` shapes each into its `drums.models` wire model; the results
that are wire models already (terminal text, a quiescent wait, a loaded task, a slot's metrics)
are returned as those. Pure records: no trio, no OS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from drums.models import CallResult

from drumsd.core.records import CheckpointRecord, SlotRecord
from drumsd.core.seams import CommandResult, Screenshot

Terminal = Literal["done", "fail"]


def terminal_of(action_type: str) -> Terminal | None:
    """The terminal action a step's action type is (done, fail), or None."""
    return "done" if action_type == "done" else "fail" if action_type == "fail" else None


@dataclass(frozen=True)
class StepDone:
    """One step (a drums action, or a dialect's batch of calls) as it ran."""

    slot: str
    episode: int
    action_type: str
    elapsed_s: float
    actions: int  # actions taken in the episode, this step's included
    terminal: Terminal | None = None  # when the step ended the episode
    output: CommandResult | None = None  # an execute action's
    screenshot: Screenshot | None = None  # taken after the step, when asked for
    results: list[CallResult] | None = None  # per call of a dialect step, in order


@dataclass(frozen=True)
class Forked:
    """A fork: the parent slot, its children's records, the checkpoint they restored from."""

    parent: str
    children: list[SlotRecord]
    checkpoint: str
    elapsed_s: float


@dataclass(frozen=True)
class SpaceReport:
    """Free and total MiB of the filesystem holding `path`."""

    path: str
    free_mib: float
    total_mib: float
    free_pct: float


@dataclass(frozen=True)
class AdmissionReport:
    """Whether the host admits another slot now, and the host sample the decision read."""

    enabled: bool
    admitting: bool
    reason: str | None
    slot_cost_mib: float
    mem_available_mib: float | None
    mem_total_mib: float | None
    psi_memory_some_avg10: float | None
    state_free_mib: float | None
    group_memory_limit_mib: float | None
    sampled_at: float | None  # epoch seconds


@dataclass(frozen=True)
class SparePoolReport:
    """One pooled checkpoint: spares parked now, its target, claims served and their latency."""

    size: int
    target: int | None
    hits: int
    misses: int
    hit_ratio: float | None
    claim_p50_s: float | None
    claim_p99_s: float | None
    restore_p50_s: float | None


@dataclass(frozen=True)
class SparesReport:
    """The warm-spare pools: their settings, spares parked in all, each pooled checkpoint."""

    enabled: bool
    per_checkpoint: int
    per_host: int
    max_age_s: float
    refill_allowed: bool
    parked: int
    checkpoints: dict[str, SparePoolReport] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthReport:
    """/v1/health: slots by state, checkpoints, admission, space, pools, services, warnings.
    The objects the wire model leaves open (crash_watch, ksm, pools, services, tasks) stay JSON
    objects: each is one component's own report."""

    status: str  # ok | degraded
    version: str
    profile: str
    slots_by_state: dict[str, int]
    checkpoints: Sequence[CheckpointRecord]
    admission: AdmissionReport
    crash_watch: Mapping[str, Any]
    state_dir: SpaceReport | None
    journal_dir: SpaceReport | None
    forgotten_gib: float
    ksm: Mapping[str, Any]
    pools: Mapping[str, Any]
    services: Mapping[str, Any]
    tasks: Mapping[str, Any]
    warnings: list[str]


@dataclass(frozen=True)
class MetricsReport:
    """A metrics window: its latencies (Histogram summaries), verdicts, failures, counters (with
    this instant's gauges) and cost."""

    window_started_at: float  # epoch seconds
    window_s: float
    latencies: dict[str, dict[str, float | int | None]]
    episodes_by_verdict: dict[str, int]
    failures_by_class: dict[str, int]
    counters: dict[str, float]
    cost: dict[str, float | None]


__all__ = [
    "AdmissionReport",
    "Forked",
    "HealthReport",
    "MetricsReport",
    "SpaceReport",
    "SparePoolReport",
    "SparesReport",
    "StepDone",
    "Terminal",
    "terminal_of",
]
