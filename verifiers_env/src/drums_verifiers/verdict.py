"""The verifier contract of DESIGN.md, as pure functions over a verify result.

| what happened                          | trace                                   | trainer  |
| every gate passed, the checker ran     | reward = score                          | trained  |
| a gate failed (start or mid-episode)   | no reward; `drums_invalid:<v>:<gates>`  | skipped  |
| checker failed, daemon/desktop failed  | error (ok = False)                      | skipped  |

verifiers 0.4 has no "dropped" trace, so both skipped rows raise out of scoring (the trace gets
ok = False, rewards None, which prime-rl's trainable filter skips); the drop reason is the
exception message and is also kept in `trace.info["drums"]["dropped"]`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


class DrumsInvalidEpisode(Exception):
    """A gate failed: the episode says nothing about the policy, so it carries no reward."""


class DrumsCheckerError(Exception):
    """The task's checker could not produce a score; retrying the episode may help."""


class DrumsEnvFailure(Exception):
    """The daemon or the desktop failed during the episode."""


@dataclass
class Verdict:
    """What one episode's verify said, in the shape recorded on `trace.info["drums"]`."""

    env: str | None = None
    fork_parent: str | None = None
    fork_index: int | None = None
    task_id: str | None = None
    verdict: str | None = None
    valid: bool | None = None
    failed_gates: list[str] = field(default_factory=list)
    invalid_reasons: list[str] = field(default_factory=list)
    score: float | None = None
    checker_error: str | None = None
    actions: dict[str, int] = field(default_factory=dict)
    audit_flags: list[str] = field(default_factory=list)
    trusted: bool | None = None
    dropped: str | None = None
    error: str | None = None
    turns: int | None = None
    """Model turns the rollout took."""
    timings: dict[str, Any] = field(default_factory=dict)
    """Seconds: `create`, `wait_valid`, `first_screenshot`, `verify` (a list: one per verify
    call), `tool_calls` (each tool call's step + screenshot inside its tool server)."""

    def to_info(self) -> dict[str, Any]:
        return asdict(self)


def read(result: Any, name: str, default: Any = None) -> Any:
    if isinstance(result, dict):
        return result.get(name, default)
    return getattr(result, name, default)


def audit_flags(result: Any) -> list[str]:
    audit = read(result, "audit")
    flags = read(audit, "flags", []) if audit is not None else []
    return list(flags or [])


def drop_reason(verdict: str | None, gates: list[str]) -> str:
    return f"drums_invalid:{verdict or 'invalid'}:{','.join(gates) or 'unknown'}"


def judge(result: Any, base: Verdict) -> Verdict:
    """Fill `base` from a verify result. The result decides; nothing here defaults to trusted."""
    v = Verdict(**{**base.to_info()})
    v.verdict = read(result, "verdict")
    v.valid = read(result, "valid")
    v.failed_gates = list(read(result, "failed_gates", []) or [])
    v.invalid_reasons = list(read(result, "invalid_reasons", []) or [])
    v.score = read(result, "score")
    v.checker_error = read(result, "checker_error")
    v.audit_flags = audit_flags(result)
    trusted = read(result, "trusted")
    v.trusted = trusted if isinstance(trusted, bool) else None
    if v.valid is False:
        v.dropped = drop_reason(v.verdict, v.failed_gates)
    elif v.valid is not True:
        v.error = f"verify returned no validity verdict ({v.verdict!r})"
    elif v.checker_error or v.score is None:
        v.error = f"checker failed: {v.checker_error or 'no score'}"
    return v


def enforce(v: Verdict) -> float:
    """The reward for a judged episode, or the exception that keeps it away from the trainer."""
    if v.dropped:
        raise DrumsInvalidEpisode(v.dropped)
    if v.error:
        if v.checker_error or (v.valid and v.score is None):
            raise DrumsCheckerError(v.error)
        raise DrumsEnvFailure(v.error)
    assert v.score is not None
    return float(v.score)


def record_line(
    trace_id: str,
    task_key: str | None,
    v: Verdict,
    reward: float | None,
    ok: bool,
    errors: list[str],
) -> dict[str, Any]:
    """One line of DRUMS_RECORD: enough to audit a run without opening the traces."""
    return {
        "trace": trace_id,
        "task": task_key,
        "reward": reward,
        "ok": ok,
        "errors": errors,
        "drums": v.to_info(),
    }


REWARD_NAME = "task_success"
"""The name of the drums reward function (`DrumsTask.task_success`), the key in `trace.rewards`."""


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if isinstance(obj, Mapping) else getattr(obj, name, default)


def trainable(trace: Any) -> bool:
    """Whether a trace (a `vf.Trace`, or one parsed from traces.jsonl) may be trained on: it
    finished without error, carries the task's reward, and drums neither dropped it nor
    recorded an error. Unknown shapes are not trainable."""
    if _get(trace, "ok") is not True:
        return False
    reward = (_get(trace, "rewards") or {}).get(REWARD_NAME)
    if reward is None or _get(reward, "score") is None:
        return False
    info = (_get(trace, "info") or {}).get("drums")
    if not isinstance(info, Mapping) or info.get("valid") is not True:
        return False
    return not info.get("dropped") and not info.get("error")


def iter_trainable_traces(traces: Iterable[Any]) -> Iterator[Any]:
    """Only the traces that may be trained on (see `trainable`), in order. Accepts traces or
    episodes (anything with a `traces` list, as traces.jsonl holds one episode per line)."""
    for item in traces:
        inner = _get(item, "traces")
        if isinstance(inner, list) and _get(item, "rewards") is None:
            yield from iter_trainable_traces(inner)
        elif trainable(item):
            yield item
