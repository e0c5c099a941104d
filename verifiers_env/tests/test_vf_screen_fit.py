"""screen_fit: the screenshot scale that fits a vision model's processor and token budget (pure)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from drums_verifiers import actions, screen_fit

QWEN = screen_fit.ImageLimits()  # Qwen2-VL / Qwen2.5-VL's processor defaults


def test_a_full_hd_screenshot_costs_2691_tokens_at_qwen_defaults():
    assert screen_fit.resized(1920, 1080, QWEN) == (1932, 1092)
    assert screen_fit.image_tokens(1920, 1080, QWEN) == 2691


def test_the_scale_is_the_largest_exact_one_under_the_budget():
    assert screen_fit.fit_scale(3000) == screen_fit.Fit(1.0, 1920, 1080, 2691)
    fit = screen_fit.fit_scale(2048 - 512)
    assert (fit.width, fit.height, fit.tokens) == (1344, 756, 1296)
    assert screen_fit.resized(fit.width, fit.height, QWEN) == (1344, 756)  # not resized again
    assert screen_fit.fit_scale(1295).width == 896
    assert screen_fit.fit_scale(144).width == 448


@pytest.mark.parametrize("budget", [144, 576, 1296, 2304, 2690])
def test_coordinates_on_the_scaled_screenshot_map_back_to_the_desktop(budget):
    fit = screen_fit.fit_scale(budget)
    screen = actions.Screen(1920, 1080, fit.scale)
    assert screen.to_screen(0, 0) == (0, 0)
    assert screen.to_screen(fit.width / 2, fit.height / 2) == (960, 540)
    assert screen.to_screen(fit.width - 1, fit.height - 1)[0] >= 1920 - 1 / fit.scale - 1


def test_a_budget_below_the_smallest_screenshot_says_what_to_change():
    with pytest.raises(screen_fit.ScreenDoesNotFit, match=r"does not fit 100 image tokens.*144"):
        screen_fit.fit_scale(100)


def test_limits_from_a_processor_and_from_config():
    images = SimpleNamespace(patch_size=16, merge_size=2, min_pixels=None, max_pixels=None,
                             size={"shortest_edge": 1024, "longest_edge": 1048576})  # fmt: skip
    limits = screen_fit.ImageLimits.of(SimpleNamespace(image_processor=images))
    assert limits == screen_fit.ImageLimits(16, 2, 1024, 1048576)
    assert screen_fit.ImageLimits.from_config({"max_pixels": 1000000}).max_pixels == 1000000
    assert screen_fit.image_tokens(1920, 1080, limits) < 2691  # max_pixels caps it
