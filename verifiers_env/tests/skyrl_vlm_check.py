"""The SkyRL env through skyrl 0.3.0's own SkyRLVLMGymGenerator (run by test_vf_skyrl.py in the
skyrl-vlm venv, scripts/trainers/skyrl-vlm.txt).

The generator sends the whole conversation, OpenAI-format with base64 images, to its inference
client's `render_chat_completion` and generates from the rendered ids; a scripted stand-in plays
that client (it renders with a WordLevel tokenizer built here and records every image it was
sent). The desktop is the fake drumsd, or a real daemon when DRUMS_SKYRL_VLM_LIVE_TASK names a
task (DRUMS_URL / DRUMS_TOKEN_FILE say where).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import typing
from typing import Any

import typing_extensions

# skyrl 0.3.0 declares Python >= 3.11, but skyrl.tinker.types puts a typing.TypedDict in a pydantic
# model, which pydantic refuses below 3.12; the CPU torch wheel this venv uses is a 3.11 one. So
# the backport stands in for it here, before skyrl is imported (on 3.12 this changes nothing).
typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]

import drums_verifiers.adapters.skyrl as drums_skyrl  # noqa: E402
import pytest  # noqa: E402
from drums_verifiers import desktop  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from skyrl.train.generators.skyrl_vlm_generator import SkyRLVLMGymGenerator  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from vf_support import fake_daemon_unless_live, live_envs  # noqa: E402

LIVE_TASK = os.environ.get("DRUMS_SKYRL_VLM_LIVE_TASK")
WORDS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<image>", "system", "user", "assistant"]
WORDS += ["You", "are", "a", "helpful", "assistant.", "I", "am", "user.", "acting", "nothing"]
DrumsVLMGenerator = drums_skyrl.drums_generator(SkyRLVLMGymGenerator)


def reply(**arguments: Any) -> str:
    call = json.dumps({"name": "computer", "arguments": arguments})
    return f"acting <tool_call> {call} </tool_call>"


def tiny_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    words = [*WORDS, *(w for text in corpus for w in text.split())]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(dict.fromkeys(words))}, "<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>"
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m.role }} {% if m.content is string %}"
        "{{ m.content }}{% endif %} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return tok


class RenderingServer:
    """Stands in for skyrl's RemoteInferenceClient: renders OpenAI-format messages (an image
    block is one `<image>` token; a real vLLM server turns it into the image's tokens and pixel
    features), answers each session from its own script, and records the images of each render.
    `fail` maps a session to the call on which the model server dies."""

    model_name = "stand-in"

    def __init__(self, tok: Any, replies: list[str], fail: dict[str, int] | None = None) -> None:
        self.tok, self.replies, self.fail = tok, replies, dict(fail or {})
        self.images: dict[str, list[list[tuple[int, int]]]] = {}  # session -> per turn: sizes
        self.calls: dict[str, int] = {}
        self.finished: list[str] = []
        self._last_images: list[tuple[int, int]] = []
        self.hang: set[str] = set()  # sessions whose second call never answers
        self.hanging = asyncio.Event()

    def render_text(self, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        parts, sizes = [], []
        for m in messages:
            content = m["content"]
            if isinstance(content, list):
                words = []
                for block in content:
                    if block.get("type") == "text":
                        words.append(block["text"])
                    elif block.get("type") == "image_url":
                        url = block["image_url"]["url"]
                        assert url.startswith("data:image/png;base64,"), url[:40]
                        png = base64.b64decode(url.split(",", 1)[1])
                        sizes.append(desktop.png_size(png))
                        words.append("<image>")
                content = " ".join(words)
            if m["role"] == "assistant":
                parts.append(f"<|im_start|> assistant {content}")
            else:
                parts.append(f"<|im_start|> {m['role']} {content} <|im_end|>")
        return " ".join([*parts, "<|im_start|> assistant"]), sizes

    async def render_chat_completion(self, request: dict[str, Any]) -> dict[str, Any]:
        text, sizes = self.render_text(request["json"]["messages"])
        self._last_images = sizes
        return {"token_ids": self.tok.encode(text, add_special_tokens=False), "features": None}

    async def generate(self, engine_input: dict[str, Any], model: Any = None) -> dict[str, Any]:
        session = engine_input["session_ids"][0]
        n = self.calls[session] = self.calls.get(session, 0) + 1
        self.images.setdefault(session, []).append(list(self._last_images))
        if self.fail.get(session) == n:
            raise ConnectionError(f"model server died on call {n} (scripted)")
        if session in self.hang and n == 2:
            self.hanging.set()
            await asyncio.sleep(3600)
        text = (self.replies[n - 1] if n <= len(self.replies) else "nothing") + " <|im_end|>"
        ids = self.tok.encode(text, add_special_tokens=False)
        return {"responses": [text], "response_ids": [ids], "stop_reasons": ["stop"]}

    async def finish_session(self, session_id: str) -> None:
        self.finished.append(session_id)


def vlm_generator(
    server: RenderingServer, drums: dict[str, Any], max_turns: int = 6, max_input: int = 16384
) -> Any:
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
            "max_input_length": max_input,
        }
    )
    # a real daemon's first desktop on a task also runs its setup and captures it: give its gates
    # the time they take on a loaded host
    drums = {"wait_valid_timeout_s": 600 if LIVE_TASK else 120, **drums}
    gym_cfg = OmegaConf.create({"max_env_workers": 0, "drums": {"multimodal": True, **drums}})
    return DrumsVLMGenerator(cfg, gym_cfg, server, server.tok, "stand-in")


def group(
    task: str, replies: list[str], fail: dict[str, int], n: int = 4, drums: Any = None
) -> tuple[list[Any], RenderingServer]:
    """A GRPO group: n trajectories of one prompt, as skyrl's generate runs them (concurrently)."""
    from skyrl.train.generators.base import TrajectoryID

    server = RenderingServer(tiny_tokenizer(replies), replies, fail)
    gen = vlm_generator(server, drums or {})
    prompt = [{"role": "system", "content": "acting"}]

    async def go() -> list[Any]:
        return await asyncio.gather(
            *(
                gen.agent_loop(
                    prompt,
                    "drums",
                    {"drums_task": task},
                    256,
                    16384,
                    sampling_params={"logprobs": None, "max_tokens": 256},
                    trajectory_id=TrajectoryID("p0", i),
                )
                for i in range(n)
            )
        )

    return asyncio.run(go()), server


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    yield from fake_daemon_unless_live(LIVE_TASK, tmp_path, monkeypatch)


def grpo(outs: list[Any], uids: list[str]) -> list[float]:
    """skyrl's own GRPO estimator on the trajectories' rewards, per row (first trained token)."""
    import torch
    from skyrl.backends.skyrl_train.utils.ppo_utils import (
        AdvantageEstimatorRegistry,
        compute_advantages_and_returns,
    )

    AdvantageEstimatorRegistry.repopulate_registry()
    width = max(len(o.response_ids) for o in outs)
    rewards = torch.zeros(len(outs), width)
    mask = torch.zeros(len(outs), width)
    for i, o in enumerate(outs):
        per_token = o.reward if isinstance(o.reward, list) else [0.0] * (len(o.response_ids) - 1)
        if not isinstance(o.reward, list):
            per_token.append(float(o.reward))
        rewards[i, : len(per_token)] = torch.tensor(per_token)
        mask[i, : len(o.response_ids)] = 1
    advantages, _ = compute_advantages_and_returns(
        token_level_rewards=rewards, response_mask=mask, index=uids, adv_estimator="grpo",
        config=OmegaConf.create({}), grpo_norm_by_std=True,
    )  # fmt: skip
    return [round(float(a[0]), 4) for a in advantages]


def check_group(outs: list[Any], server: RenderingServer, failed: str) -> list[float]:
    """Every turn's render carried the screenshots so far; the failed sample is out of the loss
    and of its group; every session was finished. Returns skyrl's advantages under drums."""
    for session, turns in server.images.items():
        if session == failed:
            continue
        counts = [len(sizes) for sizes in turns]
        assert counts == list(range(1, len(turns) + 1)), (session, counts)  # one more per turn
    assert sorted(server.finished) == [f"p0_{i}" for i in range(len(outs))]  # every session
    valid = [bool(o.env_metrics.get("drums_valid")) for o in outs]
    for o, ok in zip(outs, valid, strict=True):
        assert (1 in o.loss_mask) == ok
    trained = [1 in o.loss_mask for o in outs]
    return grpo(outs, drums_skyrl.left_out_groups(["p0"] * len(outs), trained))


SOLVE = [reply(action="click", x=10, y=10), reply(action="type", text="42"), reply(action="done")]


def cancelled_mid_trajectory(task: str, replies: list[str]) -> int:
    """A trajectory cancelled while its model call hangs (desktop open, one action done), as
    skyrl cancels a generation; returns the envs the daemon still lists for it afterwards."""
    from skyrl.train.generators.base import TrajectoryID

    before = live_envs()
    server = RenderingServer(tiny_tokenizer(replies), replies)
    server.hang.add("p1_0")
    gen = vlm_generator(server, {})

    async def go() -> None:
        run = asyncio.ensure_future(
            gen.agent_loop(
                [{"role": "system", "content": "acting"}], "drums", {"drums_task": task}, 256,
                16384, sampling_params={"logprobs": None}, trajectory_id=TrajectoryID("p1", 0),
            )
        )  # fmt: skip
        await server.hanging.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(go())
    assert server.finished == ["p1_0"]
    return len(live_envs() - before)


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_vlm_generator_group_of_four_with_one_model_error(daemon):
    before = live_envs()
    outs, server = group("solve", SOLVE, fail={"p0_2": 2})
    per_turn = {s: [len(t) for t in v] for s, v in server.images.items()}
    print("DRUMS_SKYRL_VLM_IMAGES", json.dumps(per_turn))
    assert [o.env_metrics["drums_valid"] for o in outs] == [1.0, 1.0, 0.0, 1.0]
    assert outs[2].stop_reason == "drums_left_out"
    advantages = check_group(outs, server, failed="p0_2")
    assert advantages == [0.0, 0.0, 0.0, 0.0]  # three solved (1.0 each): a group of 3
    assert grpo(outs, ["p0"] * 4)[:2] == [0.5, 0.5]  # what the 0.0 would have done in the group
    assert live_envs() == before  # the failed sample's desktop too
    assert cancelled_mid_trajectory("solve", SOLVE) == 0


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_vlm_screenshots_are_sized_to_max_input_length(daemon):
    """max_input_length 4096 over 3 turns leaves 896 tokens a screenshot: 896x504 (576 tokens)
    at Qwen2.5-VL's limits for a 1920x1080 screen (the fake's 192x108 screen stays whole); 1024
    cannot fit one, and the generator says so when it is made."""
    from drums_verifiers import screen_fit

    server = RenderingServer(tiny_tokenizer(SOLVE), SOLVE)
    gen = vlm_generator(server, {}, max_turns=3, max_input=4096)
    assert gen.drums_image_budget == 896 and screen_fit.fit_scale(896).width == 896
    with pytest.raises(ValueError, match=r"max_input_length 1024 over max_turns 3 leaves 128"):
        vlm_generator(server, {}, max_turns=3, max_input=1024)


def rewards_of(outs: list[Any]) -> list[float]:
    return [sum(o.reward) if isinstance(o.reward, list) else float(o.reward) for o in outs]


@pytest.mark.skipif(not LIVE_TASK, reason="set by the live test with a real daemon")
def test_vlm_generator_group_of_four_on_a_real_desktop(record_property):
    """A GRPO group of 4 on a real task (e0df059f: rename ~/Desktop/todo_list_Jan_1 to
    todo_list_Jan_2), each sample solving it in the desktop's xterm (at +40+40), clicking where
    the xterm is on the screenshot it was sent; sample 2's model server dies on its second call
    (mid-trajectory). Every turn's render had the screenshots so far; the three solved get a
    group of 3's advantages (0), where skyrl's GRPO with the failed 0.0 in the group gives +0.5."""
    from drums_verifiers import screen_fit

    probe = RenderingServer(tiny_tokenizer(SOLVE), SOLVE)
    fit = screen_fit.fit_scale(vlm_generator(probe, {}).drums_image_budget)
    replies = [
        reply(action="click", x=round(300 * fit.scale), y=round(200 * fit.scale)),
        reply(action="type", text="mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"),
        reply(action="key", key="enter"),
        reply(action="done"),
    ]
    before = live_envs()
    outs, server = group(LIVE_TASK, replies, fail={"p0_2": 2})
    advantages = check_group(outs, server, failed="p0_2")
    sizes = sorted({size for turns in server.images.values() for t in turns for size in t})
    result = {
        "valid": [o.env_metrics.get("drums_valid") for o in outs],
        "rewards": rewards_of(outs),
        "images_per_turn": {s: [len(t) for t in v] for s, v in server.images.items()},
        "image_sizes": sizes,
        "advantages": advantages,
        "advantages_with_the_failed_in_the_group": grpo(outs, ["p0"] * len(outs)),
        "envs_left_after_cancel": cancelled_mid_trajectory(LIVE_TASK, replies),
    }
    print("DRUMS_SKYRL_VLM_RESULT", json.dumps(result))
    record_property("result", result)
    assert result["valid"] == [1.0, 1.0, 0.0, 1.0] and result["envs_left_after_cancel"] == 0
    assert result["rewards"] == [1.0, 1.0, 0.0, 1.0]  # solved on the real desktop
    assert sizes == [(fit.width, fit.height)]  # the fitted size, every screenshot
    assert advantages == [0.0] * 4
    assert result["advantages_with_the_failed_in_the_group"] == [0.5, 0.5, -1.5, 0.5]
    assert live_envs() == before
