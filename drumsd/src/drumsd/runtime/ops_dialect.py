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
from typing import TYPE_CHECKING, Any

import trio
from drums.dialects import DialectError, Scale, translate_batch
from drums.models import StepRequest

from drumsd.core.errors import DrumsdError
from drumsd.core.records import check_can_step
from drumsd.core.seams import Screenshot
from drumsd.guest import protocol
from drumsd.guest.protocol import ShotSpec
from drumsd.runtime.episodes import check_display
from drumsd.runtime.failures import runtime_failures
from drumsd.runtime.ops_episode import screenshot_locked, step_shot_spec

if TYPE_CHECKING:
    from drumsd.runtime.supervisor import Supervisor


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


async def step(sup: Supervisor, slot_id: str, req: StepRequest) -> dict[str, Any]:
    sup._check_open()
    sup.get_slot(slot_id)
    scale, calls, spec = plan(req)
    want_final = req.screenshot or req.screenshot_options is not None
    assert req.actions is not None  # plan() checked
    async with sup._lock(slot_id):
        rec = sup.get_slot(slot_id)
        check_can_step(rec)
        handle = sup._handle(rec)
        started = trio.current_time()
        results: list[dict[str, Any]] = []
        shot: Screenshot | None = None
        for index, (call, actions) in enumerate(zip(req.actions, calls, strict=True)):
            entry: dict[str, Any] = {"index": index, "name": _call_name(call)}
            last_call = index == len(calls) - 1
            for position, action in enumerate(actions):
                kind = action["type"]
                # The screenshot after a guest action comes in its round trip to the guest.
                fold = position == len(actions) - 1 and (
                    req.screenshot_each or (last_call and want_final)
                )
                shot = None
                if kind == "screenshot":
                    shot = await screenshot_locked(sup, rec, handle, spec)
                    entry.update(_image(shot))
                elif kind == "zoom":
                    region = tuple(action["region"])
                    zoom = ShotSpec(spec.format, spec.quality, None, None, region)  # type: ignore[arg-type]
                    entry.update(_image(await screenshot_locked(sup, rec, handle, zoom)))
                elif kind == "wait":
                    await trio.sleep(float(action["seconds"]))
                else:
                    timeout = sup.config.step_timeout_s + float(action.get("seconds", 0.0))
                    with runtime_failures(
                        sup.metrics,
                        what=f"step on slot {slot_id}",
                        slot_id=slot_id,
                        timeout_s=timeout,
                        timeout_metric="step_timeout",
                    ):
                        with trio.fail_after(timeout + 5):
                            outcome = await sup.runtime.step(handle, action, spec if fold else None)
                    shot = outcome.screenshot
                    if kind == "cursor_position" and outcome.cursor is not None:
                        x, y = scale.to_model(*outcome.cursor)
                        entry["cursor"] = {"x": x, "y": y}
            if req.screenshot_each and "image_b64" not in entry:
                if shot is None:
                    shot = await screenshot_locked(sup, rec, handle, spec)
                entry.update(_image(shot))
            results.append(entry)
        await check_display(sup, rec, handle)
        rec.actions += len(calls)
        rec.last_action = results[-1]["name"]
        sup._dirty.add(rec.id)
        final = shot if want_final else None
        if want_final and final is None:
            final = await screenshot_locked(sup, rec, handle, spec)
        elapsed = trio.current_time() - started
        sup._observe("step", slot_id, elapsed)
        return {
            "slot": slot_id,
            "episode": rec.episode,
            "action_type": f"{req.dialect}:{results[-1]['name']}",
            "elapsed_s": elapsed,
            "actions": rec.actions,
            "terminal": None,
            "output": None,
            "screenshot": final,
            "results": results,
        }
