"""A tiny vision-language "model" directory for verl's own loaders (run in the verl venv).

verl's workers load the tokenizer, processor and model config from `actor_rollout_ref.model.path`
(HFModelConfig); the real-worker test writes this directory and names this module as the model's
`external_lib`, which verl imports before loading, in the driver and in every Ray actor. No
weights: only the model server is scripted. Qwen2-VL's processor without its video half (that
needs torchvision, not installed), registered for the model type `drums_tiny_vl`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoProcessor, AutoTokenizer, PreTrainedTokenizerFast
from transformers.models.qwen2_vl import (
    Qwen2VLConfig,
    Qwen2VLImageProcessorPil,
)
from transformers.models.qwen2_vl import (
    Qwen2VLProcessor as _Qwen2VLProcessor,
)

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
SPECIAL += ["<|video_pad|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m.role }} "
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'text' %}{{ c.text }} {% elif c.type in ['image', 'image_url'] %}"
    "<|vision_start|> <|image_pad|> <|vision_end|> {% endif %}{% endfor %}{% endif %}"
    " <|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


class TinyVLConfig(Qwen2VLConfig):
    model_type = "drums_tiny_vl"


class TinyProcessor(_Qwen2VLProcessor):
    """Qwen2-VL's processor without its video half."""

    def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)

    @classmethod
    def from_pretrained(cls, path: Any, **kwargs: Any) -> TinyProcessor:  # type: ignore[override]
        tok = AutoTokenizer.from_pretrained(path)
        images = Qwen2VLImageProcessorPil.from_pretrained(path)
        return cls(image_processor=images, tokenizer=tok, chat_template=tok.chat_template)


# verl's hf_processor binds Qwen2-VL's rope index to a processor by its class name
TinyProcessor.__name__ = TinyProcessor.__qualname__ = "Qwen2VLProcessor"
AutoConfig.register(TinyVLConfig.model_type, TinyVLConfig, exist_ok=True)
AutoProcessor.register(TinyVLConfig, TinyProcessor, exist_ok=True)


def tiny_tokenizer(corpus: list[str]) -> tuple[PreTrainedTokenizerFast, TinyProcessor]:
    """A WordLevel tokenizer over `corpus` and the processor around it (small images)."""
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


def write_model_dir(path: Path, corpus: list[str]) -> Path:
    """The directory verl's HFModelConfig loads: tokenizer, image processor, a config.json."""
    tok, processor = tiny_tokenizer(corpus)
    processor.image_processor.save_pretrained(path)
    tok.save_pretrained(path)
    config = TinyVLConfig(
        architectures=["TinyVL"],
        vocab_size=len(tok),
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    config.save_pretrained(path)
    return path


class ScriptedModelServer:
    """The model server behind verl's LLMServerClient, as a Ray actor (`ray.remote(...)`): the
    k-th turn of a trajectory carries k screenshots, so the turn is read from the images, and
    the reply for it is scripted. The `fail`-th trajectory to reach its second turn has its
    server die there (mid-trajectory). Records the images of every call."""

    def __init__(self, model_dir: str, replies: list[str], fail: int) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.replies, self.fail, self.images = list(replies), fail, []

    async def generate(self, *, request_id: str, prompt_ids: list[int], **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        images = len(kwargs.get("image_data") or [])
        self.images.append(images)
        if images == 2 and self.images.count(2) == self.fail:
            raise ConnectionError("the model server went away mid-trajectory (scripted)")
        turn = images - 1
        text = self.replies[turn] if 0 <= turn < len(self.replies) else "nothing more <|im_end|>"
        return TokenOutput(token_ids=self.tokenizer.encode(text, add_special_tokens=False))

    def calls(self) -> list[int]:
        return list(self.images)
