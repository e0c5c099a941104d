"""The reward audit on real restored desktops, through verify: each flag fires on a live slot
(nondeterministic, redundant_disagree, scope_violation, checker_timeout, checker_crash), never
changes score or validity, and an honest, in-scope episode is trusted. The checkers are the
drums_verifier module in fixtures/verifiers, installed through the config's verifier_dirs.
DRUMS_LIVE=1 (root, CRIU, the base image, the checker venv)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import VERIFIER_MODULE, shared_daemon, timed_verify

ANSWER = "/home/user/Desktop/answer.txt"
SCOPE = {
    "roots": ["/home/user"],
    # The template's own writes under the home (font and window manager caches) are allowed.
    "allow": [ANSWER, "/home/user/.cache/*"],
}


@pytest.fixture(scope="module")
def daemon():
    return shared_daemon("hardened")


def _task(check: str, *, check_alt: str | None = None, options: dict | None = None) -> dict:
    evaluator: dict[str, Any] = {
        "func": "drums_verifier",
        "module": VERIFIER_MODULE,
        "check": check,
        "options": options or {},
        "result": [{"type": "vm_file", "path": ANSWER, "dest": "answer.txt"}],
        "scope": SCOPE,
    }
    if check_alt:
        evaluator["check_alt"] = check_alt
    return {
        "id": f"audit-{check}-{uuid.uuid4().hex[:8]}",
        "instruction": "Write yes into ~/Desktop/answer.txt.",
        "config": [],
        "evaluator": evaluator,
    }


def _verify_after(daemon, task: dict, commands: list[str]) -> tuple[dict, float]:
    r, took = timed_verify(daemon, task, commands)
    result = r.json()
    # The audit never changes validity: every gate passed on these slots.
    assert result["valid"] is True and result["verdict"] == "valid", result
    return result, took


SOLVE = f"mkdir -p ~/Desktop && echo yes > {ANSWER}"


def test_honest_in_scope_episode_is_trusted(daemon):
    result, _ = _verify_after(daemon, _task("answer_is_yes"), [SOLVE])
    assert result["score"] == 1.0 and result["audit"]["flags"] == [], result["audit"]
    assert result["audit"]["scope"]["checked"] is True
    assert result["trusted"] is True


def test_flipping_checker_is_nondeterministic(daemon):
    marker = f"/tmp/drums-audit-flip-{uuid.uuid4().hex}"
    try:
        result, _ = _verify_after(daemon, _task("flips", options={"marker": marker}), [SOLVE])
    finally:
        Path(marker).unlink(missing_ok=True)
    audit = result["audit"]
    assert "nondeterministic" in audit["flags"], audit
    assert (result["score"], audit["second_score"]) == (1.0, 0.0), result
    assert result["trusted"] is False


def test_disagreeing_redundant_checker(daemon):
    result, _ = _verify_after(daemon, _task("answer_is_yes", check_alt="always_zero"), [SOLVE])
    audit = result["audit"]
    assert "redundant_disagree" in audit["flags"], audit
    assert result["score"] == 1.0 and audit["redundant_score"] == 0.0, result
    assert result["trusted"] is False


def test_write_outside_allowed_globs_is_a_scope_violation(daemon):
    stray = "/home/user/Documents/stray.txt"
    result, _ = _verify_after(
        daemon, _task("answer_is_yes"), [SOLVE, f"mkdir -p ~/Documents && echo x > {stray}"]
    )
    audit = result["audit"]
    assert "scope_violation" in audit["flags"], audit
    assert any(stray in str(v) for v in audit["scope"]["violations"]), audit["scope"]
    assert result["score"] == 1.0 and result["trusted"] is False
    # The daemon's log names the file too, with the slot and episode.
    logged = [ln for ln in daemon.log_path.read_text().splitlines() if "audit flags" in ln]
    assert any(result["slot"] in ln and stray in ln for ln in logged), logged[-3:]


def test_hanging_checker_times_out_without_hanging_verify(daemon):
    result, took = _verify_after(daemon, _task("hangs"), [SOLVE])
    audit = result["audit"]
    assert "checker_timeout" in audit["flags"], audit
    assert result["score"] is None and result["checker_error"], result
    assert result["trusted"] is False
    # eval_timeout_s is 10 s in the shared daemon: killed at the deadline, not after an hour.
    assert took < 60, took


def test_raising_checker_is_a_checker_crash(daemon):
    result, _ = _verify_after(daemon, _task("raises"), [SOLVE])
    audit = result["audit"]
    assert "checker_crash" in audit["flags"], audit
    assert result["score"] is None and "broken on purpose" in str(result["checker_error"]), result
    assert result["trusted"] is False
