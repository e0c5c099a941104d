"""One drums task as a verifiers Task: the desktop's lifecycle around one rollout, and its reward.

Rollout order in verifiers 0.4: setup -> tool servers -> agent turns -> tool servers down ->
finalize and scoring (only if nothing failed). So: the desktop is created (or adopted from a
fork) and proven valid in `setup`, the tool servers act on it by id, `finalize` runs the checker
from this process, and the reward applies the verifier contract (verdict.py).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import verifiers.v1 as vf

from drums_verifiers import desktop, verdict
from drums_verifiers.actions import shot_options
from drums_verifiers.config import DrumsTaskConfig
from drums_verifiers.episode import SEAT, owner_for, release_private
from drums_verifiers.state import DrumsState

log = logging.getLogger("drums_verifiers.task")
# vf-eval and prime-rl put only the `verifiers.v1` logger tree on the console: a rollout that
# fails before it starts says why there, in one line, not only in traces.jsonl.
console = logging.getLogger("verifiers.v1.drums")
RECORD_ENV = "DRUMS_RECORD"
_record_lock = threading.Lock()


class DrumsTaskData(vf.TaskData):
    drums_task: str | dict[str, Any]
    """What the daemon is asked to create on: a task id it knows, or an inline OSWorld task."""
    instruction: str = ""
    visual_window: int = 3
    """Read by the drums-verifiers harness: screenshots kept as images in the context."""


SYSTEM_PROMPTS = {
    "drums": (
        "You control a Linux desktop through the computer_* tools. Coordinates are pixels of "
        "the latest screenshot, origin top-left. Every action returns the screenshot after it. "
        "Call computer_done when the task is complete, computer_fail if it cannot be done."
    ),
    "scalecua": (
        "You control a Linux desktop through the `computer` tool (actions: click, doubleClick, "
        "rightClick, moveTo, dragTo, scroll, write, press, hotkey, wait, terminate, response). "
        "Coordinates are pixels of the latest screenshot. Finish with "
        "terminate(status='success') or terminate(status='failure')."
    ),
    "hybrid": (
        "You control a Linux desktop through the computer_* GUI tools and, on the same desktop "
        "as its user, the computer_shell, computer_read_file, computer_write_file and "
        "computer_launch_app tools. Coordinates are pixels of the latest screenshot. Call "
        "computer_done when the task is complete, computer_fail if it cannot be done."
    ),
    "anthropic": (
        "You control a Linux desktop through Anthropic's computer tools (screenshot, zoom, "
        "left_click, right_click, middle_click, double_click, triple_click, left_click_drag, "
        "mouse_move, left_mouse_down, left_mouse_up, cursor_position, scroll, type, key, "
        "hold_key, wait). Coordinates are pixels of the latest screenshot. Answer without a "
        "tool call when the task is done."
    ),
    "openai": (
        "You control a Linux desktop through the `computer` tool: `actions`, a list of click, "
        "double_click, drag, keypress, move, screenshot, scroll, type and wait actions, run in "
        "order. Coordinates are pixels of the latest screenshot. Answer without a tool call "
        "when the task is done."
    ),
}


def png_data_url(png: bytes, content_type: str = "image/png") -> str:
    return f"data:{content_type};base64," + base64.b64encode(png).decode()


def opening_prompt(
    instruction: str, png: bytes, shown: tuple[int, int], content_type: str = "image/png"
) -> list[vf.Message]:
    text = (
        f"{instruction}\n\nThe screenshot below is {shown[0]}x{shown[1]} pixels; "
        "give coordinates in that space."
    )
    return [
        vf.UserMessage(
            content=[
                vf.TextContentPart(text=text),
                vf.ImageUrlContentPart(
                    image_url=vf.ImageUrlSource(url=png_data_url(png, content_type))
                ),
            ]
        )
    ]


def write_record(line: dict[str, Any]) -> None:
    """Append one line to $DRUMS_RECORD (if set); lines are small, appends are whole."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    data = json.dumps(line, default=str) + "\n"
    with _record_lock, Path(path).open("a") as f:
        f.write(data)


class DrumsTask(vf.Task[DrumsTaskData, DrumsState, DrumsTaskConfig]):
    @property
    def key(self) -> str:
        ref = self.data.drums_task
        return ref if isinstance(ref, str) else str(ref.get("id") or self.hash)

    @classmethod
    def toolsets(cls, config: DrumsTaskConfig) -> list[vf.Toolset]:
        from drums_verifiers.tools import toolset_for

        return [toolset_for(config.tool_style)(config.tools_config())]

    # --- lifecycle -------------------------------------------------------------------------------

    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        try:
            await self._setup(trace)
        except verdict.DrumsInvalidEpisode:
            raise
        except Exception as exc:
            console.error(
                "drums: rollout %s (task %s, drumsd %s) failed before it started: %s: %s",
                trace.id,
                self.key,
                self.config.daemon.resolve(announce=False).url,
                type(exc).__name__,
                exc,
            )
            raise

    async def _setup(self, trace: vf.Trace) -> None:
        cfg = self.config
        state: DrumsState = trace.state
        seat = SEAT.get()
        base = verdict.Verdict(task_id=self.key)
        if seat is not None:
            env = seat.env
            base.fork_parent, base.fork_index = seat.parent, seat.index
            state.fork_parent, state.fork_index = seat.parent, seat.index
        else:
            owner = owner_for(trace.id, cfg.daemon)
            started = time.monotonic()
            env = await owner.create(self.data.drums_task, cfg.idle_timeout_s)
            base.timings["create"] = round(time.monotonic() - started, 4)
            owner.by_trace[trace.id] = env
        base.env = state.env_id = desktop.env_id(env)
        trace.info["drums"] = base.to_info()
        started = time.monotonic()
        try:
            report = await desktop.wait_valid(env, cfg.wait_valid_timeout_s)
        except Exception as exc:
            if not desktop.is_invalid_episode(exc):
                raise
            self._drop_at_start(
                trace, base, getattr(exc, "verdict", None) or "invalid", desktop.failed_gates(exc)
            )
        if desktop.field(report, "valid") is False:
            self._drop_at_start(trace, base, "invalid", desktop.failed_gates(report))
        base.timings["wait_valid"] = round(time.monotonic() - started, 4)
        started = time.monotonic()
        obs = await desktop.observe(env)
        base.timings["first_screenshot"] = round(time.monotonic() - started, 4)
        trace.info["drums"] = base.to_info()
        width, height = desktop.png_size(obs.png)
        state.screen = [width, height]
        # What the model sees, as the tool servers will show it (the daemon scales/encodes).
        shot = shot_options(
            state.screen, cfg.screenshot_scale, cfg.screenshot_format, cfg.screenshot_quality
        )
        shown, shown_size = obs, (width, height)
        if isinstance(shot, dict):
            shown = await desktop.observe(env, shot)
            shown_size = (shot.get("width", width), shot.get("height", height))
        instruction = obs.instruction or self.data.instruction
        prompt = opening_prompt(instruction, shown.png, shown_size, shown.content_type)
        trace.task.data = trace.task.data.model_copy(update={"prompt": prompt})
        log.info("rollout=%s env=%s ready (%dx%d)", trace.id, state.env_id, width, height)

    def _drop_at_start(
        self, trace: vf.Trace, base: verdict.Verdict, kind: str, failed: list[str]
    ) -> None:
        base.verdict, base.valid, base.failed_gates = kind, False, failed
        base.dropped = verdict.drop_reason(kind, failed)
        trace.info["drums"] = base.to_info()
        write_record(verdict.record_line(trace.id, self.key, base, None, False, [base.dropped]))
        raise verdict.DrumsInvalidEpisode(base.dropped)

    async def finalize(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        """Run the checker while the desktop still exists; the reward applies the contract."""
        state: DrumsState = trace.state
        base = verdict.Verdict(**trace.info.get("drums", {}))
        base.actions = dict(state.actions)
        base.turns = trace.num_turns
        base.timings["tool_calls"] = [round(s, 4) for s in state.tool_s]
        if state.env_failed:
            base.error = f"desktop failed mid-episode: {state.env_failed}"
            trace.info["drums"] = base.to_info()
            return
        env = await self._env_for(trace)
        started = time.monotonic()
        try:
            result = await desktop.verify(env, self.config.verify_timeout_s)
        except Exception as exc:
            base.timings.setdefault("verify", []).append(round(time.monotonic() - started, 4))
            if not desktop.is_drums_error(exc) and not isinstance(exc, TimeoutError):
                raise
            code = desktop.error_code(exc)
            if code == "checker_failed" or isinstance(exc, TimeoutError):
                base.checker_error = f"{type(exc).__name__}: {exc}"
                base.error = f"checker failed: {base.checker_error}"
            elif desktop.is_invalid_episode(exc):
                base = verdict.judge(
                    {
                        "valid": False,
                        "verdict": code or "invalid",
                        "failed_gates": desktop.failed_gates(exc),
                    },
                    base,
                )
            else:
                base.error = f"daemon failed during verify: {code or type(exc).__name__}: {exc}"
            trace.info["drums"] = base.to_info()
            return
        base.timings.setdefault("verify", []).append(round(time.monotonic() - started, 4))
        trace.info["drums"] = verdict.judge(result, base).to_info()

    async def _env_for(self, trace: vf.Trace) -> Any:
        seat = SEAT.get()
        if seat is not None:
            return seat.env
        owner = owner_for(trace.id, self.config.daemon)
        env = owner.by_trace.get(trace.id)
        if env is None:  # set up by another process (a served env worker): attach by id
            env = await desktop.attach_env(await owner.client(), trace.state.env_id)
        return env

    # --- signals -------------------------------------------------------------------------------

    @vf.stop
    async def desktop_finished(self, trace: vf.Trace) -> bool:
        state: DrumsState = trace.state
        return state.terminal is not None or state.env_failed is not None

    @vf.stop
    async def turn_budget(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= self.config.max_turns

    @vf.metric
    async def drums_valid(self, trace: vf.Trace) -> float:
        return 1.0 if trace.info.get("drums", {}).get("valid") is True else 0.0

    @vf.metric
    async def drums_actions(self, trace: vf.Trace) -> float:
        return float(sum(trace.state.actions.values()))

    @vf.metric
    async def drums_reward_trusted(self, trace: vf.Trace) -> dict[str, float]:
        """1.0 / 0.0 when the daemon said whether the reward can be trusted; absent (never
        0.0) when it did not (a keyed metric: an empty result records nothing)."""
        trusted = trace.info.get("drums", {}).get("trusted")
        return {"drums_reward_trusted": float(trusted)} if isinstance(trusted, bool) else {}

    @vf.reward
    async def task_success(self, trace: vf.Trace) -> float:
        """The task checker's score for a valid episode; raises (no reward) otherwise."""
        judged = verdict.Verdict(**trace.info.get("drums", {}))
        reward: float | None = None
        try:
            reward = verdict.enforce(judged)
            return reward
        finally:
            errors = [e for e in (judged.dropped, judged.error) if e]
            write_record(
                verdict.record_line(trace.id, self.key, judged, reward, reward is not None, errors)
            )
            await release_private(trace.id)
