"""A SkyRL-Gym environment: one drums desktop per trajectory, driven by `<tool_call>` text.

SkyRL's `BaseTextEnv` is synchronous, so this uses the SDK's sync client. The model answers
with `<tool_call>{"name": "computer", "arguments": {...}}</tool_call>` (the `computer` schema of
adapters/computer.py); each step returns the tool result and, with `multimodal`, the screenshot.
The trajectory ends on done/fail, a dead desktop or `max_turns`; the reward then follows the
verifier contract (an invalid episode raises DrumsInvalidEpisode instead of giving a reward).

    extras = {"drums_task": "<task id or inline OSWorld dict>", "max_turns": 15}
    env_config = {"daemon_url": "http://127.0.0.1:7070", "token_file": "/etc/drums/token",
                  "multimodal": True, "screenshot_scale": 1.0}
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from drums_verifiers import actions, desktop, verdict
from drums_verifiers.adapters.computer import TOOL_SCHEMA, computer_action

try:  # the `skyrl` extra; without it the class still works as a plain object (tests, docs)
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError:  # pragma: no cover
    BaseTextEnv = object  # type: ignore[assignment,misc]

    def BaseTextEnvStepOutput(**kw: Any) -> dict[str, Any]:  # type: ignore[no-redef]
        return dict(kw)


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
    if config is None:
        return default
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


class DrumsSkyRLEnv(BaseTextEnv):  # type: ignore[misc,valid-type]
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        if "drums_task" not in extras:
            raise ValueError("extras['drums_task'] is required (a daemon task id or a task dict)")
        self.task = extras["drums_task"]
        self.max_turns = int(extras.get("max_turns", get(env_config, "max_turns", 15)))
        self.url = get(env_config, "daemon_url", "http://127.0.0.1:7070")
        self.token_file = str(get(env_config, "token_file", "/etc/drums/token"))
        self.multimodal = bool(get(env_config, "multimodal", True))
        self.scale = float(get(env_config, "screenshot_scale", 1.0))
        self.client: Any = None
        self.env: Any = None
        self.screen = actions.Screen()
        self.turns = 0
        self.action_counts: dict[str, int] = {}
        self.failed: str | None = None
        self.judged: verdict.Verdict | None = None

    # --- SkyRL surface ------------------------------------------------------------------------

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        self.client = desktop.sdk().connect(url=self.url, token_file=self.token_file)
        self.env = self.client.create(task=self.task)
        self.env.wait_valid(timeout=120)
        obs = self.env.observe()
        self.screen = actions.Screen(*desktop.png_size(obs.png), self.scale)
        intro = (
            f"{obs.instruction}\n\nUse the `computer` tool: answer with "
            f'<tool_call>{{"name": "computer", "arguments": {{...}}}}</tool_call>. '
            f"Schema: {json.dumps(TOOL_SCHEMA['function']['parameters'])}"
        )
        return [*prompt, self.message(intro, obs.png)], {"env": self.env.id, "tools": [TOOL_SCHEMA]}

    def step(self, action: str) -> Any:
        self.turns += 1
        text, png, finished = self.act(action)
        done = finished or self.turns >= self.max_turns
        if not done:
            return BaseTextEnvStepOutput(
                observations=[self.message(text, png)],
                reward=0.0,
                done=False,
                metadata={"env": self.env.id},
            )
        reward = self.finish()
        return BaseTextEnvStepOutput(
            observations=[], reward=reward, done=True, metadata={"drums": self.judged.to_info()}
        )

    def close(self) -> None:
        if self.client is not None:
            self.client.close()  # destroys the env it created
            self.client = None

    def get_metrics(self) -> dict[str, Any]:
        v = self.judged
        return {
            "drums_valid": float(bool(v and v.valid)),
            "drums_actions": float(sum(self.action_counts.values())),
            "drums_reward_trusted": float(bool(v and v.trusted)),
        }

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
        try:
            action = computer_action(self.screen, parse_tool_call(reply))
        except actions.BadAction as exc:
            return f"error: {exc}", None, False
        try:
            if action is not None:
                self.env.step(action)
                self.action_counts[action["type"]] = self.action_counts.get(action["type"], 0) + 1
                if action["type"] in ("done", "fail"):
                    return action["type"], None, True
            png = self.env.observe().png
        except Exception as exc:
            if not desktop.is_drums_error(exc):
                raise
            if desktop.error_code(exc) in ("invalid_request", "action_failed"):
                return f"error: the desktop refused the action: {exc}", None, False
            self.failed = f"{desktop.error_code(exc)}: {exc}"
            return f"the desktop failed ({self.failed})", None, True
        return actions.describe(action) if action else "screenshot", png, False

    def finish(self) -> float:
        base = verdict.Verdict(env=self.env.id, actions=dict(self.action_counts))
        if self.failed:
            base.error = f"desktop failed mid-episode: {self.failed}"
            self.judged = base
        else:
            self.judged = verdict.judge(self.env.verify(strict=False), base)
        return verdict.enforce(self.judged)
