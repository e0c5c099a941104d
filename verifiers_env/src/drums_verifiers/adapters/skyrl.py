"""SkyRL (skyrl-gym 0.4): the `drums` environment, one drums desktop per trajectory.

Importing this module registers it, so `skyrl_gym.make("drums", env_config=..., extras=...)` works
(skyrl-train's generator calls exactly that with `env_class: drums`); put
`import drums_verifiers.adapters.skyrl` in your entrypoint. `BaseTextEnv` is synchronous, so this
uses the SDK's sync client. The model answers with
`<tool_call>{"name": "computer", "arguments": {...}}</tool_call>` (the `computer` schema of
adapters/computer.py); each step returns the tool result and, with `multimodal`, the screenshot.

    extras = {"drums_task": "<task id or inline OSWorld dict>", "max_turns": 15}
    env_config (skyrl_gym_cfg.drums) = {"multimodal": True, "screenshot_scale": 1.0}

The daemon: `daemon_url` / `token_file` in extras, else in env_config, else DRUMS_URL /
DRUMS_TOKEN / DRUMS_TOKEN_FILE, else the SDK defaults (the first log line says which).

The trajectory ends on done/fail, a dead desktop or `max_turns`, and the desktop is closed then
(and by `close()`, on a failed `init`, and on any error out of `step`: skyrl-train's generator
closes an env only after a trajectory that finished without raising). skyrl-train has no way for
an env to leave a trajectory out of training (its generator turns every reward into a float), so an
invalid episode (a failed validity gate, a checker or desktop failure) ends at once with
`invalid_reward` (default 0.0), `metadata["drums_valid"] = False` and the metric
`drums_valid` 0.0, instead of raising (which would crash the generator's gather).
"""

from __future__ import annotations

import base64
import json
import logging
import re
from typing import Any

from drums_verifiers import actions, desktop, verdict
from drums_verifiers.adapters.computer import TOOL_SCHEMA, computer_action
from drums_verifiers.daemon import DaemonSettings, setting

try:  # the `skyrl` extra; without it the class still works as a plain object (tests, docs)
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError:  # pragma: no cover
    skyrl_gym = None
    BaseTextEnv = object  # type: ignore[assignment,misc]

    def BaseTextEnvStepOutput(**kw: Any) -> dict[str, Any]:  # type: ignore[no-redef]
        return dict(kw)


log = logging.getLogger("drums_verifiers.adapters.skyrl")
TOKEN_HINT = "set token_file in the row's extras or in skyrl_gym_cfg.drums"
ENV_ID = "drums"
TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def parse_tool_call(text: str) -> dict[str, Any]:
    match = TOOL_CALL.search(text)
    if match is None:
        raise actions.BadAction("no <tool_call>{...}</tool_call> in the reply")
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError as exc:
        raise actions.BadAction(f"the tool call is not JSON: {exc}") from exc
    if call.get("name") != "computer":
        raise actions.BadAction("the only tool is `computer`")
    return dict(call.get("arguments") or {})


def get(config: Any, name: str, default: Any) -> Any:
    value = setting(config, name)
    return default if value is None else value


def trainable(judged: verdict.Verdict | None) -> bool:
    return bool(judged and judged.valid is True and not judged.dropped and not judged.error)


class DrumsSkyRLEnv(BaseTextEnv):  # type: ignore[misc,valid-type]
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = dict(extras or {})
        if "drums_task" not in extras:
            raise ValueError("extras['drums_task'] is required (a daemon task id or a task dict)")
        self.task = extras["drums_task"]
        self.max_turns = int(extras.get("max_turns", get(env_config, "max_turns", 15)))
        self.daemon = DaemonSettings.first_of(extras, env_config)
        self.multimodal = bool(get(env_config, "multimodal", True))
        self.scale = float(get(env_config, "screenshot_scale", 1.0))
        self.invalid_reward = float(get(env_config, "invalid_reward", 0.0))
        self.wait_valid_timeout_s = float(get(env_config, "wait_valid_timeout_s", 120))
        self.idle_timeout_s = float(get(env_config, "idle_timeout_s", 900))
        self.client: Any = None
        self.env: Any = None
        self.env_id: str | None = None
        self.screen = actions.Screen()
        self.turns = 0
        self.action_counts: dict[str, int] = {}
        self.failed: str | None = None
        self.judged: verdict.Verdict | None = None

    # --- SkyRL surface ------------------------------------------------------------------------

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        try:
            desktop.sdk()
            self.client = self.daemon.resolve("SkyRL env drums").connect(TOKEN_HINT)
            self.env = self.client.create(task=self.task, idle_timeout_s=self.idle_timeout_s)
            self.env_id = self.env.id
            log.info("env %s created for task %s", self.env_id, _task_name(self.task))
            self.env.wait_valid(timeout=self.wait_valid_timeout_s)
            obs = self.env.observe()
        except BaseException:
            self.close()  # the generator never closes an env whose init raised
            raise
        self.screen = actions.Screen(*desktop.png_size(obs.png), self.scale)
        intro = (
            f"{obs.instruction}\n\nUse the `computer` tool: answer with "
            f'<tool_call>{{"name": "computer", "arguments": {{...}}}}</tool_call>. '
            f"Schema: {json.dumps(TOOL_SCHEMA['function']['parameters'])}"
        )
        return [*prompt, self.message(intro, obs.png)], {"env": self.env_id, "tools": [TOOL_SCHEMA]}

    def step(self, action: str) -> Any:
        try:
            self.turns += 1
            text, png, finished = self.act(action)
            if not (finished or self.turns >= self.max_turns):
                return BaseTextEnvStepOutput(
                    observations=[self.message(text, png)],
                    reward=0.0,
                    done=False,
                    metadata={"env": self.env_id},
                )
            reward = self.finish()
        except BaseException:
            self.close()  # nothing raised out of step may leave the desktop behind
            raise
        self.close()
        return BaseTextEnvStepOutput(
            observations=[],
            reward=reward,
            done=True,
            metadata={"drums": self.judged.to_info(), "drums_valid": trainable(self.judged)},
        )

    def close(self) -> None:
        """Destroy the desktop (idempotent): the client destroys the envs it created."""
        client, self.client, self.env = self.client, None, None
        if client is not None:
            client.close()
            log.info("env %s closed", self.env_id)

    def get_metrics(self) -> dict[str, Any]:
        v = self.judged
        metrics = {
            "drums_valid": float(trainable(v)),
            "drums_actions": float(sum(self.action_counts.values())),
        }
        if v is not None and v.trusted is not None:
            metrics["drums_reward_trusted"] = float(v.trusted)
        return metrics

    # --- the desktop --------------------------------------------------------------------------

    def message(self, text: str, png: bytes | None) -> dict[str, Any]:
        if png is None or not self.multimodal:
            return {"role": "user", "content": text}
        url = (
            "data:image/png;base64," + base64.b64encode(actions.scale_png(png, self.scale)).decode()
        )
        return {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }

    def act(self, reply: str) -> tuple[str, bytes | None, bool]:
        """Run the reply's tool call: (result text, screenshot after, whether the episode ended)."""
        if self.env is None:
            raise RuntimeError("step() before init() or after the episode ended")
        try:
            action = computer_action(self.screen, parse_tool_call(reply))
        except actions.BadAction as exc:
            return f"error: {exc}", None, False
        try:
            png = None
            if action is not None:
                final = action["type"] in ("done", "fail")
                # the screen after the action comes with the step: one daemon round trip
                result = self.env.step(action, screenshot=not final)
                self.action_counts[action["type"]] = self.action_counts.get(action["type"], 0) + 1
                if final:
                    return action["type"], None, True
                png = desktop.screenshot_bytes(result)
            if png is None:
                png = self.env.observe().png
        except Exception as exc:
            if not desktop.is_drums_error(exc):
                raise
            if desktop.error_code(exc) in ("invalid_request", "action_failed"):
                return f"error: the desktop refused the action: {exc}", None, False
            self.failed = f"{desktop.error_code(exc)}: {exc}"
            log.warning("env %s failed mid-episode: %s", self.env_id, self.failed)
            return f"the desktop failed ({self.failed})", None, True
        return actions.describe(action) if action else "screenshot", png, False

    def finish(self) -> float:
        """The checker's score, or `invalid_reward` for an episode that must not be trained on."""
        base = verdict.Verdict(env=self.env_id, actions=dict(self.action_counts))
        if self.failed:
            base.error = f"desktop failed mid-episode: {self.failed}"
            self.judged = base
        else:
            try:
                self.judged = verdict.judge(self.env.verify(strict=False), base)
            except Exception as exc:
                if not desktop.is_drums_error(exc):
                    raise
                base.error = f"verify failed: {desktop.error_code(exc)}: {exc}"
                self.judged = base
        if trainable(self.judged):
            return verdict.enforce(self.judged)
        reason = self.judged.dropped or self.judged.error
        log.warning("env %s: episode not trainable (%s), reward %s", self.env_id, reason,
                    self.invalid_reward)  # fmt: skip
        return self.invalid_reward


def _task_name(task: Any) -> str:
    return str(task.get("id", "<inline>")) if isinstance(task, dict) else str(task)


if skyrl_gym is not None and ENV_ID not in skyrl_gym.registry:
    skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:DrumsSkyRLEnv")
