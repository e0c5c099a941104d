"""SkyRL (skyrl-gym 0.4): the `drums` environment, one drums desktop per trajectory.

Importing this module registers it, so `skyrl_gym.make("drums", env_config=..., extras=...)` works
(skyrl-train's generator calls exactly that with `env_class: drums`); put
`import drums_verifiers.adapters.skyrl` in your entrypoint. `BaseTextEnv` is synchronous, so this
uses the SDK's sync client. The model answers with
`<tool_call>{"name": "computer", "arguments": {...}}</tool_call>` (the `computer` schema of
adapters/computer.py); each step returns the tool result and, with `multimodal`, the screenshot.

    extras = {"drums_task": "<task id or inline OSWorld dict>", "max_turns": 15}
    env_config (skyrl_gym_cfg.drums) = {"multimodal": True, "screenshot_scale": "auto"}

`screenshot_scale: auto` (default) sizes the screenshots so that the opening one and one per turn
fit the generator's `max_input_length` (the conversation keeps every screenshot) with
`prompt_text_tokens` (512) for the text, at the model processor's limits (`image_processor`:
patch_size, merge_size, min_pixels, max_pixels; Qwen2.5-VL's by default): screen_fit.py. The
drums generator checks it when it is made, so a configuration that cannot fit one screenshot
fails before the first rollout; without it (or with `max_image_tokens`) the env sizes alone.

The daemon: `daemon_url` / `token_file` in extras, else in env_config, else DRUMS_URL /
DRUMS_TOKEN / DRUMS_TOKEN_FILE, else the SDK defaults (the first log line says which).

The trajectory ends on done/fail, a dead desktop or `max_turns`, and the desktop is closed then
(and by `close()`, on a failed `init`, and on any error out of `step`: skyrl-train's generator
closes an env only after a trajectory that finished without raising). skyrl-train has no way for
an env to leave a trajectory out of training (its generator turns every reward into a float), so an
invalid episode (a failed validity gate, a checker or desktop failure) ends at once with
`invalid_reward` (default 0.0), `metadata["drums_valid"] = False` and the metric
`drums_valid` 0.0, instead of raising (which would crash the generator's gather).

`drums_generator(SkyRLGymGenerator)` (below) is the generator to run it with: its trajectories
that are not trainable get an all-zero loss mask (no token of them is trained on), a sample whose
env or inference engine raises (unknown task, failed setup, model-server error, timeout) becomes
such a trajectory, logged with its task and reason, instead of failing the batch's gather, and the
desktops a trajectory opened are closed when it ends however it ends (skyrl's generators close an
env only after a trajectory that did not raise). `drums_trainer(RayPPOTrainer)` keeps such a
trajectory out of its GRPO group: skyrl groups by the prompt's uid, so a row with no trained token
gets a group of its own for the advantage computation (skyrl's own estimator, unchanged), and the
valid samples' mean and std are those of the valid samples alone.
"""

from __future__ import annotations

import base64
import contextvars
import json
import logging
import re
from typing import Any

from drums_verifiers import actions, desktop, screen_fit, verdict
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


# The envs made inside one drums generator's trajectory (set by `drums_generator`).
_TRAJECTORY_ENVS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "drums_trajectory_envs", default=None
)


class DrumsSkyRLEnv(BaseTextEnv):  # type: ignore[misc,valid-type]
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        opened = _TRAJECTORY_ENVS.get()
        if opened is not None:
            opened.append(self)
        extras = dict(extras or {})
        if "drums_task" not in extras:
            raise ValueError("extras['drums_task'] is required (a daemon task id or a task dict)")
        self.task = extras["drums_task"]
        self.max_turns = int(extras.get("max_turns", get(env_config, "max_turns", 15)))
        self.daemon = DaemonSettings.first_of(extras, env_config)
        self.multimodal = bool(get(env_config, "multimodal", True))
        scale = get(env_config, "screenshot_scale", "auto")
        self.scale = 1.0 if scale == "auto" else float(scale)
        # auto: the budget the drums generator worked out, else max_image_tokens, else full size
        budget = extras.get("drums_image_budget") or get(env_config, "max_image_tokens", None)
        self.image_budget = int(budget) if scale == "auto" and budget else None
        self.limits = screen_fit.ImageLimits.from_config(get(env_config, "image_processor", {}))
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
        size = desktop.png_size(obs.png)
        if self.image_budget is not None:
            self.scale = screen_fit.fit_scale(self.image_budget, self.limits, size).scale
        self.screen = actions.Screen(*size, self.scale)
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


def drums_generator(base: type) -> type:
    """`base` (skyrl-train's SkyRLGymGenerator, or skyrl's) with drums' trajectory rules: a
    trajectory that is not trainable gets an all-zero loss mask; one that raises is logged with
    its task and reason and returned as such a trajectory; its desktops are closed on every path.
    Use the returned class where your entrypoint builds the generator."""

    class DrumsGenerator(base):  # type: ignore[misc,valid-type]
        def __init__(self, generator_cfg: Any, skyrl_gym_cfg: Any, *args: Any, **kw: Any) -> None:
            super().__init__(generator_cfg, skyrl_gym_cfg, *args, **kw)
            drums = setting(skyrl_gym_cfg, ENV_ID) or {}
            self.drums_image_budget = check_screenshots(
                drums, generator_cfg, vision=hasattr(self, "_render_conversation")
            )

        async def agent_loop(
            self,
            prompt: Any,
            env_class: str,
            env_extras: dict[str, Any],
            max_tokens: int,
            max_input_length: int,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            task = _task_name((env_extras or {}).get("drums_task", "<no drums_task>"))
            if env_class == ENV_ID and self.drums_image_budget is not None:
                env_extras = {**env_extras, "drums_image_budget": self.drums_image_budget}
            opened: list[Any] = []
            token = _TRAJECTORY_ENVS.set(opened)
            try:
                out = await super().agent_loop(
                    prompt, env_class, env_extras, max_tokens, max_input_length, *args, **kwargs
                )
            except Exception as exc:  # one bad sample must not fail the batch's gather
                reason = _failure(exc)
                log.warning("task %s: sample left out of training: %s", task, reason)
                return self.left_out(prompt, reason)
            finally:
                _TRAJECTORY_ENVS.reset(token)
                for env in opened:  # idempotent; also on cancellation
                    env.close()
            metrics = getattr(out, "env_metrics", None) or {}
            if env_class == ENV_ID and not metrics.get("drums_valid", 0.0):
                out.loss_mask = [0] * len(out.loss_mask)
            return out

        async def generate(self, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
            out = await super().generate(input_batch, *args, **kwargs)
            out["rewards"] = uniform_rewards(out["rewards"], out["response_ids"])
            return out

        def left_out(self, prompt: Any, reason: str) -> Any:
            """A trajectory with no trained token and reward 0.0 for a sample that failed."""
            prompt_ids = self.tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True
            )
            if isinstance(prompt_ids, dict):  # transformers 5 returns a BatchEncoding
                prompt_ids = prompt_ids["input_ids"]
            end = self.tokenizer.eos_token_id
            fields = {
                "response_ids": [end if end is not None else 0],
                "reward": 0.0,
                "stop_reason": "drums_left_out",
                "loss_mask": [0],
                "prompt_ids": list(prompt_ids),
                "rollout_logprobs": None,
                "env_metrics": {"drums_valid": 0.0, "drums_actions": 0.0},
            }
            return _trajectory_output(type(self))(**fields)

    DrumsGenerator.__name__ = DrumsGenerator.__qualname__ = f"Drums{base.__name__}"
    return DrumsGenerator


def check_screenshots(drums: Any, generator_cfg: Any, vision: bool) -> int | None:
    """The image tokens one screenshot may cost under this generator (None: not sized), or a
    clear error for a configuration that cannot show the model its screenshots."""
    if not get(drums, "multimodal", True):
        return None
    if not vision:
        raise ValueError(
            "skyrl_gym_cfg.drums.multimodal is on, but this generator sends the model token ids "
            "only (skyrl-train's SkyRLGymGenerator): the screenshots would never reach it. Use "
            "skyrl's SkyRLVLMGymGenerator (skyrl>=0.3) or set skyrl_gym_cfg.drums.multimodal: false"
        )
    if get(drums, "screenshot_scale", "auto") != "auto":
        return None
    if get(drums, "max_image_tokens", None):
        return int(get(drums, "max_image_tokens", 0))
    max_input = int(setting(generator_cfg, "max_input_length") or 0)
    turns = int(setting(generator_cfg, "max_turns") or 1)
    text = int(get(drums, "prompt_text_tokens", 512))
    budget = (max_input - text) // (turns + 1)  # the opening screenshot and one per turn
    limits = screen_fit.ImageLimits.from_config(get(drums, "image_processor", {}))
    try:
        screen_fit.fit_scale(budget, limits, tuple(get(drums, "screen", screen_fit.DESKTOP)))
    except screen_fit.ScreenDoesNotFit as exc:
        raise ValueError(
            f"generator.max_input_length {max_input} over max_turns {turns} leaves {budget} tokens "
            f"a screenshot (prompt_text_tokens {text} kept for the text; the conversation keeps "
            f"the opening screenshot and one per turn): {exc}"
        ) from exc
    return budget


def uniform_rewards(rewards: list[Any], responses: list[list[int]]) -> list[Any]:
    """The batch's rewards in one form, as skyrl's trainer requires (all floats or all per-token
    lists): a left-out trajectory's 0.0 beside per-token rewards becomes per-token too."""
    if not any(isinstance(r, list) for r in rewards):
        return rewards
    return [
        r if isinstance(r, list) else [0.0] * (len(ids) - 1) + [float(r)]
        for r, ids in zip(rewards, responses, strict=True)
    ]


def left_out_groups(uids: list[str], trained: list[bool]) -> list[str]:
    """The uids with each row that has no trained token alone in its group."""
    return [
        uid if keep else f"{uid}/drums-left-out-{i}"
        for i, (uid, keep) in enumerate(zip(uids, trained, strict=True))
    ]


def drums_trainer(base: type) -> type:
    """`base` (skyrl-train's or skyrl's RayPPOTrainer) whose advantages leave the trajectories
    with an all-zero loss mask (`drums_generator`'s left-out ones) out of their group's statistics.
    Use the returned class where your entrypoint builds the trainer."""

    class DrumsTrainer(base):  # type: ignore[misc,valid-type]
        def compute_advantages_and_returns(self, data: Any) -> Any:
            uids = list(data.metadata["uids"])
            trained = (data["loss_mask"].sum(dim=-1) > 0).tolist()
            data.metadata["uids"] = left_out_groups(uids, trained)
            try:
                result = super().compute_advantages_and_returns(data)
            finally:
                data.metadata["uids"] = uids
            result.metadata["uids"] = uids  # the batch goes on grouped as it came
            return result

    DrumsTrainer.__name__ = DrumsTrainer.__qualname__ = f"Drums{base.__name__}"
    return DrumsTrainer


def _trajectory_output(generator: type) -> type:
    """The TrajectoryOutput class of the generator's own module (skyrl-train's or skyrl's)."""
    import sys

    for klass in generator.__mro__:
        found = getattr(sys.modules.get(klass.__module__), "TrajectoryOutput", None)
        if found is not None:
            return found
    raise TypeError(f"{generator.__name__} has no TrajectoryOutput in its module")


def _failure(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):
        return f"timeout: {exc or 'the trajectory timed out'}"
    kind = desktop.error_code(exc) if desktop.is_drums_error(exc) else type(exc).__name__
    return f"{kind}: {exc}"


def _task_name(task: Any) -> str:
    return str(task.get("id", "<inline>")) if isinstance(task, dict) else str(task)


if skyrl_gym is not None and ENV_ID not in skyrl_gym.registry:
    skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:DrumsSkyRLEnv")
