"""The guest's screenshot encoders on a real restored desktop (base image, hardened): the frame is
read from Xvfb's framebuffer segment (not through GetImage), and after a change on the screen the
fast path's PNG and JPEG have the size asked for and the same pixels as the path before it
(`fresh`: Pillow's grab and encoders) on the same screen. Seconds, one template, one slot.

Without DRUMS_LIVE=1 it skips; with it a missing CRIU or image is a failure.
"""

# Polling with a deadline is how these tests wait for the desktop (no event to wait on).
# ruff: noqa: ASYNC110

from __future__ import annotations

import io
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from drumsd.core.seams import CheckpointRef, SlotLimits
from drumsd.guest.protocol import PNG_FULL, ShotSpec
from PIL import Image, ImageChops
from test_runtime_linux import CRIU, _require_live

pytestmark = pytest.mark.live

LIMITS = SlotLimits(vcpus=1.0, memory_mib=2048, pids_max=1024, tmpfs_mib=512)
JPEG_1280 = ShotSpec("jpeg", 80, 1280, 720)
IN_GUEST = (
    "python3 -I -c \"import sys; sys.path.insert(0, '/opt/drums/guest'); "
    "from drums_guest.screen import Screen; print(Screen(':0').grab().method)\""
)


@pytest.fixture(scope="module")
def state_dir() -> Iterator[Path]:
    top = Path(f"/run/drums-test-shots-{uuid.uuid4().hex[:8]}")
    top.mkdir(mode=0o700, parents=True)
    d = top / "state"
    d.mkdir()
    yield d
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        if line.split()[4].startswith(str(top)):
            subprocess.run(["umount", "-l", line.split()[4]], check=False)
    shutil.rmtree(top, ignore_errors=True)


def _config(state_dir: Path):
    from drumsd.runtime.linux import LinuxRuntimeConfig

    return LinuxRuntimeConfig(state_dir=state_dir, criu=CRIU, profile="hardened")


@pytest.fixture(scope="module")
def template(state_dir: Path) -> CheckpointRef:
    lower, sha = _require_live()
    from drumsd.runtime.linux import open_linux_runtime

    async def make() -> CheckpointRef:
        async with open_linux_runtime(_config(state_dir)) as rt:
            return await rt.make_template(lower, sha, "shots-live", state_dir / "ck" / "base")

    return trio.run(make)


@pytest.fixture
async def rt(state_dir: Path, template: CheckpointRef) -> AsyncIterator[object]:
    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(_config(state_dir)) as runtime:
        yield runtime
        await runtime.sweep([])


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image.convert("RGB")


async def settled(rt, h, spec: ShotSpec) -> bytes:
    """The spec's image once the screen held still between two grabs (cached by the guest)."""
    with trio.fail_after(15):
        while not (shot := await rt.grab(h, spec)).cached:
            await trio.sleep(0.1)
    return shot.data


async def changed_from(rt, h, before: Image.Image) -> None:
    """Until the full-size screen differs from `before` (the xterm draws after the step)."""
    with trio.fail_after(10):
        while (
            ImageChops.difference(decoded((await rt.grab(h, PNG_FULL)).data), before).getbbox()
            is None
        ):
            await trio.sleep(0.05)


async def test_a_changed_screen_encodes_fast_to_the_same_pixels(rt, template, state_dir) -> None:
    h = await rt.restore(f"shots-{uuid.uuid4().hex[:6]}", template, LIMITS)
    try:
        method = await rt.exec_trusted(h, IN_GUEST, 20)
        assert (method.returncode, method.stdout.strip()) == (0, "shm"), method

        await rt.step(h, {"type": "click", "x": 300, "y": 200})  # focus the xterm
        before = decoded(await settled(rt, h, PNG_FULL))
        await rt.step(h, {"type": "type", "text": "drums drums"})
        with trio.fail_after(10):  # the xterm draws the echo after the step returns
            while (
                ImageChops.difference(decoded((await rt.grab(h, PNG_FULL)).data), before).getbbox()
                is None
            ):
                await trio.sleep(0.05)

        png = await settled(rt, h, PNG_FULL)
        legacy_png = (await rt.grab(h, PNG_FULL, fresh=True)).data
        assert decoded(png).size == (1920, 1080)
        assert ImageChops.difference(decoded(png), decoded(legacy_png)).getbbox() is None, (
            "the banded PNG shows other pixels than Pillow's grab and encoder"
        )
        changed = ImageChops.difference(decoded(png), before).getbbox()
        assert changed is not None and changed[3] - changed[1] < 200, changed

        jpeg = await settled(rt, h, JPEG_1280)
        legacy_jpeg = (await rt.grab(h, JPEG_1280, fresh=True)).data
        ours, theirs = decoded(jpeg), decoded(legacy_jpeg)
        assert ours.size == theirs.size == (1280, 720)
        diff = ImageChops.difference(ours, theirs)
        assert max(hi for _, hi in diff.getextrema()) <= 24, diff.getextrema()

        # A scaled view kept between grabs redoes only the columns X DAMAGE reported (the typed
        # characters'), and is still a full resize of the screen (1.5 both ways: exact).
        scaled = ShotSpec("png", None, 1280, 720)
        await settled(rt, h, scaled)
        await rt.step(h, {"type": "type", "text": " tail"})
        await changed_from(rt, h, decoded(png))
        full = decoded(await settled(rt, h, PNG_FULL))
        diff = ImageChops.difference(
            decoded(await settled(rt, h, scaled)), full.resize((1280, 720), Image.Resampling.BOX)
        )
        assert max(hi for _, hi in diff.getextrema()) <= 1, diff.getbbox()

        # The agent's X DAMAGE connection and Xvfb's framebuffer segment through a CRIU dump and
        # a restore: the restored copy still sees what is typed.
        ck = await rt.capture(h, "shots-live-save", state_dir / "ck" / f"s-{uuid.uuid4().hex[:6]}")
        await rt.destroy(h.slot_id)
        h = await rt.restore(f"shots-{uuid.uuid4().hex[:6]}", ck, LIMITS)
        restored = decoded(await settled(rt, h, PNG_FULL))
        await rt.step(h, {"type": "type", "text": "again"})
        with trio.fail_after(10):
            while (
                ImageChops.difference(
                    decoded((await rt.grab(h, PNG_FULL)).data), restored
                ).getbbox()
                is None
            ):
                await trio.sleep(0.05)
        png = await settled(rt, h, PNG_FULL)
        legacy_png = (await rt.grab(h, PNG_FULL, fresh=True)).data
        assert ImageChops.difference(decoded(png), decoded(legacy_png)).getbbox() is None
    finally:
        await rt.destroy(h.slot_id)


async def test_screen_grab_full_re_encodes_an_unchanged_screen(template, state_dir) -> None:
    """`linux.screen_grab: full`: every screenshot, a step's and a batch's included, is the path
    before (GetImage, Pillow's encoder, no cache): a still screen is encoded again each time, where
    the default answers it from the guest's cache."""
    import dataclasses

    from drumsd.runtime.linux import open_linux_runtime

    async with open_linux_runtime(_config(state_dir)) as rt:
        h = await rt.restore(f"shots-{uuid.uuid4().hex[:6]}", template, LIMITS)
        try:
            await settled(rt, h, PNG_FULL)  # the default: a still screen comes from the cache
            await rt.step(h, {"type": "move", "x": 5, "y": 5}, PNG_FULL)
            await settled(rt, h, PNG_FULL)
            outcome = await rt.step(h, {"type": "move", "x": 5, "y": 5}, PNG_FULL)
            assert outcome.screenshot is not None and outcome.screenshot.cached
        finally:
            await rt.destroy(h.slot_id)
        await rt.sweep([])
    full = dataclasses.replace(_config(state_dir), screen_grab="full")
    async with open_linux_runtime(full) as rt:
        h = await rt.restore(f"shots-{uuid.uuid4().hex[:6]}", template, LIMITS)
        try:
            await rt.step(h, {"type": "move", "x": 5, "y": 5})
            with trio.fail_after(15):  # until two grabs in a row show the same screen
                last = b""
                while (shot := await rt.grab(h, PNG_FULL)).data != last:
                    assert not shot.cached and shot.encode_s > 0
                    last = shot.data
                    await trio.sleep(0.2)
            assert not shot.cached and shot.encode_s > 0, "a still screen is encoded again"
            step = await rt.step(h, {"type": "move", "x": 5, "y": 5}, PNG_FULL)
            batch = await rt.step_batch(h, [{"type": "move", "x": 5, "y": 5}], PNG_FULL)
            for got in (step.screenshot, batch[1]):
                assert got is not None and not got.cached and got.encode_s > 0, got
                assert (got.width, got.height) == (1920, 1080)
        finally:
            await rt.destroy(h.slot_id)
        await rt.sweep([])
