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
of training: `invalid_episode: drop` (default) returns no output at all, which verl's v1
(TransferQueue) worker skips ("Empty output for prompt"), so the sample is out of its GRPO group's
mean and std; verl's legacy batch worker (`trainer.use_v1: false`) needs one output per sample, so
there (and with `invalid_episode: mask`) the output comes back with an all-zero response mask
(reward 0.0, `drums_valid` 0 in reward_extra_info): no token of it is trained on, but its 0.0 stays
in the group's statistics unless `algorithm.adv_estimator: drums_grpo` (registered below: verl's
own GRPO over the rows that have trained tokens) is set.

A sample that fails (unknown task, failed setup, model-server error, `episode_timeout_s`) is left
out the same way and logged with its task and reason: one bad sample never fails verl's batch.
`screenshot_scale: auto` (default) sizes the screenshots from the model's processor and
`rollout.prompt_length` (screen_fit.py); a configuration that cannot fit one screenshot raises
before any desktop is made.
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

import numpy as np
import torch
from PIL import Image
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.trainer.ppo import core_algos

from drums_verifiers import actions, desktop, screen_fit, verdict
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
        scale = self.config.get("screenshot_scale", "auto")
        self.auto_scale = scale == "auto"
        self.scale = 1.0 if self.auto_scale else float(scale)
        # set by the agent loop from the model's processor and prompt_length (auto scale)
        self.image_budget: int | None = None
        self.limits = screen_fit.ImageLimits.from_config(self.config.get("image_processor") or {})
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
            png = actions.scale_png(png, traj.screen.scale)
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
        size = desktop.png_size(obs.png)
        scale = self.scale
        if self.auto_scale and self.image_budget is not None:
            scale = screen_fit.fit_scale(self.image_budget, self.limits, size).scale
        traj.screen = actions.Screen(*size, scale)
        traj.opening = (obs.instruction, actions.scale_png(obs.png, scale))

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


def uses_v1_worker(config: Any) -> bool:
    """Whether verl runs the v1 (TransferQueue) trainer, its default since 0.7: it takes `[]`."""
    trainer = config.get("trainer") if hasattr(config, "get") else None
    return bool(trainer.get("use_v1", True)) if trainer is not None else True


def fit_prompt(
    processor: Any, rollout: Any, config: dict[str, Any]
) -> tuple[screen_fit.ImageLimits, int | None]:
    """The processor's image limits and the image tokens one prompt leaves (`prompt_length` minus
    `prompt_text_tokens`); checked now, so a configuration that cannot fit one screenshot fails
    before the first desktop. Without a processor (a text model) nothing is sized."""
    if processor is None:
        return screen_fit.ImageLimits(), None
    limits = screen_fit.ImageLimits.of(processor)
    if config.get("image_processor"):
        limits = screen_fit.ImageLimits.from_config(config["image_processor"])
    text = int(config.get("prompt_text_tokens", 512))
    budget = int(config.get("max_image_tokens") or int(rollout.prompt_length) - text)
    try:
        screen_fit.fit_scale(budget, limits, tuple(config.get("screen") or screen_fit.DESKTOP))
    except screen_fit.ScreenDoesNotFit as exc:
        raise ValueError(
            f"verl rollout.prompt_length {rollout.prompt_length} leaves {budget} tokens for the "
            f"first screenshot (prompt_text_tokens {text} kept for its text): {exc}"
        ) from exc
    return limits, budget


def _sample_task(kwargs: dict[str, Any]) -> Any:
    computer = (kwargs.get("tools_kwargs") or {}).get("computer") or {}
    return (computer.get("create_kwargs") or {}).get("drums_task", "<no drums_task>")


def _failure(exc: Exception, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"timeout: the episode took over episode_timeout_s={timeout_s:g}"
    kind = desktop.error_code(exc) if desktop.is_drums_error(exc) else type(exc).__name__
    return f"{kind}: {exc}"


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
        config = tool.config
        self.invalid_episode = str(config.get("invalid_episode", "drop"))
        if self.invalid_episode not in ("mask", "drop"):
            raise ValueError(
                f"invalid_episode must be 'drop' or 'mask', not {self.invalid_episode!r}"
            )
        if self.invalid_episode == "drop" and not uses_v1_worker(self.config):
            self.invalid_episode = "mask"  # the legacy batch worker needs one output per sample
        self.episode_timeout_s = float(config.get("episode_timeout_s", 1800))
        if tool.auto_scale and tool.image_budget is None:
            tool.limits, tool.image_budget = fit_prompt(self.processor, self.rollout_config, config)
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
        task = _task_name(_sample_task(kwargs))
        try:
            async with asyncio.timeout(self.episode_timeout_s):
                output = await super().run(sampling_params, **kwargs)
            if self.agent_data is None:
                raise RuntimeError("the agent loop ended before the desktop was opened")
            traj = self.tool.trajectories[self.tool.key(self.agent_data)]
            judged = await self.tool.judge(traj)
        except Exception as exc:  # one bad sample must not fail verl's whole batch
            reason = _failure(exc, self.episode_timeout_s)
            log.warning("task %s: sample left out of training (%s): %s", task, self.invalid_episode,
                        reason)  # fmt: skip
            return self.left_out(reason)
        finally:
            if (
                self.agent_data is not None
            ):  # shielded: a cancelled rollout still closes its desktop
                await asyncio.shield(self.tool.end(self.tool.key(self.agent_data)))
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
        reason = judged.dropped or judged.error or f"verdict {judged.to_info().get('verdict')}"
        log.warning("task %s (env %s): episode left out of training (%s): %s", task, judged.env,
                    self.invalid_episode, reason)  # fmt: skip
        if self.invalid_episode == "drop":
            return []
        output.reward_score = 0.0
        output.response_mask = [0] * len(output.response_mask)
        return output

    def left_out(self, reason: str) -> AgentLoopOutput | list:
        """A failed sample: no output (drop), or one with no trained token (mask)."""
        if self.invalid_episode == "drop":
            return []
        agent_data = self.agent_data
        prompt_ids = list(getattr(agent_data, "prompt_ids", None) or [])
        images = list(getattr(agent_data, "image_data", None) or [])
        if not prompt_ids or images:  # no prompt yet, or one whose images are not kept: text only
            prompt_ids = self.tokenizer.encode(
                f"drums: sample left out ({reason})", add_special_tokens=False
            )[: int(self.rollout_config.prompt_length)] or [self.tokenizer.pad_token_id or 0]
        end = self.tokenizer.eos_token_id
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=[end if end is not None else 0],
            response_mask=[0],
            reward_score=0.0,
            num_turns=0,
            metrics=AgentLoopMetrics(),
            extra_fields={
                "reward_extra_info": {"drums_valid": 0.0, "drums_score": 0.0, "drums_trusted": 0.0},
                "drums": {"valid": False, "error": reason},
            },
        )

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


def drums_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's own GRPO over the rows that have a trained token: a masked (left-out) sample is out
    of its group's mean and std, as a dropped one is under the v1 worker. For verl's legacy batch
    worker: `algorithm.adv_estimator: drums_grpo` (import this module in the driver)."""
    kept = (response_mask.sum(dim=-1) > 0).nonzero().squeeze(-1)
    advantages = torch.zeros_like(token_level_rewards)
    if len(kept):
        rows, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards[kept],
            response_mask[kept],
            np.asarray(index)[kept.numpy()],
            epsilon,
            norm_adv_by_std_in_grpo,
            config,
        )
        advantages[kept] = rows
    return advantages, advantages


if "drums_grpo" not in core_algos.ADV_ESTIMATOR_REGISTRY:
    core_algos.register_adv_est("drums_grpo")(drums_grpo_advantage)
