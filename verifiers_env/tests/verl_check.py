"""The verl adapter against verl 0.9.1's own classes (run in the verl venv by test_vf_verl.py).

No GPU, no hub: a WordLevel tokenizer and a Qwen2-VL processor are built here, and a scripted
stand-in answers for verl's LLM server manager. The desktop is the fake drumsd, or a real daemon
when DRUMS_VERL_LIVE_TASK names a task (DRUMS_URL / DRUMS_TOKEN_FILE then say where it is).
"""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace
from typing import Any

import hydra
import pytest
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
    """verl's own loader on the shipped tool YAML (daemon from DRUMS_URL / DRUMS_TOKEN_FILE)."""
    path = os.path.join(os.path.dirname(drums_verl.__file__), "verl_tools.yaml")
    return initialize_tools_from_config(path)


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
    assert out.extra_fields["reward_extra_info"]["drums_valid"] == 0.0
    assert out.reward_score == 0.0 and set(out.response_mask) == {0}  # nothing of it is trained
    assert live_envs() == before
    monkeypatch.setattr(drums_verl.DrumsComputerTool, "__init__", _dropping_init)
    out, _, _ = run_loop("crash", replies)
    assert out == []  # verl's v1 worker skips an empty output ("Empty output for prompt")
    assert live_envs() == before


_original_init = drums_verl.DrumsComputerTool.__init__


def _dropping_init(self: Any, config: dict[str, Any], tool_schema: Any = None) -> None:
    _original_init(self, {**config, "invalid_episode": "drop"}, tool_schema)


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
def test_worker_postprocess_batches_a_valid_and_a_masked_episode(daemon):
    """verl's AgentLoopWorker._agent_loop_postprocess and _postprocess on both outputs."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

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
