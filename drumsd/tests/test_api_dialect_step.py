"""Dialect steps through the API in process (memory runtime): a batch of vendor calls runs in one
request, with one screenshot at the model's size after (or one per call); a bad call is a 422 that
names the dialect, the field and the allowed values, and no call of its batch runs."""

from __future__ import annotations

from pathlib import Path

from harness import create, open_api


async def test_a_batch_runs_in_one_request_with_one_screenshot(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        sid = (await create(api))["id"]
        calls = [
            {"name": "left_click", "input": {"coordinate": [640, 400]}},
            {"name": "type", "input": {"text": "hi"}},
            {"name": "key", "input": {"text": "Return"}},
        ]
        body = {
            "dialect": "anthropic-2026-08",
            "actions": calls,
            "screen": {"width": 1280, "height": 800},
            "screenshot_options": {"format": "jpeg", "quality": 70},
        }
        r = await api.client.post(f"/v1/slots/{sid}/step", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["actions"] == 3
        assert [c["name"] for c in out["results"]] == ["left_click", "type", "key"]
        assert (out["screenshot_width"], out["screenshot_height"]) == (1280, 800)
        assert out["screenshot_content_type"] == "image/jpeg"
        assert all("image_b64" not in c or c["image_b64"] is None for c in out["results"])

        each = {
            "dialect": "openai",
            "actions": [
                {"type": "move", "x": 1, "y": 1},
                {"type": "screenshot"},
            ],
            "screenshot_each": True,
            "screen": {"width": 1024, "height": 768},
        }
        r = await api.client.post(f"/v1/slots/{sid}/step", json=each)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [(c["image_width"], c["image_height"]) for c in results] == [(1024, 768)] * 2

        zoom = {
            "dialect": "anthropic-2025-11",
            "actions": [{"action": "zoom", "region": [0, 0, 64, 32]}],
        }
        r = await api.client.post(f"/v1/slots/{sid}/step", json=zoom)
        assert r.status_code == 200, r.text
        got = r.json()["results"][0]
        assert (got["image_width"], got["image_height"]) == (64, 32)


async def test_a_bad_call_is_a_422_naming_dialect_field_and_allowed(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        sid = (await create(api))["id"]
        step = f"/v1/slots/{sid}/step"
        cases = [
            (
                {
                    "dialect": "openai",
                    "actions": [
                        {"type": "move", "x": 1, "y": 1},
                        {"type": "click", "button": "middle", "x": 1, "y": 1},
                    ],
                },
                "actions[1].button",
                "wheel",
            ),
            (
                {
                    "dialect": "anthropic-2026-08",
                    "actions": [
                        {"name": "scroll", "input": {"scroll_direction": "in", "scroll_amount": 1}}
                    ],
                },
                "actions[0].scroll_direction",
                "up, down, left, right",
            ),
            ({"dialect": "claude", "actions": [{}]}, "dialect", "openai"),
            ({"actions": [{"type": "wait"}]}, "dialect", None),
            ({"dialect": "openai", "actions": []}, "actions", None),
            (
                {"dialect": "openai", "actions": [{"type": "wait"}], "action": "pass"},
                "action",
                None,
            ),
            (
                {
                    "dialect": "openai",
                    "actions": [{"type": "move", "x": 1300, "y": 1}],
                    "screen": {"width": 1280, "height": 800},
                },
                "actions[0].x, y",
                "0 <= x < 1280",
            ),
        ]
        for body, field, allowed in cases:
            r = await api.client.post(step, json=body)
            assert r.status_code == 422, (body, r.text)
            err = r.json()["error"]
            assert err["detail"]["field"] == field, err
            if allowed is not None:
                assert allowed in err["message"] and allowed in err["detail"]["allowed"], err
        assert api.sup.get_slot(sid).actions == 0  # nothing ran
