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
