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
import shutil
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import drums_verifiers.adapters.skyrl as drums_skyrl
import pytest
import skyrl_gym
from omegaconf import OmegaConf
from skyrl_train.generators.skyrl_gym_generator import SkyRLGymGenerator
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from vf_support import fake_daemon_unless_live, live_envs

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


def generator(
    replies: list[str], max_turns: int = 6, klass: Any = None, multimodal: bool = True
) -> tuple[SkyRLGymGenerator, ScriptedEngine]:
    tok = tiny_tokenizer([*replies, "acting nothing break"])
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
    # a real daemon's first desktop on a task also runs its setup: its gates take longer loaded
    wait = 600 if LIVE_TASK else 120
    drums = {"multimodal": multimodal, "wait_valid_timeout_s": wait}
    gym_cfg = OmegaConf.create({"max_env_workers": 0, "drums": drums})
    return (klass or SkyRLGymGenerator)(cfg, gym_cfg, engine, tok, "tiny"), engine


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    yield from fake_daemon_unless_live(LIVE_TASK, tmp_path, monkeypatch)


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


# --- the drums generator: masked invalid trajectories, one bad sample, no leaks (issue 30) -------

DrumsGenerator = drums_skyrl.drums_generator(SkyRLGymGenerator)


class FailingEngine(ScriptedEngine):
    """Raises on its `fail_on`-th call, as an inference engine that dies mid-trajectory."""

    def __init__(self, tokenizer: Any, replies: list[str], fail_on: int) -> None:
        super().__init__(tokenizer, replies)
        self.fail_on = fail_on

    async def generate(self, engine_input: dict[str, Any]) -> dict[str, Any]:
        if self.calls + 1 == self.fail_on:
            self.calls += 1
            raise RuntimeError("inference engine died (scripted)")
        return await super().generate(engine_input)


def drums_run(task: str, replies: list[str], fail_on: int = 0, generator_class: Any = None) -> Any:
    """One trajectory through the drums generator (text: skyrl-train's has no vision)."""
    gen, _ = generator(replies, klass=generator_class or DrumsGenerator, multimodal=False)
    engine = FailingEngine(gen.tokenizer, replies, fail_on)
    gen.inference_engine_client = engine
    prompt = [{"role": "system", "content": "acting"}]
    return asyncio.run(gen.agent_loop(prompt, "drums", {"drums_task": task}, 256, 100000)), engine


SOLVE = [reply(action="click", x=10, y=10), reply(action="type", text="42"), reply(action="done")]
# The real task (e0df059f: rename ~/Desktop/todo_list_Jan_1 to todo_list_Jan_2), solved in the
# desktop's xterm (at +40+40 on the 1920x1080 screen, text only: no screenshot scale).
LIVE_SOLVE = [
    reply(action="click", x=300, y=200),
    reply(action="type", text="mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"),
    reply(action="key", key="enter"),
    reply(action="done"),
]


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_drums_generator_trains_no_token_of_an_invalid_trajectory(daemon):
    before = live_envs()
    out, _ = drums_run("solve", SOLVE)
    assert out.env_metrics["drums_valid"] == 1.0 and 1 in out.loss_mask
    out, _ = drums_run("crash", SOLVE)
    assert out.env_metrics["drums_valid"] == 0.0 and set(out.loss_mask) == {0}
    assert live_envs() == before


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_an_engine_error_mid_trajectory_leaves_no_desktop(daemon, caplog):
    """skyrl-train's own generator leaves the desktop up when its engine raises mid-trajectory
    (it closes an env only after a trajectory that did not raise); the drums generator closes it,
    and the sample comes back left out instead of failing the batch."""
    before = live_envs()
    with pytest.raises(RuntimeError, match="inference engine died"):
        drums_run("solve", SOLVE, fail_on=2, generator_class=SkyRLGymGenerator)
    leaked = live_envs() - before
    print("DRUMS_SKYRL_LEAK skyrl-train's generator left", len(leaked), "desktop(s)")
    assert len(leaked) == 1  # what the drums generator fixes
    import drums

    with drums.connect() as client:
        for env_id in leaked:
            client.attach(env_id).close()
    with caplog.at_level("WARNING", logger="drums_verifiers.adapters.skyrl"):
        out, engine = drums_run("solve", SOLVE, fail_on=2)
        unknown, _ = drums_run("no-such-task", SOLVE)
    assert engine.calls == 2 and set(out.loss_mask) == {0} and out.reward == 0.0
    assert out.stop_reason == unknown.stop_reason == "drums_left_out"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "task solve: sample left out of training: RuntimeError: inference engine died" in logged
    assert "task no-such-task: sample left out of training: not_found" in logged
    assert live_envs() == before


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_one_bad_sample_never_fails_the_skyrl_batch(daemon):
    """skyrl-train's generate (its gather over agent_loop) on a solved sample, an unknown task and
    an engine error: the batch completes, the two bad ones with no trained token."""
    from skyrl_train.generators.base import GeneratorInput

    before = live_envs()
    gen, _ = generator(SOLVE, klass=DrumsGenerator, multimodal=False)
    engine = FailingEngine(gen.tokenizer, SOLVE * 3, fail_on=0)

    async def generate(engine_input: dict[str, Any]) -> dict[str, Any]:
        if any(engine.tokenizer.convert_tokens_to_ids("break") in ids
               for ids in engine_input.get("prompt_token_ids") or []):  # fmt: skip
            raise RuntimeError("inference engine died (scripted)")
        return await ScriptedEngine.generate(engine, engine_input)

    engine.generate = generate  # type: ignore[method-assign]
    gen.inference_engine_client = engine
    prompts = [[{"role": "system", "content": text}] for text in ("acting", "acting", "break")]
    batch = GeneratorInput(
        prompts=prompts,
        env_classes=["drums"] * 3,
        env_extras=[{"drums_task": t} for t in ("solve", "no-such-task", "solve")],
        sampling_params=None,
    )
    out = asyncio.run(gen.generate(batch))
    trained = [sum(mask) for mask in out["loss_masks"]]
    assert trained[0] > 0 and trained[1:] == [0, 0], trained
    assert live_envs() == before


def per_token(out: Any) -> list[float]:
    """The trajectory's rewards per response token (skyrl puts a float on the last token)."""
    if isinstance(out.reward, list):
        return [float(r) for r in out.reward]
    return [0.0] * (len(out.response_ids) - 1) + [float(out.reward)]


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
def test_an_invalid_sample_is_out_of_its_grpo_group_under_skyrl(daemon):
    """3 solved + 1 invalid through the drums generator, advantages by skyrl-train's own
    compute_advantages_and_returns (GRPO, the call RayPPOTrainer makes with the batch's uids; its
    batching module needs `datasets`, not installed here, so the rows are padded here): with the
    uids drums_trainer passes, the solved get a group of 3's (0), not the +0.5 skyrl gives them
    with the invalid 0.0 in their group."""
    import numpy as np
    import torch
    from skyrl_train.utils.ppo_utils import (
        AdvantageEstimatorRegistry,
        compute_advantages_and_returns,
    )

    AdvantageEstimatorRegistry.repopulate_registry()
    before = live_envs()
    outs = [drums_run(task, SOLVE)[0] for task in ("solve", "solve", "crash", "solve")]
    assert [o.env_metrics["drums_valid"] for o in outs] == [1.0, 1.0, 0.0, 1.0]
    width = max(len(o.response_ids) for o in outs)
    rewards, response_mask, loss_mask = (torch.zeros(4, width) for _ in range(3))
    for i, o in enumerate(outs):
        n = len(o.response_ids)
        rewards[i, :n], response_mask[i, :n] = torch.tensor(per_token(o)), 1
        loss_mask[i, :n] = torch.tensor(o.loss_mask, dtype=torch.float)
    trained = (loss_mask.sum(dim=-1) > 0).tolist()
    assert trained == [True, True, False, True]

    def advantages(uids: list[str]) -> list[float]:
        adv, _ = compute_advantages_and_returns(
            token_level_rewards=rewards, response_mask=response_mask, index=np.array(uids),
            adv_estimator="grpo", config=OmegaConf.create({}), grpo_norm_by_std=True,
        )  # fmt: skip
        rows = zip(adv, response_mask, strict=True)
        return [round(float(row[mask.nonzero()[0]]), 4) for row, mask in rows]

    biased = advantages(["p0"] * 4)
    fair = advantages(drums_skyrl.left_out_groups(["p0"] * 4, trained))
    print("DRUMS_SKYRL_GRPO skyrl", biased, "drums_trainer", fair)
    assert biased == [0.5, 0.5, -1.5, 0.5]  # the invalid 0.0 in the group's mean and std
    assert fair == [0.0, 0.0, 0.0, 0.0]  # a group of 3 solved, and the left-out row alone
    assert torch.equal(loss_mask[2], torch.zeros_like(loss_mask[2]))
    assert live_envs() == before


class TurnFailingEngine(ScriptedEngine):
    """Every trajectory gets the scripted replies by its turn (the tool calls in its prompt);
    the `fail`-th trajectory to reach its second turn has its engine raise there."""

    def __init__(self, tokenizer: Any, replies: list[str], fail: int) -> None:
        super().__init__(tokenizer, replies)
        self.script, self.fail, self.second_turns = list(replies), fail, 0

    async def generate(self, engine_input: dict[str, Any]) -> dict[str, Any]:
        (prompt,) = engine_input["prompt_token_ids"]
        turn = self.tokenizer.decode(prompt).count("<tool_call>")
        if turn == 1:
            self.second_turns += 1
            if self.second_turns == self.fail:
                self.calls += 1
                raise RuntimeError("inference engine died (scripted)")
        self.replies = self.script[turn : turn + 1]
        return await super().generate(engine_input)


@pytest.mark.skipif(not LIVE_TASK, reason="set by the live test with a real daemon")
def test_generator_on_a_real_desktop(record_property):
    """skyrl-train's generate (its gather over agent_loop) through the drums generator, text only
    (its SkyRLGymGenerator sends token ids), on a real task: a batch of 2, one sample solving it
    in the desktop's xterm, the other losing its inference engine on its second turn. The batch
    completes, the failed one with no trained token, and no desktop is left."""
    from skyrl_train.generators.base import GeneratorInput

    before = live_envs()
    gen, _ = generator(LIVE_SOLVE, klass=DrumsGenerator, multimodal=False)
    engine = TurnFailingEngine(gen.tokenizer, LIVE_SOLVE, fail=2)
    gen.inference_engine_client = engine
    batch = GeneratorInput(
        prompts=[[{"role": "system", "content": "acting"}]] * 2,
        env_classes=["drums"] * 2,
        env_extras=[{"drums_task": LIVE_TASK}] * 2,
        sampling_params=None,
    )
    started = time.monotonic()
    out = asyncio.run(gen.generate(batch))
    rewards = [sum(r) if isinstance(r, list) else r for r in out["rewards"]]
    result = {
        "trained_tokens": [sum(mask) for mask in out["loss_masks"]],
        "rewards": rewards,
        "stop_reasons": out["stop_reasons"],
        "engine_calls": engine.calls,
        "seconds": round(time.monotonic() - started, 1),
    }
    print("DRUMS_SKYRL_RESULT", json.dumps(result))
    record_property("result", result)
    assert sorted(rewards) == [0.0, 1.0], result
    # which sample reaches its second turn second (and fails there) is the gather's order
    solved = rewards.index(1.0)
    assert result["trained_tokens"][solved] > 0 and result["trained_tokens"][1 - solved] == 0
    assert out["stop_reasons"][1 - solved] == "drums_left_out" and rewards[1 - solved] == 0.0
    assert live_envs() == before


def skyrl_train_config(tmp_path: Any, data: str) -> Any:
    """skyrl-train's own ppo_base_config.yaml (GRPO by default), sized for one prompt of 4
    samples on the CPU: no colocation, no eval, no checkpoints, the console logger."""
    from hydra import compose, initialize_config_dir
    from skyrl_train import config as skyrl_config

    with initialize_config_dir(os.path.dirname(skyrl_config.__file__), version_base=None):
        cfg = compose(
            config_name="ppo_base_config",
            overrides=[
                f"data.train_data=[{data}]",
                "data.val_data=[]",
                "trainer.placement.colocate_all=false",
                "trainer.train_batch_size=1",
                "trainer.policy_mini_batch_size=1",
                "trainer.critic_mini_batch_size=1",
                "trainer.eval_interval=-1",
                "trainer.eval_before_train=false",
                "trainer.ckpt_interval=-1",
                "trainer.resume_mode=none",
                "trainer.logger=console",
                f"trainer.ckpt_path={tmp_path}/ckpt",
                f"trainer.export_path={tmp_path}/export",
                "trainer.max_prompt_length=4096",
                "generator.n_samples_per_prompt=4",
                "generator.max_turns=6",
                "generator.max_input_length=100000",
                "generator.sampling_params.max_generate_length=256",
                "generator.enable_http_endpoint=true",  # its dataloader without 8 worker processes
                "environment.env_class=drums",
                "environment.skyrl_gym.max_env_workers=0",
                "+environment.skyrl_gym.drums.multimodal=false",
                "+environment.skyrl_gym.drums.wait_valid_timeout_s=120",
            ],
        )
    assert cfg.trainer.algorithm.advantage_estimator == "grpo"  # skyrl-train's default
    return cfg


@pytest.mark.skipif(bool(LIVE_TASK), reason="the fake drumsd's scripted tasks")
@pytest.mark.skipif(
    os.environ.get("DRUMS_SKYRL_TRAINER") != "1",
    reason="slow (a local Ray and skyrl-train's trainer imports, ~1 min): DRUMS_TRAINER_MATRIX=1 "
    "runs it, and CI on the days it samples the skyrl-trainer row (test_vf_skyrl.py)",
)
def test_drums_trainer_inside_skyrl_train_ray_ppo_trainer(daemon, tmp_path, record_property):
    """drums_trainer(RayPPOTrainer) and the drums generator in skyrl-train's own training loop
    (RayPPOTrainer.train: its dataloader over a PromptDataset, prepare_generator_input, generate,
    postprocess_generator_output, convert_to_training_input, compute_advantages_and_returns)
    with skyrl-train's default config, for one step: one prompt, 4 samples, one of them losing its
    inference engine mid-trajectory. Only what needs a model is a tiny fake policy (weight sync,
    the log-prob forward pass, the update step, which records the batch it is given). The failed
    sample reaches the update with loss mask 0 and is out of the GRPO group: the 3 solved get a
    group of 3's advantages (0), not skyrl's +0.5 from the failed one's 0.0."""
    import ray
    import torch
    from skyrl_train.dataset import PromptDataset
    from skyrl_train.trainer import RayPPOTrainer
    from skyrl_train.utils.tracking import Tracking

    before = live_envs()
    data = tmp_path / "train.jsonl"
    row = {"prompt": [{"role": "system", "content": "acting"}], "env_class": "drums",
           "drums_task": "solve"}  # fmt: skip
    data.write_text(json.dumps(row) + "\n")
    cfg = skyrl_train_config(tmp_path, str(data))
    tok = tiny_tokenizer([*SOLVE, "acting nothing break"])
    engine = TurnFailingEngine(tok, SOLVE, fail=3)
    generator = DrumsGenerator(cfg.generator, cfg.environment.skyrl_gym, engine, tok, "tiny")
    dataset = PromptDataset([str(data)], tok, cfg.trainer.max_prompt_length, num_workers=1)
    updates: list[Any] = []

    class TinyPolicyTrainer(drums_skyrl.drums_trainer(RayPPOTrainer)):  # type: ignore[misc]
        """What needs model weights, faked; the rest is RayPPOTrainer's own. The policy is one
        data-parallel rank (build_models would make its Ray actor group); no critic, no ref."""

        def init_weight_sync_state(self) -> None:
            rank = SimpleNamespace(dp_size=1)
            self.policy_model = SimpleNamespace(actor_infos=[SimpleNamespace(rank=rank)])

        def sync_policy_weights_to_inference_engines(self) -> list[Any]:
            return []

        def fwd_logprobs_values_reward(self, training_input: Any) -> Any:
            zeros = torch.zeros_like(training_input["loss_mask"], dtype=torch.float)
            training_input["base_action_log_probs"] = None
            training_input["action_log_probs"] = zeros
            training_input["values"] = None
            return training_input

        def train_critic_and_policy(self, data: Any) -> dict[str, Any]:
            updates.append(data)
            return {}

    tracker = Tracking("drums", "skyrl-check", backends="console", config=cfg)
    trainer = TinyPolicyTrainer(
        cfg=cfg, tracker=tracker, tokenizer=tok, train_dataset=dataset,
        inference_engine_client=engine, generator=generator,
    )  # fmt: skip
    started = time.monotonic()
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir)
    try:
        trainer.train()  # its weight sync waits on Ray (ray.get), which needs a cluster
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
    (batch,) = updates
    trained = (batch["loss_mask"].sum(dim=-1) > 0).tolist()
    advantages = [
        round(float(row[mask.nonzero()[0]]), 4) if mask.any() else 0.0
        for row, mask in zip(batch["advantages"], batch["response_mask"], strict=True)
    ]
    result = {"trained": trained, "advantages": advantages, "engine_calls": engine.calls,
              "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    print("DRUMS_SKYRL_TRAINER_RESULT", json.dumps(result))
    record_property("result", result)
    assert trained.count(False) == 1 and len(trained) == 4
    assert advantages == [0.0] * 4  # the solved as a group of 3, the failed one alone
    assert live_envs() == before


def test_skyrl_train_text_generator_with_screenshots_is_refused():
    """skyrl-train 0.3.1's SkyRLGymGenerator sends token ids only: with multimodal on, the drums
    generator says so when it is made instead of training a model that never sees the screen."""
    with pytest.raises(ValueError, match=r"token ids only .* SkyRLVLMGymGenerator"):
        generator(SOLVE, klass=DrumsGenerator, multimodal=True)
