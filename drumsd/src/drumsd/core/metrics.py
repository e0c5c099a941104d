"""Metrics of the current window: latency histograms, episodes by verdict, failures by class,
cost per valid episode and per verified reward; JSON-ready and Prometheus text exposition.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from drumsd.core.results import MetricsReport

OPERATIONS = ("create", "reset", "fork", "step", "screenshot", "verify", "capture", "prefork")

# Seconds; spans a 5 ms screenshot to a slow cold restore.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

# Quantiles come from the most recent samples; a bounded list keeps memory flat.
MAX_SAMPLES = 10_000
COST_KEYS = ("usd_in_window", "usd_per_valid_episode", "usd_per_verified_reward")


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0
    count: int = 0
    maximum: float = 0.0
    samples: list[float] = field(default_factory=list)

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, float(seconds))
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1
        self.maximum = max(self.maximum, seconds)
        self.samples.append(seconds)
        if len(self.samples) > MAX_SAMPLES:
            del self.samples[: len(self.samples) - MAX_SAMPLES]

    def quantile(self, q: float) -> float | None:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        # Nearest-rank: the smallest sample with at least q of the samples at or below it.
        rank = max(1, math.ceil(q * len(ordered)))
        return ordered[rank - 1]

    def summary(self) -> dict[str, float | int | None]:
        return {
            "count": self.count,
            "p50": self.quantile(0.5),
            "p90": self.quantile(0.9),
            "p99": self.quantile(0.99),
            "mean": self.total / self.count if self.count else None,
            "max": self.maximum if self.count else None,
        }


@dataclass
class MetricsWindow:
    started_at: float
    latencies: dict[str, Histogram] = field(
        default_factory=lambda: {op: Histogram() for op in OPERATIONS}
    )
    episodes_by_verdict: dict[str, int] = field(default_factory=dict)
    failures_by_class: dict[str, int] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    verified_rewards: int = 0

    def observe(self, operation: str, seconds: float) -> None:
        self.latencies.setdefault(operation, Histogram()).observe(seconds)

    def episode_finished(self, verdict: str) -> None:
        self.episodes_by_verdict[verdict] = self.episodes_by_verdict.get(verdict, 0) + 1

    def failure(self, failure_class: str) -> None:
        self.failures_by_class[failure_class] = self.failures_by_class.get(failure_class, 0) + 1

    def count(self, name: str, amount: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + amount

    def reward_verified(self) -> None:
        self.verified_rewards += 1

    def cost(self, now: float, host_usd_per_hour: float | None) -> dict[str, float | None]:
        """Every figure is None (not reported) while the host's price is not configured."""
        if not host_usd_per_hour:
            return dict.fromkeys(COST_KEYS)
        spent = host_usd_per_hour * max(0.0, now - self.started_at) / 3600.0
        valid = self.episodes_by_verdict.get("valid", 0)
        return {
            "usd_in_window": spent,
            "usd_per_valid_episode": spent / valid if valid else None,
            "usd_per_verified_reward": (
                spent / self.verified_rewards if self.verified_rewards else None
            ),
        }

    def report(self, now: float, host_usd_per_hour: float | None) -> MetricsReport:
        return MetricsReport(
            window_started_at=self.started_at,
            window_s=max(0.0, now - self.started_at),
            latencies={op: h.summary() for op, h in self.latencies.items()},
            episodes_by_verdict=dict(self.episodes_by_verdict),
            failures_by_class=dict(self.failures_by_class),
            counters={**self.counters, "verified_rewards": float(self.verified_rewards)},
            cost=self.cost(now, host_usd_per_hour),
        )


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def prometheus_text(
    window: MetricsWindow,
    now: float,
    host_usd_per_hour: float | None,
    gauges: Iterable[tuple[str, str, dict[str, str], float]] = (),
) -> str:
    """Prometheus text exposition (version 0.0.4). `gauges` adds (name, help, labels, value)."""
    lines: list[str] = []
    name = "drums_operation_seconds"
    lines += [f"# HELP {name} Latency of daemon operations.", f"# TYPE {name} histogram"]
    for op, hist in sorted(window.latencies.items()):
        op_label = _label_value(op)
        cumulative = 0
        for bound, count in zip(BUCKETS, hist.counts, strict=False):
            cumulative += count
            lines.append(f'{name}_bucket{{operation="{op_label}",le="{_num(bound)}"}} {cumulative}')
        lines.append(f'{name}_bucket{{operation="{op_label}",le="+Inf"}} {hist.count}')
        lines.append(f'{name}_sum{{operation="{op_label}"}} {_num(hist.total)}')
        lines.append(f'{name}_count{{operation="{op_label}"}} {hist.count}')
    name = "drums_episodes_total"
    lines += [f"# HELP {name} Finished episodes by verdict.", f"# TYPE {name} counter"]
    for verdict, count in sorted(window.episodes_by_verdict.items()):
        lines.append(f'{name}{{verdict="{_label_value(verdict)}"}} {count}')
    name = "drums_failures_total"
    lines += [f"# HELP {name} Failures by class.", f"# TYPE {name} counter"]
    for cls, count in sorted(window.failures_by_class.items()):
        lines.append(f'{name}{{class="{_label_value(cls)}"}} {count}')
    name = "drums_verified_rewards_total"
    lines += [
        f"# HELP {name} Verify calls that returned a trusted-path reward.",
        f"# TYPE {name} counter",
        f"{name} {window.verified_rewards}",
    ]
    name = "drums_window_seconds"
    lines += [
        f"# HELP {name} Length of the current metrics window.",
        f"# TYPE {name} gauge",
        f"{name} {_num(max(0.0, now - window.started_at))}",
    ]
    cost = window.cost(now, host_usd_per_hour)
    name = "drums_cost_usd"
    lines += [
        f"# HELP {name} Host cost of the window, per valid episode, per verified reward.",
        f"# TYPE {name} gauge",
    ]
    for key, value in sorted(cost.items()):
        if value is not None:
            lines.append(f'{name}{{what="{key}"}} {_num(value)}')
    seen: set[str] = set()
    for gname, ghelp, labels, value in gauges:
        if gname not in seen:
            lines += [f"# HELP {gname} {ghelp}", f"# TYPE {gname} gauge"]
            seen.add(gname)
        label_text = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
        lines.append(
            f"{gname}{{{label_text}}} {_num(value)}" if label_text else f"{gname} {_num(value)}"
        )
    return "\n".join(lines) + "\n"
