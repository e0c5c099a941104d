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
import time
from types import SimpleNamespace
from typing import Any

import hydra
import pytest
from drums_verifiers import actions, screen_fit
from drums_verifiers.adapters import verl as drums_verl
from omegaconf import OmegaConf
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
from verl_tiny_model import tiny_tokenizer
from vf_support import fake_daemon_unless_live, live_envs


def reply(**arguments: Any) -> str:
    call = json.dumps({"name": "computer", "arguments": arguments})
    return f"acting <tool_call> {call} </tool_call> <|im_end|>"


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


LIVE_TASK = os.environ.get("DRUMS_VERL_LIVE_TASK")


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    yield from fake_daemon_unless_live(LIVE_TASK, tmp_path, monkeypatch)


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


V1_GROUP = os.environ.get("DRUMS_VERL_V1_GROUP") == "1"


def v1_config(model_dir: str, tool_config: str) -> Any:
    """verl's own trainer config (ppo_trainer.yaml, its defaults: the v1 trainer in sync mode)
    with the drums agent loop and tool, rollout.n 4 and one agent loop worker."""
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.model.external_lib=verl_tiny_model",
                "actor_rollout_ref.rollout.name=vllm",  # mandatory; only the client reads it here
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.rollout.prompt_length=4096",
                "actor_rollout_ref.rollout.response_length=4096",
                "actor_rollout_ref.rollout.agent.num_workers=1",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={drums_verl.AGENT_LOOP_CONFIG}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=drums_desktop",
                f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
                "actor_rollout_ref.rollout.multi_turn.format=hermes",
                "algorithm.adv_estimator=grpo",
                "data.train_batch_size=1",
                "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
            ],
        )
    assert config.trainer.use_v1 and config.trainer.v1.trainer_mode == "sync"  # verl's defaults
    return config


class V1TrainerParts:
    """The methods of verl's v1 PPOTrainer that submit prompts, build the ReplayBuffer and compute
    the advantage, run as verl wrote them; the rest of the trainer (actor, critic, weight sync)
    needs a real model and is not made."""

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    _build_replay_buffer = PPOTrainer._build_replay_buffer
    _resolve_filter_groups_metric = PPOTrainer._resolve_filter_groups_metric
    _submit_batch_to_rollout = PPOTrainer._submit_batch_to_rollout
    _compute_advantage = PPOTrainer._compute_advantage
    del PPOTrainer

    def __init__(self, config: Any, agent_loop_manager: Any) -> None:
        self.config, self.agent_loop_manager, self.global_steps = config, agent_loop_manager, 1
        self.trainer_mode = config.trainer.v1.trainer_mode
        self.replay_buffer = self._build_replay_buffer()

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        raise AssertionError(f"the replay buffer asked for {num_prompts} more prompts")


@pytest.mark.skipif(
    not V1_GROUP,
    reason="slow (a local Ray, verl's worker actor and TransferQueue, ~2 min): "
    "DRUMS_TRAINER_MATRIX=1 runs it, and CI on the days it samples the verl v1 row "
    "(test_vf_verl.py)",
)
def test_v1_worker_group_of_four_with_one_forced_invalid(daemon, tmp_path, record_property):
    """verl's default v1 path as its trainer wires it, on a local Ray: TransferQueue initialised
    from the trainer config (as TaskRunnerV1 does), AgentLoopManagerTQ.create making verl's
    AgentLoopWorkerTQ as a Ray actor (its own __init__: tokenizer, processor, tools and agent loop
    from the config), verl's LLMServerClient and load balancer in front of a scripted model server
    actor, the ReplayBuffer from PPOTrainer._build_replay_buffer. One prompt, rollout.n 4, each
    solving its task (live: e0df059f in the desktop's xterm), one trajectory's model server dying
    mid-way. The three others reach the ReplayBuffer's sample, the failed one does not ("Empty
    output for prompt"), the model got the screenshots as images in every turn,
    PPOTrainer._compute_advantage gives a group of 3's, and no desktop is left."""
    import numpy as np
    import ray
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.utils import tensordict_utils as tu
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle
    from verl_tiny_model import ScriptedModelServer, write_model_dir

    task = LIVE_TASK or "solve"
    tools = OmegaConf.load(os.path.join(os.path.dirname(drums_verl.__file__), "verl_tools.yaml"))
    if LIVE_TASK:  # a real daemon's first desktop on a task also runs its setup
        tools.tools[0].config.wait_valid_timeout_s = 600
    OmegaConf.save(tools, tmp_path / "tools.yaml")
    model_dir = str(tmp_path / "model")
    config = v1_config(model_dir, str(tmp_path / "tools.yaml"))
    if LIVE_TASK:  # e0df059f solved in the desktop's xterm, clicked where the screenshot shows it
        _, processor = tiny_tokenizer([])
        rollout = config.actor_rollout_ref.rollout
        limits, budget = drums_verl.fit_prompt(processor, rollout, tools.tools[0].config)
        scale = screen_fit.fit_scale(budget, limits).scale
        replies = [
            reply(action="click", x=round(300 * scale), y=round(200 * scale)),
            reply(action="type", text="mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"),
            reply(action="key", key="enter"),
            reply(action="done"),
        ]
    else:
        replies = [reply(action="type", text="42"), reply(action="done")]
    write_model_dir(tmp_path / "model", [*replies, "acting nothing more"])
    before = live_envs()
    started = time.monotonic()
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    # The actors inherit this process's environment (DRUMS_URL / DRUMS_TOKEN_FILE, PYTHONPATH).
    # TransferQueue's controller and each storage unit hold 1 CPU of Ray's and verl's worker
    # needs 1 to be placed: with Ray's count of this 2-core host (num_cpus=2) the worker is never
    # placed and the rollout waits forever. So one storage unit (verl's default is 8) and 4
    # logical CPUs; the model server actor asks for none.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir)
    try:
        tq.init(config.transfer_queue)
        server = ray.remote(num_cpus=0)(ScriptedModelServer).remote(model_dir, replies, 3)
        balancer = get_router_handle(servers={"scripted:0": server})
        manager = AgentLoopManagerTQ.create(
            config=config,
            llm_client=LLMServerClient(config=config, load_balancer_handle=balancer),
            teacher_client=None,
            reward_loop_worker_handles=None,
        )
        (worker,) = manager.agent_loop_workers
        assert "AgentLoopWorkerTQ" in repr(worker)  # an actor handle of verl's class
        trainer = V1TrainerParts(config, manager)
        batch = tu.get_tensordict(
            {
                "uid": np.array(["p0"], dtype=object),
                "index": np.array([0], dtype=object),
                "agent_name": np.array(["drums_desktop"], dtype=object),
                "raw_prompt": np.array([[{"role": "system", "content": "acting"}]], dtype=object),
                "tools_kwargs": np.array(
                    [{"computer": {"create_kwargs": {"drums_task": task}}}], dtype=object
                ),
            }
        )
        tu.assign_non_tensor_data(batch, "global_steps", 1)
        trainer._submit_batch_to_rollout(batch)
        sampled, _ = trainer.replay_buffer.sample(
            global_steps=1, partition_id="train", batch_size=1
        )
        keys = sorted(sampled.keys)
        metrics: dict[str, Any] = {}
        trainer._compute_advantage(sampled, metrics)
        fields = ["rm_scores", "advantages", "response_mask", "multi_modal_inputs"]
        held = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
        rewards = [float(row.sum()) for row in held["rm_scores"].unbind()]
        advantages = []
        for adv, mask in zip(
            held["advantages"].unbind(), held["response_mask"].unbind(), strict=True
        ):
            trained = mask.nonzero()
            advantages.append(round(float(adv[trained[0]]), 4) if len(trained) else 0.0)
        calls = ray.get(server.calls.remote())
        # the prompt's group status when the buffer sampled it ("failure" if a session raised)
        groups = {"finished": trainer.replay_buffer.finished_keys["train"],
                  "failure": trainer.replay_buffer.failure_keys["train"]}  # fmt: skip
        status = [name for name, uids in groups.items() if "p0" in uids]
        result = {
            "keys": keys,
            "prompt_status": status,
            "statuses": sorted({tag.get("status") for tag in sampled.tags}),
            "images_per_call": sorted(calls),
            "rewards": rewards,
            "advantages": advantages,
            "seconds": round(time.monotonic() - started, 1),
        }
        print("DRUMS_VERL_V1_RESULT", json.dumps(result))
        record_property("result", result)
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
            shutil.rmtree(ray_dir, ignore_errors=True)
    assert len(keys) == 3 and all(key.startswith("p0_") for key in keys)
    assert result["prompt_status"] == ["finished"] and result["statuses"] == ["success"]
    # turn k's call carries k screenshots: 4 first turns, 4 second turns (one of them raised),
    # then the 3 others' later turns
    later = [k for k in range(3, len(replies) + 1) for _ in range(3)]
    assert result["images_per_call"] == [1, 1, 1, 1, 2, 2, 2, 2, *later]
    # the three kept solved the task (the fake's and the real one): as a group of 3 their
    # advantages are 0; the failed one's 0.0 in their group would have given them +0.5
    assert rewards == [1.0] * 3 and advantages == [0.0] * 3
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
