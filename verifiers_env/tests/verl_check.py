"""The verl adapter against verl 0.9.1's own classes (run in the verl venv by test_vf_verl.py).

No GPU, no hub: a WordLevel tokenizer and a Qwen2-VL processor are built here, and a scripted
stand-in answers for verl's LLM server manager. The desktop is the fake drumsd, or a real daemon
when DRUMS_VERL_LIVE_TASK names a task (DRUMS_URL / DRUMS_TOKEN_FILE then say where it is).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from types import SimpleNamespace
from typing import Any

import hydra
import pytest
from drums_verifiers import actions, screen_fit
from drums_verifiers.adapters import verl as drums_verl
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil, Qwen2VLProcessor
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import ToolResponse
from verl.tools.tool_registry import initialize_tools_from_config
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
SPECIAL += ["<|video_pad|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m.role }} "
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'text' %}{{ c.text }} {% elif c.type in ['image', 'image_url'] %}"
    "<|vision_start|> <|image_pad|> <|vision_end|> {% endif %}{% endfor %}{% endif %}"
    " <|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def reply(**arguments: Any) -> str:
    call = json.dumps({"name": "computer", "arguments": arguments})
    return f"acting <tool_call> {call} </tool_call> <|im_end|>"


class TinyProcessor(Qwen2VLProcessor):
    """Qwen2-VL's processor without its video half (that needs torchvision, not installed)."""

    def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


def tiny_tokenizer(corpus: list[str]) -> tuple[PreTrainedTokenizerFast, TinyProcessor]:
    words = ["<pad>", "<unk>", *SPECIAL, "system", "user", "assistant", "tool"]
    words += [w for text in corpus for w in text.split()]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|im_end|>",
        additional_special_tokens=SPECIAL,
    )
    tok.chat_template = TEMPLATE
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    return tok, TinyProcessor(image_processor=images, tokenizer=tok, chat_template=TEMPLATE)


class ScriptedServer:
    """Stands in for verl's LLM server manager: each generate returns the next scripted reply."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.calls = tokenizer, list(replies), []

    async def generate(
        self, *, request_id: str, prompt_ids: list[int], **kwargs: Any
    ) -> TokenOutput:
        self.calls.append(
            {"prompt_ids": list(prompt_ids), "images": len(kwargs.get("image_data") or [])}
        )
        text = self.replies.pop(0) if self.replies else "nothing more <|im_end|>"
        return TokenOutput(token_ids=self.tokenizer.encode(text, add_special_tokens=False))


def trainer_config() -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 4096,
                    "response_length": 4096,
                    "full_determinism": False,
                    "multi_turn": {
                        "max_user_turns": 10,
                        "max_assistant_turns": 10,
                        "max_parallel_calls": 1,
                        "max_tool_response_length": 512,
                        "tool_response_truncate_side": "middle",
                        "format": "hermes",
                    },
                }
            },
            "data": {},
        }
    )


def make_loop(replies: list[str], tools: list[Any]) -> tuple[Any, ScriptedServer, Any]:
    """The agent loop, made the way verl's AgentLoopWorker makes one per trajectory."""
    tok, processor = tiny_tokenizer([*replies, "acting nothing more"])
    server = ScriptedServer(tok, replies)
    for entry in OmegaConf.load(drums_verl.AGENT_LOOP_CONFIG):  # as agent_loop_config_path
        _agent_loop_registry[entry.name] = entry
    config = trainer_config()
    loop = hydra.utils.instantiate(
        config=_agent_loop_registry["drums_desktop"],
        trainer_config=DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=tok,
        processor=processor,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap(tools),
    )
    return loop, server, tok


def shipped_tools() -> list[Any]:
    """verl's own loader on the shipped tool YAML (daemon from DRUMS_URL / DRUMS_TOKEN_FILE).
    Live, the gates get 600 s: a real daemon's first desktop on a task also runs its setup."""
    path = os.path.join(os.path.dirname(drums_verl.__file__), "verl_tools.yaml")
    tools = initialize_tools_from_config(path)
    if LIVE_TASK:
        for tool in tools:
            tool.wait_valid_timeout_s = 600.0
    return tools


def live_envs() -> set[str]:
    """The daemon's envs, by the SDK (works for the fake and the real daemon)."""
    import drums

    with drums.connect() as client:
        return {e.id for e in client.list_envs()}


LIVE_TASK = os.environ.get("DRUMS_VERL_LIVE_TASK")


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    if LIVE_TASK:
        yield None
        return
    from vf_support import fake_daemon_env

    yield from fake_daemon_env(tmp_path, monkeypatch)


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_call_tool_replay_keeps_one_desktop_per_trajectory_and_releases_it(daemon):
    """verl's real ToolAgentLoop._call_tool: create/execute/release per call, one desktop."""
    (tool,) = shipped_tools()
    assert isinstance(tool, drums_verl.DrumsComputerTool) and tool.name == "computer"
    loop_self = SimpleNamespace(
        tools={"computer": tool}, max_tool_response_length=512, tool_response_truncate_side="middle"
    )
    kwargs = {"computer": {"create_kwargs": {"drums_task": "solve"}}}
    before = live_envs()

    async def trajectory() -> list[Any]:
        data = AgentData([], [], [], None, None, {}, "req-1", kwargs)
        results = []
        for args in ({"action": "click", "x": 10, "y": 10}, {"action": "type", "text": "42"}):
            call = FunctionCall(name="computer", arguments=json.dumps(args))
            results.append(await ToolAgentLoop._call_tool(loop_self, call, kwargs, data))
            results.append(len(live_envs() - before))
        call = FunctionCall(name="computer", arguments=json.dumps({"action": "done"}))
        results.append(await ToolAgentLoop._call_tool(loop_self, call, kwargs, data))
        results.append(len(live_envs() - before))
        del data  # verl drops the trajectory's AgentData when its loop returns
        await asyncio.sleep(0.2)
        return results

    r = asyncio.run(trajectory())
    (click, _, _), after_click, (_typed, _, _), after_type, (done, reward, _), after_done = r
    assert isinstance(click, ToolResponse) and click.image and click.text.startswith("click")
    assert (after_click, after_type, after_done) == (1, 1, 1)  # one desktop across the calls
    assert done.text == "done" and reward == 1.0  # the checker's score as the step reward
    assert tool.calls == {} and tool.trajectories == {}
    assert live_envs() == before  # gone with its trajectory


def run_loop(task: str, replies: list[str]) -> tuple[AgentLoopOutput | list, ScriptedServer, Any]:
    async def go() -> Any:
        # made inside the event loop, as AgentLoopWorker makes it (AgentLoopBase keeps the loop)
        loop, server, tok = make_loop(replies, shipped_tools())
        out = await loop.run(
            {"temperature": 1.0},
            raw_prompt=[{"role": "system", "content": "acting"}],
            tools_kwargs={"computer": {"create_kwargs": {"drums_task": task}}},
        )
        return out, server, tok

    return asyncio.run(go())


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_agent_loop_runs_an_episode_and_returns_agent_loop_output(daemon):
    before = live_envs()
    replies = [
        reply(action="click", x=10, y=10),
        reply(action="type", text="42"),
        reply(action="done"),
    ]
    out, server, tok = run_loop("solve", replies)
    assert isinstance(out, AgentLoopOutput)
    assert out.reward_score == 1.0 and out.extra_fields["reward_extra_info"]["drums_valid"] == 1.0
    images = out.multi_modal_data["images"]
    assert len(images) == 3  # the opening screenshot and one after each of click and type
    assert [c["images"] for c in server.calls] == [1, 2, 3]
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert pad in out.prompt_ids and out.response_ids.count(pad) > 0
    assert len(out.response_ids) == len(out.response_mask)
    assert 0 in out.response_mask and 1 in out.response_mask  # tool tokens masked, model's kept
    generated = tok.decode(
        [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m]
    )
    assert generated.count("<tool_call>") == 3
    dumped = out.as_dict()  # verl's own conversion: the reward on the last response token
    assert float(dumped["rm_scores"][-1]) == 1.0
    assert live_envs() == before


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_agent_loop_leaves_an_invalid_episode_out(daemon, monkeypatch):
    before = live_envs()
    replies = [reply(action="type", text="42"), reply(action="done")]
    out, _, _ = run_loop("crash", replies)
    assert out == []  # the default, drop: verl's v1 worker skips it ("Empty output for prompt")
    assert live_envs() == before
    monkeypatch.setattr(drums_verl.DrumsComputerTool, "__init__", _masking_init)
    out, _, _ = run_loop("crash", replies)
    assert out.extra_fields["reward_extra_info"]["drums_valid"] == 0.0
    assert out.reward_score == 0.0 and set(out.response_mask) == {0}  # nothing of it is trained
    assert live_envs() == before


_original_init = drums_verl.DrumsComputerTool.__init__


def _masking_init(self: Any, config: dict[str, Any], tool_schema: Any = None) -> None:
    _original_init(self, {**config, "invalid_episode": "mask"}, tool_schema)


@pytest.mark.skipif(not LIVE_TASK, reason="set by the live test with a real daemon")
def test_agent_loop_on_a_real_desktop():
    before = live_envs()
    replies = [
        reply(action="click", x=200, y=200),
        reply(action="screenshot"),
        reply(action="done"),
    ]
    out, server, _ = run_loop(LIVE_TASK, replies)
    assert isinstance(out, AgentLoopOutput)
    info = out.extra_fields["drums"]
    print("DRUMS_VERL_RESULT", json.dumps({"reward": out.reward_score, **info}, default=str))
    assert info["valid"] is True and out.reward_score is not None
    assert len(out.multi_modal_data["images"]) == 3 and len(server.calls) == 3
    assert live_envs() == before


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_worker_postprocess_batches_a_valid_and_a_masked_episode(daemon, monkeypatch):
    """verl's AgentLoopWorker._agent_loop_postprocess and _postprocess on both outputs (the
    legacy batch worker, `trainer.use_v1: false`, where an invalid episode comes back masked)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    monkeypatch.setattr(drums_verl, "uses_v1_worker", lambda config: False, raising=False)

    async def go() -> Any:
        outputs = []
        for task in ("solve", "crash"):
            replies = [reply(action="type", text="42"), reply(action="done")]
            loop, _, tok = make_loop(replies, shipped_tools())
            outputs.append(
                await loop.run(
                    {},
                    raw_prompt=[{"role": "system", "content": "acting"}],
                    tools_kwargs={"computer": {"create_kwargs": {"drums_task": task}}},
                )
            )
        worker = object.__new__(AgentLoopWorker)  # the attributes these two methods read
        config = trainer_config()
        worker.config, worker.rollout_config = config, config.actor_rollout_ref.rollout
        worker.tokenizer, worker.processor = tok, loop.processor
        worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
        worker.mm_processor_kwargs = {}
        padded = [await worker._agent_loop_postprocess(o, False, raw_prompt=[]) for o in outputs]
        return worker._postprocess(padded, input_non_tensor_batch=None)

    batch = asyncio.run(go())
    assert batch.batch["rm_scores"].sum(-1).tolist() == [1.0, 0.0]
    trained = batch.batch["response_mask"].sum(-1).tolist()
    assert trained[0] > 0 and trained[1] == 0  # the invalid episode adds no token to the loss
    assert batch.non_tensor_batch["drums_valid"].tolist() == [1.0, 0.0]


# --- GRPO with an invalid sample, one bad sample in a batch, screenshot sizing (issue 30) --------


def grpo_batch(outputs: list[AgentLoopOutput], uids: list[str]) -> Any:
    """A verl DataProto of the outputs as verl's trainers read them: the reward on the last
    response token (AgentLoopOutput.as_dict's rm_scores), the response mask, the group's uid."""
    import numpy as np
    import torch
    from verl.protocol import DataProto

    dumped = [o.as_dict() for o in outputs]
    width = max(len(d["responses"]) for d in dumped)

    def padded(key: str) -> Any:
        rows = [torch.nn.functional.pad(d[key].float(), (0, width - len(d[key]))) for d in dumped]
        return torch.stack(rows)

    tensors = {"token_level_rewards": padded("rm_scores"), "response_mask": padded("response_mask")}
    data = DataProto.from_dict(tensors=tensors)
    data.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    return data


def row_advantages(data: Any) -> list[float]:
    """Each row's (sequence-level) advantage: its value on the first trained token, 0 if none."""
    values = []
    for adv, mask in zip(data.batch["advantages"], data.batch["response_mask"], strict=True):
        trained = mask.nonzero()
        values.append(round(float(adv[trained[0]]), 4) if len(trained) else 0.0)
    return values


def group_of_four() -> list[Any]:
    """3 solved + 1 invalid (the fake drumsd's `crash` task), in the shipped default config."""
    replies = [reply(action="type", text="42"), reply(action="done")]
    return [run_loop(task, replies)[0] for task in ("solve", "solve", "crash", "solve")]


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_an_invalid_sample_is_out_of_its_grpo_group_under_verl_v1(daemon):
    """The default (drop) through verl's own v1 advantage: solved samples get a group of 3's."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    before = live_envs()
    outputs = group_of_four()
    assert outputs[2] == []  # AgentLoopWorkerTQ puts nothing for it ("Empty output for prompt")
    # the keys AgentLoopWorkerTQ._agent_loop_postprocess writes: {uid}_{session_id}_{index}
    kept = [(f"p0_{session}_0", o) for session, o in enumerate(outputs) if o != []]
    assert [key for key, _ in kept] == ["p0_0_0", "p0_1_0", "p0_3_0"]
    data = compute_advantage_for_multi_trajectories(
        grpo_batch([o for _, o in kept], ["p0"] * 3),
        batch_keys=[key for key, _ in kept],
        adv_estimator="grpo",
        num_repeat=4,
    )
    three = grpo_batch([o for _, o in kept], ["p0"] * 3)
    rewards, mask = three.batch["token_level_rewards"], three.batch["response_mask"]
    expected, _ = compute_grpo_outcome_advantage(rewards, mask, three.non_tensor_batch["uid"])
    three.batch["advantages"] = expected
    print("DRUMS_VERL_GRPO v1", row_advantages(data), "group of 3", row_advantages(three))
    assert row_advantages(data) == row_advantages(three) == [0.0, 0.0, 0.0]
    assert live_envs() == before


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_the_legacy_batch_worker_masks_and_drums_grpo_keeps_the_group_unbiased(daemon, monkeypatch):
    """verl's legacy batch worker needs 4 outputs: the invalid one is masked; verl's own GRPO
    would give the solved +0.5 from its 0.0, `drums_grpo` (verl's GRPO over the trained rows) 0."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn

    monkeypatch.setattr(drums_verl, "uses_v1_worker", lambda config: False, raising=False)
    outputs = group_of_four()
    assert all(isinstance(o, AgentLoopOutput) for o in outputs)
    assert set(outputs[2].response_mask) == {0} and outputs[2].reward_score == 0.0
    data = grpo_batch(outputs, ["p0"] * 4)
    rewards, mask, uid = (data.batch["token_level_rewards"], data.batch["response_mask"],
                          data.non_tensor_batch["uid"])  # fmt: skip
    biased, _ = compute_grpo_outcome_advantage(rewards, mask, uid)
    data.batch["advantages"] = biased
    assert row_advantages(data) == [0.5, 0.5, 0.0, 0.5]  # the bias drums_grpo removes
    unbiased, _ = get_adv_estimator_fn("drums_grpo")(
        token_level_rewards=rewards, response_mask=mask, index=uid
    )
    data.batch["advantages"] = unbiased
    assert row_advantages(data) == [0.0, 0.0, 0.0, 0.0]


class FailingServer(ScriptedServer):
    """Per sample by its system prompt: `model-error` raises as a dead model server does, `hang`
    never answers; the rest get the scripted replies (each sample its own copy)."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        super().__init__(tokenizer, replies)
        self.script = list(replies)
        self.per_request: dict[str, list[str]] = {}

    async def generate(self, *, request_id: str, prompt_ids: list[int], **kwargs: Any) -> Any:
        text = self.tokenizer.decode(prompt_ids)
        if "model-error" in text:
            raise ConnectionError("the model server went away (scripted)")
        if "hang" in text:
            await asyncio.sleep(3600)
        replies = self.per_request.setdefault(request_id, list(self.script))
        self.replies = replies
        return await super().generate(request_id=request_id, prompt_ids=prompt_ids, **kwargs)


def batch_worker(replies: list[str], tools: list[Any], corpus: list[str]) -> Any:
    """verl's AgentLoopWorker without its Ray/server set-up: the attributes generate_sequences,
    _run_agent_loop, _agent_loop_postprocess and _postprocess read."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    tok, processor = tiny_tokenizer([*replies, "acting nothing more", *corpus])
    for entry in OmegaConf.load(drums_verl.AGENT_LOOP_CONFIG):
        _agent_loop_registry[entry.name] = entry
    config = trainer_config()
    config.actor_rollout_ref.rollout.update(
        {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": False,
         "agent": {"default_agent_loop": "drums_desktop"}}
    )  # fmt: skip
    worker = object.__new__(AgentLoopWorker)
    worker.config, worker.rollout_config = config, config.actor_rollout_ref.rollout
    worker.tokenizer, worker.processor = tok, processor
    worker.llm_client = FailingServer(tok, replies)
    worker.hf_model_type, worker.dataset_cls, worker.tools = None, RLHFDataset, tools
    worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
    worker.mm_processor_kwargs = {}
    return worker


def _short_episodes_init(self: Any, config: dict[str, Any], tool_schema: Any = None) -> None:
    _original_init(self, {**config, "episode_timeout_s": 3}, tool_schema)


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_one_bad_sample_never_fails_verl_batch(daemon, monkeypatch, caplog):
    """AgentLoopWorker.generate_sequences (verl's batch path) on 4 samples: a solved one, an
    unknown task, a model-server error and a timeout. The batch completes; the three are left out
    (no trained token, drums_valid 0), each logged with its task and reason; no desktop is left."""
    import numpy as np
    from verl.protocol import DataProto

    monkeypatch.setattr(drums_verl, "uses_v1_worker", lambda config: False, raising=False)
    monkeypatch.setattr(drums_verl.DrumsComputerTool, "__init__", _short_episodes_init)
    before = live_envs()
    replies = [reply(action="type", text="42"), reply(action="done")]
    samples = [("solve", "acting"), ("no-such-task", "acting"), ("solve", "acting model-error"),
               ("solve", "acting hang")]  # fmt: skip
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array(
                [[{"role": "system", "content": text}] for _, text in samples], dtype=object
            ),
            "tools_kwargs": np.array(
                [{"computer": {"create_kwargs": {"drums_task": task}}} for task, _ in samples]
            ),
            "agent_name": np.array(["drums_desktop"] * 4, dtype=object),
        }
    )

    async def go() -> Any:
        worker = batch_worker(replies, shipped_tools(), ["model-error", "hang"])
        return await worker.generate_sequences(batch)

    with caplog.at_level("WARNING", logger="drums_verifiers.adapters.verl"):
        out = asyncio.run(go())
    assert len(out) == 4
    assert out.non_tensor_batch["drums_valid"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert out.batch["rm_scores"].sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    trained = out.batch["response_mask"].sum(-1).tolist()
    assert trained[0] > 0 and trained[1:] == [0, 0, 0]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    print(logged)
    assert "task no-such-task: sample left out of training (mask): not_found" in logged
    assert "ConnectionError: the model server went away" in logged
    assert "timeout: the episode took over episode_timeout_s=3" in logged
    assert live_envs() == before


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_screenshots_are_sized_to_the_prompt_and_a_too_small_prompt_fails_first(daemon):
    """Qwen2.5-VL's processor defaults (max_pixels 12845056): prompt_length 600 cannot fit one
    1920x1080 screenshot and fails before any desktop is made; 2048 leaves 1,536 image tokens,
    1344x756 screenshots (1,296 tokens), and a click on them maps back to the desktop. (The fake
    drumsd's screenshots are 192x108, which fit whole: the loop sizes each from its own png.)"""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    qwen = Qwen2VLImageProcessorPil()  # the defaults Qwen2.5-VL ships
    config = trainer_config()
    config.actor_rollout_ref.rollout.prompt_length = 2048
    tools = shipped_tools()
    tok, processor = tiny_tokenizer([reply(action="done"), "acting nothing more"])
    processor.image_processor = qwen
    for entry in OmegaConf.load(drums_verl.AGENT_LOOP_CONFIG):
        _agent_loop_registry[entry.name] = entry

    def build(prompt_length: int) -> Any:
        config.actor_rollout_ref.rollout.prompt_length = prompt_length
        return hydra.utils.instantiate(
            config=_agent_loop_registry["drums_desktop"],
            trainer_config=DictConfigWrap(config=config),
            server_manager=ScriptedServer(tok, [reply(action="done")]),
            tokenizer=tok,
            processor=processor,
            hf_model_type=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(tools),
        )

    with pytest.raises(Exception, match=r"prompt_length 600 leaves 88 tokens .* costs 144"):
        build(600)
    (tool,) = tools
    assert tool.image_budget is None  # nothing was sized by the failed build

    async def go() -> Any:
        loop = build(2048)
        out = await loop.run(
            {},
            raw_prompt=[{"role": "system", "content": "acting"}],
            tools_kwargs={"computer": {"create_kwargs": {"drums_task": "solve"}}},
        )
        return out

    out = asyncio.run(go())
    assert tool.image_budget == 2048 - 512
    fit = screen_fit.fit_scale(1536, tool.limits, (192, 108))
    assert {image.size for image in out.multi_modal_data["images"]} == {(fit.width, fit.height)}
    assert screen_fit.fit_scale(1536, tool.limits).width == 1344
    assert len(out.prompt_ids) <= 2048  # what verl's _agent_loop_postprocess requires
    screen = actions.Screen(1920, 1080, screen_fit.fit_scale(tool.image_budget, tool.limits).scale)
    assert screen.to_screen(672, 378) == (960, 540)  # the middle, mapped back to 1920x1080


# --- verl's default v1 worker, AgentLoopWorkerTQ, with a real TransferQueue ---------------------


class GroupServer(ScriptedServer):
    """Each trajectory (request id) gets the scripted replies; the `fail`-th trajectory to ask
    has its model server die on its second call, mid-trajectory. Records the images per call."""

    def __init__(self, tokenizer: Any, replies: list[str], fail: int) -> None:
        super().__init__(tokenizer, replies)
        self.script, self.fail, self.order = list(replies), fail, []
        self.per_request: dict[str, list[str]] = {}
        self.images: dict[str, list[int]] = {}

    async def generate(self, *, request_id: str, prompt_ids: list[int], **kwargs: Any) -> Any:
        if request_id not in self.per_request:
            self.order.append(request_id)
            self.per_request[request_id] = list(self.script)
        self.images.setdefault(request_id, []).append(len(kwargs.get("image_data") or []))
        if self.order.index(request_id) + 1 == self.fail and len(self.images[request_id]) == 2:
            raise ConnectionError("the model server went away mid-trajectory (scripted)")
        self.replies = self.per_request[request_id]
        return await super().generate(request_id=request_id, prompt_ids=prompt_ids, **kwargs)


V1_GROUP = os.environ.get("DRUMS_VERL_V1_GROUP") == "1"


@pytest.mark.skipif(
    not V1_GROUP,
    reason="slow (a local Ray and TransferQueue, ~90 s): DRUMS_TRAINER_MATRIX=1 runs it, and CI "
    "on the days it samples the verl v1 row (test_vf_verl.py)",
)
def test_v1_worker_group_of_four_with_one_forced_invalid(daemon):
    """AgentLoopWorkerTQ._run_prompt (verl's default v1 worker) on one prompt with rollout.n 4
    and a real TransferQueue (local Ray): one trajectory's model server dies mid-way. The three
    others are in TransferQueue, the failed one is not ("Empty output for prompt"), the prompt's
    status is finished, the model got the screenshots as images in every turn, verl's own v1
    advantage over what TransferQueue holds is a group of 3's, and no desktop is left."""
    import numpy as np
    import ray
    import transfer_queue as tq
    from verl.experimental.agent_loop.agent_loop import get_trajectory_info
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1 import AgentLoopWorkerTQ
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    task = LIVE_TASK or "solve"
    replies = (
        [reply(action="click", x=20, y=20), reply(action="done")]
        if LIVE_TASK
        else [reply(action="type", text="42"), reply(action="done")]
    )
    before = live_envs()
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        worker_class = AgentLoopWorkerTQ.__ray_metadata__.modified_class
        worker = object.__new__(worker_class)
        base = batch_worker(replies, shipped_tools(), [])
        worker.__dict__.update(base.__dict__)
        worker.llm_client = server = GroupServer(base.tokenizer, replies, fail=3)
        worker.config.actor_rollout_ref.rollout.n = 4
        worker.background_tasks = set()
        prompt = {
            "uid": "p0",
            "index": 0,
            "global_steps": 1,
            "agent_name": "drums_desktop",
            "raw_prompt": [{"role": "system", "content": "acting"}],
            "tools_kwargs": {"computer": {"create_kwargs": {"drums_task": task}}},
        }

        async def go() -> None:
            (info,) = await get_trajectory_info(1, [0], False)
            await worker._run_prompt(prompt, {"temperature": 1.0}, trajectory=info)

        asyncio.run(go())
        status = tq.kv_list(partition_id="train")
        keys = sorted(k for k in status["train"] if k.startswith("p0_"))
        fields = ["uid", "response_mask", "rm_scores"]
        held = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
        data = DataProto(batch=held.to_padded_tensor())
        data.batch["token_level_rewards"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
        data = compute_advantage_for_multi_trajectories(
            data, batch_keys=keys, adv_estimator="grpo", num_repeat=4
        )
        failed = server.order[2]
        result = {
            "keys": keys,
            "prompt_status": status["train"]["p0"]["status"],
            "images_per_call": [server.images[r] for r in server.order],
            "rewards": data.batch["rm_scores"].sum(-1).tolist(),
            "advantages": row_advantages(data),
        }
        print("DRUMS_VERL_V1_RESULT", json.dumps(result))
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
            shutil.rmtree(ray_dir, ignore_errors=True)
    assert len(keys) == 3 and result["prompt_status"] == "finished"
    assert server.images[failed] == [1, 2]  # it died on its second call
    for request in server.order:
        calls = server.images[request]
        assert calls == list(range(1, len(calls) + 1))  # every turn: every screenshot so far
    # the three kept score alike (1.0 on the fake's task; the live click-and-done scores 0.0):
    # as a group of 3 their advantages are 0; the failed one's 0.0 would have moved them
    assert len(set(result["rewards"])) == 1 and result["advantages"] == [0.0] * 3
    assert live_envs() == before


class MidwayServer(ScriptedServer):
    """Answers the first call, then on the second raises (`raise`) or never answers (`hang`)."""

    def __init__(self, tokenizer: Any, replies: list[str], mode: str) -> None:
        super().__init__(tokenizer, replies)
        self.mode, self.reached = mode, asyncio.Event()

    async def generate(self, *, request_id: str, prompt_ids: list[int], **kwargs: Any) -> Any:
        if self.calls:
            self.reached.set()
            if self.mode == "raise":
                raise ConnectionError("the model server went away mid-trajectory (scripted)")
            await asyncio.sleep(3600)
        return await super().generate(request_id=request_id, prompt_ids=prompt_ids, **kwargs)


@pytest.mark.skipif(
    not V1_GROUP,
    reason="slow (three more episodes, one waiting out its timeout): DRUMS_TRAINER_MATRIX=1 runs "
    "it, and CI on the days it samples the verl v1 row (test_vf_verl.py)",
)
def test_no_desktop_is_left_by_a_model_error_a_timeout_or_a_cancellation_mid_trajectory(
    daemon, monkeypatch
):
    """The desktop is open and one action done when the model server raises, hangs past
    episode_timeout_s, or the rollout is cancelled (verl cancelling its task): each time the
    sample is left out or the cancellation goes through, and the daemon lists no env after."""
    task = LIVE_TASK or "solve"
    timeout_s = 40 if LIVE_TASK else 5  # opening a real desktop takes a few seconds
    monkeypatch.setattr(
        drums_verl.DrumsComputerTool, "__init__",
        lambda self, config, tool_schema=None: _original_init(
            self, {**config, "episode_timeout_s": timeout_s}, tool_schema),
    )  # fmt: skip
    before = live_envs()
    first = [reply(action="click", x=20, y=20)]

    async def episode(mode: str, cancel: bool = False) -> Any:
        loop, server, _ = make_loop(first, shipped_tools())
        loop.server_manager = server = MidwayServer(server.tokenizer, first, mode)
        run = asyncio.ensure_future(
            loop.run(
                {},
                raw_prompt=[{"role": "system", "content": "acting"}],
                tools_kwargs={"computer": {"create_kwargs": {"drums_task": task}}},
            )
        )
        if not cancel:
            return await run
        await server.reached.wait()  # the desktop is up and acted on
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        return "cancelled"

    outcomes = {}
    for name, mode, cancel in (("model error", "raise", False), ("timeout", "hang", False),
                               ("cancelled", "hang", True)):  # fmt: skip
        outcomes[name] = asyncio.run(episode(mode, cancel))
        outcomes[name + " envs left"] = len(live_envs() - before)
    print("DRUMS_VERL_LEAKS", json.dumps(outcomes, default=str))
    assert outcomes["model error"] == outcomes["timeout"] == []  # dropped (v1 default)
    assert [outcomes[k] for k in outcomes if k.endswith("envs left")] == [0, 0, 0]
    assert live_envs() == before
