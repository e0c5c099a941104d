"""The desktops as the console sees them: a full frame and a server-side scaled thumbnail per
slot, grabbed at most every few hundred milliseconds however many browsers watch, and scaled
again only when the screen changed (same PNG bytes, same thumbnail). Scaling changed screens
again has a CPU budget: past it, a slot keeps its older thumbnail a little longer."""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
from PIL import Image

THUMB_SIZE = (320, 200)
FRAME_MIN_AGE_S = 0.2  # the slot page's few frames per second
THUMB_MIN_AGE_S = 1.0  # the grid's refresh: a new grab at most this often per slot
# Share of one core that re-scaling changed screens may use (a slot's first thumbnail is always
# made): many desktops changing at once must not cost the daemon more than the console's budget.
RESCALE_BUDGET = 0.03


@dataclass(frozen=True)
class Picture:
    png: bytes
    etag: str


@dataclass
class _Seen:
    png: bytes
    etag: str
    taken_at: float
    thumb: bytes | None = None  # the thumbnail of `png`, made on first request
    thumb_etag: str = ""
    older: Picture | None = None  # the previous screen's thumbnail, while the budget is spent


def scale_png(png: bytes, size: tuple[int, int] = THUMB_SIZE) -> bytes:
    """A PNG of `png` fitted into `size` (aspect kept; never enlarged)."""
    with Image.open(io.BytesIO(png)) as im:
        im.draft("RGB", size)
        rgb = im.convert("RGB")
    rgb.thumbnail(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    out = io.BytesIO()
    rgb.save(out, "PNG", compress_level=1)
    return out.getvalue()


def timed_scale(png: bytes) -> tuple[bytes, float]:
    """The thumbnail and the CPU time it took (this thread's)."""
    started = time.thread_time()
    thumb = scale_png(png)
    return thumb, time.thread_time() - started


class Frames:
    def __init__(
        self,
        grab: Callable[[str], Awaitable[bytes | None]],
        *,
        clock: Callable[[], float] = trio.current_time,
        scale: Callable[[bytes], tuple[bytes, float]] = timed_scale,
        rescale_budget: float = RESCALE_BUDGET,
    ) -> None:
        self._grab = grab
        self._clock = clock
        self._scale = scale
        self._budget = rescale_budget
        self._rescale_at = 0.0  # no re-scaling before this (clock) time
        self._seen: dict[str, _Seen] = {}
        self._locks: dict[str, trio.Lock] = {}
        self.grabs = 0  # screenshots taken (for the load check and tests)
        self.scaled = 0  # thumbnails made

    async def frame(self, slot_id: str) -> Picture | None:
        seen = await self._fresh(slot_id, FRAME_MIN_AGE_S)
        return None if seen is None else Picture(seen.png, seen.etag)

    async def thumbnail(self, slot_id: str) -> Picture | None:
        seen = await self._fresh(slot_id, THUMB_MIN_AGE_S)
        if seen is None:
            return None
        if seen.thumb is None:
            if seen.older is not None and self._clock() < self._rescale_at:
                return seen.older
            seen.thumb, cpu_s = await trio.to_thread.run_sync(self._scale, seen.png)
            seen.thumb_etag = "t" + seen.etag
            self.scaled += 1
            if seen.older is not None:
                self._rescale_at = self._clock() + cpu_s / self._budget
            seen.older = None
        return Picture(seen.thumb, seen.thumb_etag)

    def forget_except(self, live: set[str]) -> None:
        for slot_id in [s for s in self._seen if s not in live]:
            del self._seen[slot_id]
            self._locks.pop(slot_id, None)

    async def _fresh(self, slot_id: str, min_age_s: float) -> _Seen | None:
        # One grab per slot at a time: a second viewer waits for the first one's picture.
        async with self._locks.setdefault(slot_id, trio.Lock()):
            seen = self._seen.get(slot_id)
            now = self._clock()
            if seen is not None and now - seen.taken_at < min_age_s:
                return seen
            png = await self._grab(slot_id)
            self.grabs += 1
            if png is None:
                return seen
            etag = hashlib.blake2b(png, digest_size=16).hexdigest()
            if seen is not None and seen.etag == etag:
                seen.taken_at = now  # unchanged screen: keep its thumbnail
                return seen
            older = None
            if seen is not None:
                older = Picture(seen.thumb, seen.thumb_etag) if seen.thumb else seen.older
            seen = _Seen(png=png, etag=etag, taken_at=now, older=older)
            self._seen[slot_id] = seen
            return seen
