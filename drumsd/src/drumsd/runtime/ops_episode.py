"""Inside an episode: step, screenshot, quiescent, task loading, verify, quarantine/release, the
gate report and per-slot metrics."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio
from drums.models import (
    AccessibilityTree,
    LatencySummary,
    QuiescentRequest,
    QuiescentResult,
    SlotMetrics,
    StepRequest,
    TaskLoaded,
    TerminalOutput,
    VerifyRequest,
    VerifyResult,
)

from drumsd.core import gates as G
from drumsd.core.errors import DrumsdError
from drumsd.core.records import (
    SlotRecord,
    SlotStatus,
    check_can_observe,
    check_can_quarantine,
    check_can_release,
    check_can_step,
    check_can_verify,
)
from drumsd.core.results import StepDone, terminal_of
from drumsd.core.seams import (
    CommandResult,
    Quiescence,
    Screenshot,
    SlotHandle,
)
from drumsd.core.vocabulary import ACTION_REQUIRES, POINTER_ACTIONS, TERMINAL_ACTIONS
from drumsd.guest import protocol
from drumsd.guest.protocol import ShotSpec
from drumsd.runtime.episodes import check_display, quarantine_slot, read_facts
from drumsd.runtime.failures import runtime_failures
from drumsd.runtime.handles import handle_of
from drumsd.runtime.ops_create import CreateHost, load_task_locked
from drumsd.tasks import accessibility as a11y
from drumsd.tasks import terminal as terminal_text

if TYPE_CHECKING:
    from drumsd.core.metrics import Histogram
    from drumsd.core.records import SlotRecord
    from drumsd.runtime.console_state import ConsoleState
    from drumsd.runtime.verifier import Verifier

log = logging.getLogger("drumsd.supervisor")


class EpisodeOpsHost(CreateHost, Protocol):
    """What the operations inside an episode use of the supervisor."""

    @property
    def console(self) -> ConsoleState: ...
    def gate_statuses(self, rec: SlotRecord) -> dict[str, str]: ...
    def get_slot(self, slot_id: str, *, renew: bool = True) -> SlotRecord: ...
    async def refresh_gates(self, rec: SlotRecord) -> None: ...
    @property
    def slot_latency(self) -> dict[str, dict[str, Histogram]]: ...
    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    @property
    def verifier(self) -> Verifier: ...


async def step(sup: EpisodeOpsHost, slot_id: str, req: StepRequest) -> StepDone:
    sup.check_open()
    sup.get_slot(slot_id)
    action = action_dict(sup, req)
    # Checked before the step runs: a bad one is a 422 and no action.
    spec = step_shot_spec(req) if req.screenshot or req.screenshot_options is not None else None
    async with sup.table.locked(slot_id, check_can_step) as rec:
        handle = handle_of(rec)
        started = trio.current_time()
        kind = action["type"]
        output: CommandResult | None = None
        shot: Screenshot | None = None
        if kind in TERMINAL_ACTIONS:
            rec.terminal = kind
        elif kind == "wait":
            await trio.sleep(float(action["seconds"]))
        else:
            timeout = float(action.get("timeout") or sup.config.step_timeout_s)
            with runtime_failures(
                sup.metrics,
                what=f"step on slot {slot_id}",
                slot_id=slot_id,
                timeout_s=timeout,
                timeout_metric="step_timeout",
            ):
                with trio.fail_after(timeout + 5):  # the guest enforces `timeout`; 5 s margin
                    # The screenshot after it comes in the same round trip to the guest.
                    outcome = await sup.runtime.step(handle, action, spec)
            output = outcome.output
            shot = outcome.screenshot
            await check_display(sup, rec, handle)
        rec.actions += 1
        rec.last_action = kind
        if kind in TERMINAL_ACTIONS:
            sup.table.save_slot(rec, f"terminal_{kind}", file=False)
        else:
            sup.table.touch(rec.id)
        elapsed = trio.current_time() - started
        if shot is not None and spec is not None:
            in_guest = shot.grab_s + shot.encode_s
            sup.observe("step", slot_id, max(0.0, elapsed - in_guest))
            _keep_shot(sup, rec, spec, shot, in_guest)
        else:
            sup.observe("step", slot_id, elapsed)
            if spec is not None:  # wait, done, fail: no guest step to carry it
                shot = await screenshot_locked(sup, rec, handle, spec)
        return StepDone(
            slot=slot_id,
            episode=rec.episode,
            action_type=kind,
            elapsed_s=elapsed,
            actions=rec.actions,
            terminal=terminal_of(kind),
            output=output,
            screenshot=shot,
        )


def step_shot_spec(req: StepRequest) -> ShotSpec:
    """The screenshot options of a step (checked before the step runs: a bad one is a 400 and
    no action)."""
    options = req.screenshot_options
    raw = options.model_dump(exclude_none=True) if options is not None else None
    try:
        return protocol.parse_shot(raw)
    except protocol.ProtocolError as exc:
        raise DrumsdError(
            "invalid_request", exc.message, field=f"screenshot_options.{exc.field}"
        ) from None


def action_dict(sup: EpisodeOpsHost, req: StepRequest) -> dict[str, Any]:
    if req.action is None:
        raise DrumsdError(
            "invalid_request",
            "a step needs `action` (pyautogui code or a drums action), or `dialect` and `actions`",
            field="action",
        )
    if isinstance(req.action, str):
        if not req.action.strip():
            raise DrumsdError("invalid_request", "action: empty pyautogui code", field="action")
        return {"type": "pyautogui", "code": req.action}
    action = req.action.model_dump(exclude_none=True)
    # The wire says timeout_s, like every API duration; the guest protocol says timeout.
    if "timeout_s" in action:
        action["timeout"] = action.pop("timeout_s")
    missing = [f for f in ACTION_REQUIRES.get(action["type"], ()) if f not in action]
    if action["type"] in POINTER_ACTIONS and (("x" in action) != ("y" in action)):
        missing.append("x and y together")
    if missing:
        raise DrumsdError(
            "invalid_request",
            f"action {action['type']!r} needs {', '.join(missing)}",
            field="action",
            missing=missing,
        )
    return action


async def screenshot(
    sup: EpisodeOpsHost, slot_id: str, spec: ShotSpec = protocol.PNG_FULL
) -> Screenshot:
    sup.get_slot(slot_id)
    async with sup.table.locked(slot_id, check_can_observe) as rec:
        return await screenshot_locked(sup, rec, handle_of(rec), spec)


async def screenshot_locked(
    sup: EpisodeOpsHost, rec: SlotRecord, handle: SlotHandle, spec: ShotSpec = protocol.PNG_FULL
) -> Screenshot:
    """Encoded once, in the guest, as `spec` asks; the bytes go to the client as they are."""
    started = trio.current_time()
    with runtime_failures(sup.metrics, what=f"screenshot of slot {rec.id}", slot_id=rec.id):
        shot = await sup.runtime.grab(handle, spec)
    _keep_shot(sup, rec, spec, shot, trio.current_time() - started)
    await check_display(sup, rec, handle)
    return shot


def _keep_shot(
    sup: EpisodeOpsHost, rec: SlotRecord, spec: ShotSpec, shot: Screenshot, seconds: float
) -> None:
    sup.observe("screenshot", rec.id, seconds)
    if spec == protocol.PNG_FULL:
        # The console and the slot's archive keep the last full-size PNG.
        sup.console.last_screenshot[rec.id] = shot.data


async def terminal(sup: EpisodeOpsHost, slot_id: str) -> TerminalOutput:
    """The desktop's terminal text (OSWorld's terminal observation); not an action."""
    sup.get_slot(slot_id)
    async with sup.table.locked(slot_id, check_can_observe) as rec:
        with runtime_failures(sup.metrics, what=f"terminal of slot {slot_id}", slot_id=slot_id):
            got = await terminal_text.read(sup.runtime, handle_of(rec))
        return TerminalOutput(
            slot=slot_id, episode=rec.episode, text=got.text, source=got.source, reason=got.reason
        )


async def accessibility_tree(sup: EpisodeOpsHost, slot_id: str) -> AccessibilityTree:
    """The desktop's accessibility tree in OSWorld's XML (its a11y observation); not an action."""
    sup.get_slot(slot_id)
    async with sup.table.locked(slot_id, check_can_observe) as rec:
        what = f"accessibility tree of slot {slot_id}"
        with runtime_failures(sup.metrics, what=what, slot_id=slot_id):
            done = await sup.runtime.exec_user(handle_of(rec), a11y.ARGV, a11y.TIMEOUT_S)
        got = a11y.parse(done.returncode, done.stdout, done.stderr)
        return AccessibilityTree(slot=slot_id, episode=rec.episode, tree=got.xml, reason=got.reason)


async def quiescent(sup: EpisodeOpsHost, slot_id: str, req: QuiescentRequest) -> QuiescentResult:
    sup.get_slot(slot_id)
    q = sup.config.quiesce
    window = req.window_s or q.window_s
    timeout = req.timeout_s or q.timeout_s
    async with sup.table.locked(slot_id, check_can_step) as rec:
        started = trio.current_time()
        with runtime_failures(sup.metrics, what=f"quiescent on slot {slot_id}", slot_id=slot_id):
            # Not quiet within the window is an answer (false), not an error.
            waited = Quiescence(False)
            with trio.move_on_after(timeout + 10):
                waited = await sup.runtime.quiescent(handle_of(rec), window, timeout, q.poll_ms)
        return QuiescentResult(
            slot=slot_id,
            quiescent=waited.quiet,
            waited_s=trio.current_time() - started,
            moving=list(waited.moving),
        )


async def load_task(sup: EpisodeOpsHost, slot_id: str, task: str | dict[str, Any]) -> TaskLoaded:
    sup.check_open()
    sup.get_slot(slot_id)
    async with sup.table.locked(slot_id, check_can_step) as rec:
        started = trio.current_time()
        rec.task_source = rec.checkpoint  # this setup runs on the slot's state: resets replay it
        info = await load_task_locked(sup, rec, handle_of(rec), task)
        return TaskLoaded(slot=slot_id, task=info, setup_s=trio.current_time() - started)


# How long verify waits, past alive_after_s, for the gate judge to read facts under load.
GATE_JUDGE_S = 5.0


async def verify(sup: EpisodeOpsHost, slot_id: str, req: VerifyRequest) -> VerifyResult:
    sup.check_open()
    sup.get_slot(slot_id)
    per_run = req.timeout_s or sup.config.tasks.eval_timeout_s
    # A verify that comes early (a fork verified at once) waits for alive_after_resume to be
    # judged rather than calling the episode invalid; outside the lock, which the judge takes.
    await wait_gates_judged(sup, slot_id, budget_s=per_run)
    async with sup.table.lock(slot_id):
        rec = sup.get_slot(slot_id)
        await sup.refresh_gates(rec)
        if rec.status is SlotStatus.quarantined:
            statuses = sup.gate_statuses(rec)
            raise DrumsdError(
                "quarantined",
                f"slot {slot_id} is quarantined ({rec.quarantine_reason}): no reward for "
                "this episode; release and reset it, or destroy it",
                slot=slot_id,
                reason=rec.quarantine_reason,
                failed_gates=G.failed_gates(statuses),
                verdict="quarantined",
            )
        check_can_verify(rec)
        handle = handle_of(rec)
        # One checker run is bounded by timeout_s (or eval_timeout_s); verify runs it twice
        # plus the redundant checker, so the whole call gets three runs and a margin.
        timeout = per_run * 3 + 30
        started = trio.current_time()
        with runtime_failures(
            sup.metrics,
            what=f"verify of slot {slot_id}",
            slot_id=slot_id,
            timeout_s=timeout,
            timeout_metric="verify_timeout",
        ):
            with trio.fail_after(timeout):
                result = await sup.verifier.verify(rec, handle)
        sup.observe("verify", slot_id, trio.current_time() - started)
        return judge_verify(sup, rec, result)


async def wait_gates_judged(sup: EpisodeOpsHost, slot_id: str, *, budget_s: float) -> None:
    """Until no gate of the slot's episode is pending, bounded by what is left of
    alive_after_s (plus the time its judge takes to read facts) and by `budget_s`."""
    rec = sup.slots.get(slot_id)
    if rec is None or rec.status is not SlotStatus.ready or rec.episode_started_at is None:
        return
    episode_id = rec.episode_id
    left = sup.config.alive_after_s - (sup.clock() - rec.episode_started_at)
    with trio.move_on_after(min(max(left, 0.0) + GATE_JUDGE_S, budget_s)):
        while True:
            rec = sup.slots.get(slot_id)
            if rec is None or rec.episode_id != episode_id:
                return
            statuses = sup.gate_statuses(rec)
            if all(statuses.get(n, G.PENDING) != G.PENDING for n in G.GATES):
                return
            await trio.sleep(0.1)


def judge_verify(sup: EpisodeOpsHost, rec: SlotRecord, result: VerifyResult) -> VerifyResult:
    statuses = sup.gate_statuses(rec)
    valid_state = G.episode_valid(statuses)
    verdict = G.verdict(statuses, rec.status is SlotStatus.quarantined)
    if result.invalid_reasons:
        # verify itself could not read the episode (a getter or checker failed): invalid, the
        # reasons name what failed, whatever the gates say (issue 36).
        valid_state = False
        verdict = "quarantined" if verdict == "quarantined" else "invalid"
    failed = G.failed_gates(statuses)
    reasons = [f"gate {name} failed" for name in failed]
    if valid_state is None:
        pending = [n for n in G.GATES if statuses.get(n, G.PENDING) == G.PENDING]
        reasons.append(f"gates pending: {', '.join(pending)}")
    # scope_unchecked means "not looked at", not "wrong": it leaves trust unknown (null), as
    # does a pending gate; any other flag, an error or no score makes it false.
    bad_flags = [f for f in result.audit.flags if f != "scope_unchecked"]
    trusted: bool | None
    if valid_state is False or bad_flags:
        trusted = False
    elif result.score is None or result.checker_error is not None:
        trusted = False
    elif valid_state is None or "scope_unchecked" in result.audit.flags:
        trusted = None
    else:
        trusted = True
    if bad_flags:
        # What the audit saw, where an operator looks: the flags alone do not say which file
        # left the scope or which run disagreed.
        log.warning(
            "slot=%s episode=%s audit flags %s (score %s, second %s, redundant %s; "
            "out of scope: %s)",
            rec.id,
            rec.episode,
            ",".join(bad_flags),
            result.score,
            result.audit.second_score,
            result.audit.redundant_score,
            ", ".join(result.audit.scope.get("violations") or []) or "nothing",
        )
    if result.checker_error:
        sup.metrics.failure("checker_error")
    if valid_state and result.score is not None and result.checker_error is None:
        sup.metrics.reward_verified()
    return result.model_copy(
        update={
            "slot": rec.id,
            "episode": rec.episode,
            "valid": bool(valid_state),
            "verdict": verdict,
            "failed_gates": failed,
            "invalid_reasons": reasons + list(result.invalid_reasons),
            "trusted": trusted,
            "last_action": rec.last_action,
            "actions": rec.actions,
        }
    )


async def quarantine(sup: EpisodeOpsHost, slot_id: str, reason: str) -> SlotRecord:
    sup.get_slot(slot_id)
    async with sup.table.locked(slot_id, check_can_quarantine) as rec:
        if rec.status is SlotStatus.quarantined:
            return rec
        quarantine_slot(sup, rec, f"by request: {reason}")
        return rec


async def release(sup: EpisodeOpsHost, slot_id: str) -> SlotRecord:
    sup.get_slot(slot_id)
    async with sup.table.locked(slot_id, check_can_release) as rec:
        # The episode stays invalid (its not_quarantined gate failed); a reset starts a
        # clean one.
        rec.status = SlotStatus.ready
        rec.quarantine_reason = None
        sup.table.save_slot(rec, "released")
        return rec


async def gate_report(sup: EpisodeOpsHost, slot_id: str) -> SlotRecord:
    sup.get_slot(slot_id)
    async with sup.table.lock(slot_id):
        rec = sup.get_slot(slot_id)
        await sup.refresh_gates(rec)
        return rec


async def slot_metrics(sup: EpisodeOpsHost, slot_id: str) -> SlotMetrics:
    rec = sup.get_slot(slot_id)
    pids: int | None = None
    memory_mib = cpu_s = None
    if rec.handle is not None and rec.status in (SlotStatus.ready, SlotStatus.quarantined):
        facts = await read_facts(sup, rec, handle_of(rec))
        if facts is not None:
            pids = len(facts.pids)
            memory_mib, cpu_s = facts.extra.get("memory_mib"), facts.extra.get("cpu_s")
    latencies = sup.slot_latency.get(slot_id, {})
    return SlotMetrics(
        slot=slot_id,
        episode=rec.episode,
        actions=rec.actions,
        latencies={op: LatencySummary.model_validate(h.summary()) for op, h in latencies.items()},
        memory_mib=memory_mib,
        cpu_s=cpu_s,
        pids=pids,
    )
