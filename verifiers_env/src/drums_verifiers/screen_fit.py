"""How big a screenshot a vision model can take: the scale that fits its image processor's limits
and the trainer's token budget. Pure: numbers in, numbers out (no Pillow, no processor import).

A Qwen2-VL-style processor cuts an image into `patch_size` patches and merges `merge_size`^2 of
them into one token, after resizing it to multiples of `patch_size * merge_size` within
[min_pixels, max_pixels]. A 1920x1080 desktop at the Qwen2.5-VL defaults is 1932x1092: 2,691
tokens, more than a 2,048-token prompt. `fit_scale` picks the largest scale at which both sides
of the screenshot are already multiples of that factor (so the processor does not resize it again
and one scale maps the model's coordinates back to the desktop exactly, see `drums.actions.Screen`)
and the image costs at most the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DESKTOP = (1920, 1080)


class ScreenDoesNotFit(ValueError):
    """Not even the smallest screenshot fits the token budget; the message says what to raise."""


@dataclass(frozen=True)
class ImageLimits:
    """An image processor's sizing rules (defaults: Qwen2-VL / Qwen2.5-VL's processor)."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 16384

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def of(cls, processor: Any) -> ImageLimits:
        """Read the limits from a transformers processor or image processor (missing: defaults)."""
        images = getattr(processor, "image_processor", processor)
        size = getattr(images, "size", None) or {}
        size = dict(size) if isinstance(size, dict) else {}
        default = cls()
        return cls(
            patch_size=int(getattr(images, "patch_size", None) or default.patch_size),
            merge_size=int(getattr(images, "merge_size", None) or default.merge_size),
            min_pixels=int(
                getattr(images, "min_pixels", None)
                or size.get("shortest_edge")
                or default.min_pixels
            ),
            max_pixels=int(
                getattr(images, "max_pixels", None)
                or size.get("longest_edge")
                or default.max_pixels
            ),
        )

    @classmethod
    def from_config(cls, config: Any) -> ImageLimits:
        """From a mapping with any of the four fields (a trainer's YAML block)."""
        values = {k: int(config[k]) for k in cls.__dataclass_fields__ if config.get(k) is not None}
        return cls(**values)


def resized(width: int, height: int, limits: ImageLimits) -> tuple[int, int]:
    """The size the processor turns a width x height image into (Qwen2-VL's smart_resize)."""
    f = limits.factor
    h = max(f, round(height / f) * f)
    w = max(f, round(width / f) * f)
    if h * w > limits.max_pixels:
        beta = math.sqrt((height * width) / limits.max_pixels)
        h = max(f, math.floor(height / beta / f) * f)
        w = max(f, math.floor(width / beta / f) * f)
    elif h * w < limits.min_pixels:
        beta = math.sqrt(limits.min_pixels / (height * width))
        h = math.ceil(height * beta / f) * f
        w = math.ceil(width * beta / f) * f
    return w, h


def image_tokens(width: int, height: int, limits: ImageLimits) -> int:
    """Tokens one width x height image costs the model."""
    w, h = resized(width, height, limits)
    return (w // limits.factor) * (h // limits.factor)


@dataclass(frozen=True)
class Fit:
    """The chosen scale, the screenshot size the model sees, and what one costs."""

    scale: float
    width: int
    height: int
    tokens: int


def fit_scale(
    budget_tokens: int,
    limits: ImageLimits = ImageLimits(),
    screen: tuple[int, int] = DESKTOP,
    max_scale: float = 1.0,
) -> Fit:
    """The largest scale <= max_scale whose screenshot costs at most `budget_tokens`.

    Below full size the scale is a multiple of factor / gcd(width, height), so both sides are
    multiples of the processor's factor (448x252, 896x504, 1344x756, 1792x1008 for 1920x1080 at
    factor 28): the processor keeps the image as sent and the coordinate mapping is exact.
    """
    width, height = screen
    full = image_tokens(width, height, limits)
    if max_scale >= 1.0 and full <= budget_tokens:
        return Fit(1.0, width, height, full)
    step = limits.factor / math.gcd(width, height)
    best: Fit | None = None
    j = 1
    while j * step <= min(max_scale, 1.0) + 1e-9:
        scale = j * step
        w, h = round(width * scale), round(height * scale)
        tokens = image_tokens(w, h, limits)
        if tokens <= budget_tokens and limits.min_pixels <= w * h <= limits.max_pixels:
            best = Fit(scale, w, h, tokens)
        j += 1
    if best is None:
        smallest = image_tokens(round(width * step), round(height * step), limits)
        raise ScreenDoesNotFit(
            f"a {width}x{height} screenshot does not fit {budget_tokens} image tokens: the "
            f"smallest one the model's processor takes costs {smallest} "
            f"(patch {limits.patch_size}, merge {limits.merge_size}, min_pixels "
            f"{limits.min_pixels}); raise the prompt length or lower min_pixels"
        )
    return best
