"""verl 0.9.1: the `computer` tool (one desktop per trajectory) and the `drums_desktop` agent loop.

Needs the `verl` extra. Tool config (`actor_rollout_ref.rollout.multi_turn.tool_config_path`):

    tools:
      - class_name: drums_verifiers.adapters.verl.DrumsComputerTool
        config: {type: native}           # daemon_url / token_file optional (else DRUMS_* env)

and per sample `tools_kwargs: {computer: {create_kwargs: {drums_task: <task id or dict>}}}`.

verl's ToolAgentLoop calls `create`, `execute`, `release` once per tool call, with no trajectory id
in `create`; `execute` gets the trajectory's `agent_data`. So `create`/`release` only hand out and
drop call handles, and the desktop lives in `_Trajectory`, keyed by the `agent_data` object: it is
made at the trajectory's first call and closed when the trajectory ends (the agent loop below ends
it explicitly; under the plain ToolAgentLoop, when verl drops the trajectory's `agent_data`).

The agent loop (`agent_name: drums_desktop`, registered with verl's `register` and listed in the
shipped `verl_agent_loop.yaml` for `rollout.agent.agent_loop_config_path`) is verl's ToolAgentLoop
with the desktop around it: the opening screenshot and instruction join the prompt, `done`/`fail`
end the turn loop, the checker's score becomes `reward_score`, and an invalid episode is left out
of training: `invalid_episode: mask` (default) zeroes its response mask so no token of it is trained
on (reward 0.0, `drums_valid` 0 in reward_extra_info); `drop` returns no output at all, which
verl's v1 (TransferQueue) worker skips ("Empty output for prompt").
"""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from drums_verifiers import actions, desktop, verdict
from drums_verifiers.adapters.computer import TOOL_SCHEMA, computer_action
from drums_verifiers.daemon import DaemonSettings

log = logging.getLogger("drums_verifiers.adapters.verl")
WHO = "verl DrumsComputerTool"
TOKEN_HINT = "set token_file in the tool's config (verl_tools.yaml)"

REWARD_KEYS = ("drums_valid", "drums_score", "drums_trusted")


def image(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png)).convert("RGB")


@dataclass
class _Trajectory:
    """One trajectory's desktop and what it did; `task` is known before the desktop exists."""

    task: Any
    client: Any = None
    env: Any = None
    screen: actions.Screen = field(default_factory=actions.Screen)
    counts: dict[str, int] = field(default_factory=dict)
    terminal: str | None = None
    failed: str | None = None
    judged: verdict.Verdict | None = None
    opening: tuple[str, bytes] | None = None

    @property
    def over(self) -> bool:
        return bool(self.terminal or self.failed)


class DrumsComputerTool(BaseTool):
    """verl's BaseTool: create -> (id, ToolResponse), execute -> (ToolResponse, reward, metrics)."""

    def __init__(
        self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None
    ) -> None:
        schema = tool_schema or OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA)
        super().__init__(dict(config or {}), schema)
        self.daemon = DaemonSettings.first_of(self.config)
        self.scale = float(self.config.get("screenshot_scale", 1.0))
        self.idle_timeout_s = float(self.config.get("idle_timeout_s", 900))
        self.wait_valid_timeout_s = float(self.config.get("wait_valid_timeout_s", 120))
        self.calls: dict[str, dict[str, Any]] = {}  # call handle -> its create_kwargs
        self.trajectories: dict[int, _Trajectory] = {}  # id(agent_data) or id(handle) -> desktop
        self._finalizers: dict[int, weakref.finalize] = {}
        self.daemon.resolve(WHO)

    # --- verl's BaseTool surface ---------------------------------------------------------------

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        handle = instance_id or uuid.uuid4().hex
        self.calls[handle] = dict(kwargs.get("create_kwargs") or kwargs)
        return handle, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float | None, dict[str, Any]]:
        create_kwargs = self.calls.get(instance_id, {})
        traj = await self.trajectory(kwargs.get("agent_data"), create_kwargs, instance_id)
        if traj.over:
            return ToolResponse(text="the episode is over"), None, {}
        try:
            action = computer_action(traj.screen, dict(parameters or {}))
        except actions.BadAction as exc:
            return ToolResponse(text=f"error: {exc}"), 0.0, {"bad_action": 1}
        try:
            png = None
            if action is not None:
                final = action["type"] in ("done", "fail")
                # the screen after the action comes with the step: one daemon round trip
                result = await desktop.step(traj.env, action, screenshot=not final)
                traj.counts[action["type"]] = traj.counts.get(action["type"], 0) + 1
                if final:
                    traj.terminal = action["type"]
                    return ToolResponse(text=action["type"]), await self.score(traj), {}
                png = desktop.screenshot_bytes(result)
            if png is None:
                png = (await desktop.observe(traj.env)).png
            png = actions.scale_png(png, self.scale)
        except Exception as exc:
            if not desktop.is_drums_error(exc):
                raise
            if desktop.error_code(exc) in ("invalid_request", "action_failed"):
                return ToolResponse(text=f"error: the desktop refused the action: {exc}"), 0.0, {}
            traj.failed = f"{desktop.error_code(exc)}: {exc}"
            log.warning("env %s failed mid-episode: %s", desktop.env_id(traj.env), traj.failed)
            return ToolResponse(text=f"the desktop failed ({traj.failed})"), None, {}
        text = actions.describe(action) if action else "screenshot"
        return ToolResponse(text=text, image=[image(png)]), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The checker's score for the trajectory of `agent_data`; raises for an invalid one."""
        create_kwargs = self.calls.get(instance_id, {})
        traj = await self.trajectory(kwargs.get("agent_data"), create_kwargs, instance_id)
        await self.judge(traj)
        assert traj.judged is not None
        return verdict.enforce(traj.judged)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drops the call handle; the desktop stays with its trajectory (see `end`)."""
        self.calls.pop(instance_id, None)
        solo = self.trajectories.get(_solo_key(instance_id))
        if solo is not None:  # used without agent_data: the handle is the trajectory
            await self.end(_solo_key(instance_id))

    # --- trajectories -------------------------------------------------------------------------

    def key(self, agent_data: Any, handle: str | None = None) -> int:
        return id(agent_data) if agent_data is not None else _solo_key(handle or "")

    async def trajectory(
        self, agent_data: Any, create_kwargs: dict[str, Any], handle: str | None = None
    ) -> _Trajectory:
        """The trajectory's desktop, made on first use (from `create_kwargs['drums_task']`)."""
        key = self.key(agent_data, handle)
        traj = self.trajectories.get(key)
        if traj is None:
            task = create_kwargs.get("drums_task")
            if task is None:
                raise ValueError(
                    "the computer tool needs tools_kwargs.computer.create_kwargs.drums_task "
                    "(a daemon task id or an OSWorld task dict)"
                )
            traj = self.trajectories[key] = _Trajectory(task)
            if agent_data is not None:
                self._finalizers[key] = weakref.finalize(
                    agent_data, _end_soon, weakref.ref(self), key, asyncio.get_running_loop()
                )
            await self.open(traj)
        return traj

    async def open(self, traj: _Trajectory) -> None:
        traj.client = self.daemon.resolve(WHO).aconnect(TOKEN_HINT)
        try:
            traj.env = await desktop.create_env(traj.client, traj.task, self.idle_timeout_s)
            log.info("env %s created for task %s", desktop.env_id(traj.env), _task_name(traj.task))
            await desktop.wait_valid(traj.env, self.wait_valid_timeout_s)
            obs = await desktop.observe(traj.env)
        except BaseException:
            await self.close(traj)
            raise
        traj.screen = actions.Screen(*desktop.png_size(obs.png), self.scale)
        traj.opening = (obs.instruction, actions.scale_png(obs.png, self.scale))

    async def judge(self, traj: _Trajectory) -> verdict.Verdict:
        if traj.judged is None:
            base = verdict.Verdict(env=desktop.env_id(traj.env), actions=dict(traj.counts))
            if traj.failed:
                base.error = f"desktop failed mid-episode: {traj.failed}"
                traj.judged = base
            else:
                traj.judged = verdict.judge(await desktop.verify(traj.env, 300), base)
            log.info("env %s judged: %s", desktop.env_id(traj.env), traj.judged.to_info())
        return traj.judged

    async def score(self, traj: _Trajectory) -> float | None:
        """The step reward of `done`/`fail`: the checker's score, None for an invalid episode."""
        judged = await self.judge(traj)
        return float(judged.score) if trainable(judged) and judged.score is not None else None

    async def end(self, key: int) -> None:
        """Close the trajectory's desktop (idempotent)."""
        finalizer = self._finalizers.pop(key, None)
        if finalizer is not None:
            finalizer.detach()
        traj = self.trajectories.pop(key, None)
        if traj is not None:
            await self.close(traj)

    async def close(self, traj: _Trajectory) -> None:
        try:
            if traj.env is not None:
                await desktop.close_env(traj.env)
                log.info("env %s closed", desktop.env_id(traj.env))
        finally:
            if traj.client is not None:
                await desktop.aclose_client(traj.client)
            traj.env = traj.client = None


def trainable(judged: verdict.Verdict) -> bool:
    """A valid episode with a score: anything else (invalid, checker or desktop failure) is not."""
    return judged.valid is True and not judged.dropped and not judged.error


def _solo_key(handle: str) -> int:
    return hash(("drums-call", handle))


def _task_name(task: Any) -> str:
    return str(task.get("id", "<inline>")) if isinstance(task, dict) else str(task)


def _end_soon(tool_ref: weakref.ref[DrumsComputerTool], key: int, loop: Any) -> None:
    """verl dropped a trajectory's agent_data without ending it: close its desktop on the loop."""
    tool = tool_ref()
    if tool is None or loop.is_closed():
        return
    log.info("trajectory %s ended without an explicit end: closing its desktop", key)
    loop.call_soon_threadsafe(lambda: loop.create_task(tool.end(key)))


@register("drums_desktop")
class DrumsDesktopAgentLoop(ToolAgentLoop):
    """ToolAgentLoop on one desktop: screenshot in the prompt, checker score as reward_score."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tool = self.tools.get("computer")
        if not isinstance(tool, DrumsComputerTool):  # no tool config: the daemon from DRUMS_*
            tool = DrumsComputerTool({"type": "native"})
            self.tools = {**self.tools, "computer": tool}
            self.tool_schemas = [
                t.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
                for t in self.tools.values()
            ]
        self.tool: DrumsComputerTool = tool
        self.invalid_episode = str(tool.config.get("invalid_episode", "mask"))
        if self.invalid_episode not in ("mask", "drop"):
            raise ValueError(
                f"invalid_episode must be 'mask' or 'drop', not {self.invalid_episode!r}"
            )
        self.agent_data: Any = None

    async def process_multi_modal_info(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The images already in the prompt, as PIL images (screenshots are added later)."""
        images = [
            block["image"]
            for message in messages
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if isinstance(block, dict) and isinstance(block.get("image"), Image.Image)
        ]
        return {"images": images}

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        try:
            output = await super().run(sampling_params, **kwargs)
            if self.agent_data is None:
                raise RuntimeError("the agent loop ended before the desktop was opened")
            traj = self.tool.trajectories[self.tool.key(self.agent_data)]
            judged = await self.tool.judge(traj)
        finally:
            if self.agent_data is not None:
                await self.tool.end(self.tool.key(self.agent_data))
        ok = trainable(judged)
        info = {
            "drums_valid": float(ok),
            "drums_score": float(judged.score) if ok and judged.score is not None else 0.0,
            "drums_trusted": float(bool(judged.trusted)),
        }
        output.extra_fields["reward_extra_info"] = info
        output.extra_fields["drums"] = judged.to_info()
        if ok:
            output.reward_score = info["drums_score"]
            return output
        reason = judged.dropped or judged.error
        log.warning(
            "env %s: episode left out of training (%s): %s",
            judged.env,
            self.invalid_episode,
            reason,
        )
        if self.invalid_episode == "drop":
            return []
        output.reward_score = 0.0
        output.response_mask = [0] * len(output.response_mask)
        return output

    async def _handle_pending_state(self, agent_data: Any, sampling_params: dict[str, Any]) -> Any:
        """Open the desktop and put its instruction and first screenshot into the prompt."""
        self.agent_data = agent_data
        create_kwargs = (agent_data.tools_kwargs.get("computer") or {}).get("create_kwargs", {})
        traj = await self.tool.trajectory(agent_data, create_kwargs)
        assert traj.opening is not None
        instruction, png = traj.opening
        shot = image(png)
        agent_data.messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": instruction},
                    {"type": "image", "image": shot},
                ],
            }
        )
        if agent_data.image_data is None:
            agent_data.image_data = []
        agent_data.image_data.append(shot)
        return await super()._handle_pending_state(agent_data, sampling_params)

    async def _handle_processing_tools_state(self, agent_data: Any) -> Any:
        state = await super()._handle_processing_tools_state(agent_data)
        traj = self.tool.trajectories.get(self.tool.key(agent_data))
        if traj is not None and traj.over:
            return AgentState.TERMINATED
        return state


AGENT_LOOP_CONFIG = str(Path(__file__).with_name("verl_agent_loop.yaml"))
"""The path for `actor_rollout_ref.rollout.agent.agent_loop_config_path`."""
