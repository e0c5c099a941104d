"""The SkyRL env through skyrl-train 0.3.1's own SkyRLGymGenerator (run by test_vf_skyrl.py).

skyrl-train cannot install with its dependencies here (Python ==3.12, flash-attn, vllm), so its
venv has it without them (scripts/trainers/skyrl.txt); its generator module imports and runs. A
WordLevel tokenizer is built here and a scripted stand-in answers for its InferenceEngineClient.
The desktop is the fake drumsd, found through DRUMS_URL / DRUMS_TOKEN_FILE, or a real daemon when
DRUMS_SKYRL_LIVE_TASK names a task.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import drums_verifiers.adapters.skyrl as drums_skyrl
import pytest
import skyrl_gym
from omegaconf import OmegaConf
from skyrl_train.generators.skyrl_gym_generator import SkyRLGymGenerator
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m.role }} "
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'text' %}{{ c.text }} {% else %}<image> {% endif %}{% endfor %}{% endif %}"
    " <|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
LIVE_TASK = os.environ.get("DRUMS_SKYRL_LIVE_TASK")


def reply(**arguments: Any) -> str:
    call = json.dumps({"name": "computer", "arguments": arguments})
    return f"acting <tool_call> {call} </tool_call>"


def tiny_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    words = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<image>", "system", "user"]
    words += ["assistant", "You", "are", "a", "helpful", "assistant.", "I", "am", "user."]
    words += [w for text in corpus for w in text.split()]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(dict.fromkeys(words))}, "<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>"
    )
    tok.chat_template = TEMPLATE
    return tok


class ScriptedEngine:
    """Stands in for skyrl-train's InferenceEngineClient.generate (one scripted reply a call)."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.calls = tokenizer, list(replies), 0

    async def generate(self, engine_input: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        text = (self.replies.pop(0) if self.replies else "nothing") + " <|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return {"responses": [text], "response_ids": [ids], "stop_reasons": ["stop"]}


def generator(replies: list[str], max_turns: int = 6) -> tuple[SkyRLGymGenerator, ScriptedEngine]:
    tok = tiny_tokenizer([*replies, "acting nothing"])
    engine = ScriptedEngine(tok, replies)
    cfg = OmegaConf.create(
        {
            "max_turns": max_turns,
            "batched": False,
            "use_conversation_multi_turn": True,
            "chat_template": {"source": "name", "name_or_path": None},
            "chat_template_kwargs": {},
            "step_wise_trajectories": False,
            "sampling_params": {"logprobs": None, "max_generate_length": 256},
            "append_eos_token_after_stop_str_in_multi_turn": True,
            "zero_reward_on_non_stop": False,
            "apply_overlong_filtering": False,
            "max_input_length": 100000,
        }
    )
    gym_cfg = OmegaConf.create({"max_env_workers": 0, "drums": {"multimodal": True}})
    return SkyRLGymGenerator(cfg, gym_cfg, engine, tok, "tiny"), engine


def live_envs() -> set[str]:
    import drums

    with drums.connect() as client:
        return {e.id for e in client.list_envs()}


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    if LIVE_TASK:
        yield None
        return
    from vf_support import fake_daemon_env

    yield from fake_daemon_env(tmp_path, monkeypatch)


def run(task: str, replies: list[str], max_turns: int = 6) -> tuple[Any, ScriptedEngine]:
    gen, engine = generator(replies, max_turns)
    prompt = [{"role": "system", "content": "acting"}]
    out = asyncio.run(gen.agent_loop(prompt, "drums", {"drums_task": task}, 256, 100000))
    return out, engine


def test_registered_on_import():
    assert drums_skyrl.ENV_ID in skyrl_gym.registry
    assert skyrl_gym.registry["drums"].entry_point.endswith(":DrumsSkyRLEnv")


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_generator_runs_a_solved_episode(daemon):
    before = live_envs()
    out, engine = run("solve", [reply(action="click", x=10, y=10), reply(action="type", text="42"),
                                reply(action="done")])  # fmt: skip
    assert engine.calls == 3
    assert out.env_metrics["drums_valid"] == 1.0
    reward = out.reward if isinstance(out.reward, float) else sum(out.reward)
    assert reward == 1.0 and out.stop_reason == "stop"
    assert 1 in out.loss_mask and 0 in out.loss_mask  # the env's observations are not trained
    assert live_envs() == before


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_generator_gets_an_invalid_episode_without_a_reward_or_a_crash(daemon):
    before = live_envs()
    out, engine = run("crash", [reply(action="type", text="42"), reply(action="click", x=1, y=1),
                                reply(action="done")])  # fmt: skip
    assert engine.calls == 3  # the generator's gather did not crash on the invalid verdict
    reward = out.reward if isinstance(out.reward, float) else sum(out.reward)
    assert reward == 0.0 and out.env_metrics["drums_valid"] == 0.0
    assert live_envs() == before


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_generator_with_an_unknown_task_raises_and_leaks_nothing(daemon):
    before = live_envs()
    with pytest.raises(Exception, match=r"(?i)task"):
        run("no-such-task", [reply(action="done")])
    assert live_envs() == before


@pytest.mark.skipif(not LIVE_TASK, reason="set by the live test with a real daemon")
def test_generator_on_a_real_desktop():
    before = live_envs()
    out, engine = run(LIVE_TASK, [reply(action="click", x=200, y=200), reply(action="done")])
    print("DRUMS_SKYRL_RESULT", json.dumps({"reward": out.reward, **out.env_metrics}, default=str))
    assert engine.calls == 2 and out.env_metrics["drums_valid"] == 1.0
    assert live_envs() == before
