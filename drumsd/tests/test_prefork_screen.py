"""A fork's prefork, and a task's checkpoint, are dumped with the slot's screen encoded first
(ops_fork.encode_screen), so their restores inherit the encoded image instead of each encoding
its own on its first screenshot; a grab that fails does not stop the fork, and under
linux.screen_grab: full nothing is grabbed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drumsd.core.seams import RuntimeError_
from drumsd.guest.protocol import PNG_FULL
from harness import create, open_api


def record_calls(api: Any, fail_grab: bool = False) -> list[tuple[str, Any]]:
    """The runtime's grabs and captures, in order (a grab raises when `fail_grab`)."""
    calls: list[tuple[str, Any]] = []
    grab, capture = api.runtime.grab, api.runtime.capture

    async def grabbed(handle: Any, spec: Any, **kw: Any) -> Any:
        calls.append(("grab", (handle.slot_id, spec)))
        if fail_grab:
            raise RuntimeError_("runtime_error", "the agent did not answer")
        return await grab(handle, spec, **kw)

    async def captured(handle: Any, *a: Any, **kw: Any) -> Any:
        calls.append(("capture", handle.slot_id))
        return await capture(handle, *a, **kw)

    api.runtime.grab, api.runtime.capture = grabbed, captured
    return calls


async def test_a_fork_encodes_the_parents_screen_before_its_prefork(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        parent = (await create(api))["id"]
        calls = record_calls(api)
        r = await api.client.post(f"/v1/slots/{parent}/fork", json={"n": 2})
        assert r.status_code == 201, r.text
        assert calls[:2] == [("grab", (parent, PNG_FULL)), ("capture", parent)]


async def test_a_failed_grab_leaves_the_fork_to_go_on(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        parent = (await create(api))["id"]
        calls = record_calls(api, fail_grab=True)
        r = await api.client.post(f"/v1/slots/{parent}/fork", json={"n": 2})
        assert r.status_code == 201, r.text
        assert len(r.json()["children"]) == 2
        assert calls[:2] == [("grab", (parent, PNG_FULL)), ("capture", parent)]


async def test_a_task_checkpoint_is_captured_with_the_screen_encoded(tmp_path: Path) -> None:
    """Every later episode of the task restores its checkpoint: without the encode, each one's
    first step encoded the whole screen (~95 ms against ~15 ms one at a time; README, "Density
    ramp")."""
    from test_task_checkpoints import _bridge, _task

    async with open_api(tmp_path) as api:
        _bridge(api, tmp_path)
        calls = record_calls(api)
        first = (await create(api, task=_task()))["id"]
        captures = [i for i, c in enumerate(calls) if c == ("capture", first)]
        assert captures, calls
        assert calls[captures[0] - 1] == ("grab", (first, PNG_FULL)), calls


async def test_a_saved_state_and_full_grabs_encode_nothing(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        parent = (await create(api))["id"]
        calls = record_calls(api)
        r = await api.client.post(f"/v1/slots/{parent}/capture", json={})
        assert r.status_code in (200, 201), r.text
        assert calls == [("capture", parent)]
    (tmp_path / "full").mkdir()
    async with open_api(tmp_path / "full", linux={"screen_grab": "full"}) as api:
        parent = (await create(api))["id"]
        calls = record_calls(api)
        r = await api.client.post(f"/v1/slots/{parent}/fork", json={"n": 2})
        assert r.status_code == 201, r.text
        assert calls[0] == ("capture", parent)
