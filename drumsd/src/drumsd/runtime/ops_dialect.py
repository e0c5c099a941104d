"""A step in a vendor's dialect: a batch of Anthropic or OpenAI computer-tool calls, translated by
`drums.dialects` (the SDK's, so MCP and verifiers run the same words), run in order under the
slot's lock in one API round trip, with one screenshot after (or one per call on request).

Every call is translated and checked before the first runs: a bad one is a 422 naming the call,
the field and what is allowed, and nothing happens on the desktop. Coordinates come in the model's
screen space (`screen`), cursor positions and screenshots go back in it; a zoom is the region at
the desktop's own resolution.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Protocol

import trio
from drums.dialects import DialectError, Scale, translate_batch
from drums.models import CallResult, StepRequest

from drumsd.core.errors import DrumsdError
from drumsd.core.records import check_can_step
from drumsd.core.results import StepDone
from drumsd.core.seams import Screenshot
from drumsd.guest import protocol
from drumsd.guest.protocol import ShotSpec
from drumsd.runtime.episodes import check_display
from drumsd.runtime.failures import runtime_failures
from drumsd.runtime.handles import handle_of
from drumsd.runtime.ops_episode import EpisodeOpsHost, screenshot_locked, step_shot_spec

if TYPE_CHECKING:
    from drumsd.core.config import Config
    from drumsd.core.metrics import MetricsWindow
    from drumsd.core.seams import SlotRuntime
    from drumsd.runtime.slot_table import SlotTable


class DialectHost(EpisodeOpsHost, Protocol):
    """What a vendor dialect's step uses of the supervisor."""

    def check_open(self) -> None: ...
    @property
    def config(self) -> Config: ...
    @property
    def metrics(self) -> MetricsWindow: ...
    def observe(self, operation: str, slot_id: str | None, seconds: float) -> None: ...
    @property
    def runtime(self) -> SlotRuntime: ...
    @property
    def table(self) -> SlotTable: ...


def _bad(message: str, field: str) -> DrumsdError:
    return DrumsdError("invalid_request", message, field=field)


def plan(req: StepRequest) -> tuple[Scale, list[list[dict[str, Any]]], ShotSpec]:
    """(scale, the drums actions of each call, the spec of its screenshots), or a 422."""
    if req.action is not None:
        raise _bad("give `action` (drums) or `dialect` with `actions`, not both", "action")
    if req.dialect is None:
        raise _bad("`actions` needs a `dialect` (e.g. anthropic-2026-08 or openai)", "dialect")
    if not req.actions:
        raise _bad(f"`actions` must list at least one {req.dialect} call", "actions")
    screen_w, screen_h = protocol.SCREEN_WIDTH, protocol.SCREEN_HEIGHT
    model_w, model_h = (req.screen.width, req.screen.height) if req.screen else (screen_w, screen_h)
    scale = Scale(model_w, model_h, screen_w, screen_h)
    try:
        calls = translate_batch(req.dialect, req.actions, scale)
    except DialectError as exc:
        raise DrumsdError(
            "invalid_request", str(exc), field=exc.field, dialect=exc.dialect, allowed=exc.allowed
        ) from None
    spec = step_shot_spec(req)
    if req.screen is not None and spec.width is None and spec.height is None:
        spec = ShotSpec(spec.format, spec.quality, model_w, model_h)
    return scale, calls, spec


def _image(shot: Screenshot) -> dict[str, Any]:
    return {
        "image_b64": base64.b64encode(shot.data).decode(),
        "image_content_type": shot.content_type,
        "image_width": shot.width,
        "image_height": shot.height,
    }


def _call_name(call: dict[str, Any]) -> str:
    return str(call.get("name") or call.get("action") or call.get("type"))


GUEST_LESS = ("screenshot", "zoom", "wait")  # answered by the daemon, not the guest's worker


async def _run_guest(
    sup: DialectHost, handle: Any, slot_id: str, actions: list[dict[str, Any]], spec: Any
) -> tuple[list[dict[str, Any]], Screenshot | None]:
    """Consecutive guest actions in one request to the guest (its worker runs them in order),
    the screenshot after them in the same round trip when `spec` asks for one."""
    timeout = sum(sup.config.step_timeout_s + float(a.get("seconds", 0.0)) for a in actions)
    with runtime_failures(
        sup.metrics,
        what=f"step on slot {slot_id}",
        slot_id=slot_id,
        timeout_s=timeout,
        timeout_metric="step_timeout",
    ):
        with trio.fail_after(timeout + 5):
            batch = getattr(sup.runtime, "step_batch", None)
            if batch is not None and len(actions) > 1:
                return await batch(handle, actions, spec)
            results, shot = [], None
            for position, action in enumerate(actions):
                last = position == len(actions) - 1
                outcome = await sup.runtime.step(handle, action, spec if last else None)
                cursor = outcome.cursor
                results.append({"cursor": {"x": cursor[0], "y": cursor[1]}} if cursor else {})
                shot = outcome.screenshot
            return results, shot


async def step(sup: DialectHost, slot_id: str, req: StepRequest) -> StepDone:
    sup.check_open()
    sup.get_slot(slot_id)
    scale, calls, spec = plan(req)
    want_final = req.screenshot or req.screenshot_options is not None
    assert req.actions is not None  # plan() checked
    flat = [(index, action) for index, actions in enumerate(calls) for action in actions]
    async with sup.table.locked(slot_id, check_can_step) as rec:
        handle = handle_of(rec)
        started = trio.current_time()
        entries = [{"index": i, "name": _call_name(c)} for i, c in enumerate(req.actions)]
        shot: Screenshot | None = None
        pos = 0
        while pos < len(flat):
            index, action = flat[pos]
            kind = action["type"]
            shot = None
            if kind == "screenshot":
                shot = await screenshot_locked(sup, rec, handle, spec)
                entries[index].update(_image(shot))
                pos += 1
            elif kind == "zoom":
                region = tuple(action["region"])
                zoom = ShotSpec(spec.format, spec.quality, None, None, region)  # type: ignore[arg-type]
                entries[index].update(_image(await screenshot_locked(sup, rec, handle, zoom)))
                pos += 1
            elif kind == "wait":
                await trio.sleep(float(action["seconds"]))
                pos += 1
            else:
                # A run of guest actions: up to the next daemon-answered one (and, with a
                # screenshot per call, to the end of this call), in one round trip.
                end = pos
                while (
                    end < len(flat)
                    and flat[end][1]["type"] not in GUEST_LESS
                    and (not req.screenshot_each or flat[end][0] == index)
                ):
                    end += 1
                run = flat[pos:end]
                call_ends = end == len(flat) or flat[end][0] != index
                fold = (req.screenshot_each and call_ends) or (end == len(flat) and want_final)
                results, shot = await _run_guest(
                    sup, handle, slot_id, [a for _, a in run], spec if fold else None
                )
                for (call, done), result in zip(run, results, strict=False):
                    cursor = result.get("cursor") if done["type"] == "cursor_position" else None
                    if isinstance(cursor, dict):
                        x, y = scale.to_model(int(cursor["x"]), int(cursor["y"]))
                        entries[call]["cursor"] = {"x": x, "y": y}
                pos = end
            call_ended = pos == len(flat) or flat[pos][0] != index
            if req.screenshot_each and call_ended and "image_b64" not in entries[index]:
                if shot is None:
                    shot = await screenshot_locked(sup, rec, handle, spec)
                entries[index].update(_image(shot))
        await check_display(sup, rec, handle)
        rec.actions += len(calls)
        rec.last_action = entries[-1]["name"]
        sup.table.touch(rec.id)
        final = shot if want_final else None
        if want_final and final is None:
            final = await screenshot_locked(sup, rec, handle, spec)
        elapsed = trio.current_time() - started
        sup.observe("step", slot_id, elapsed)
        return StepDone(
            slot=slot_id,
            episode=rec.episode,
            action_type=f"{req.dialect}:{entries[-1]['name']}",
            elapsed_s=elapsed,
            actions=rec.actions,
            screenshot=final,
            results=[CallResult.model_validate(entry) for entry in entries],
        )
