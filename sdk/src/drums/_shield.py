"""Cleanup that neither Ctrl-C nor cancellation can cut short, and that still ends in time.

Destroying envs on the way out of a `with` block must finish even when the block is leaving
because of Ctrl-C or a cancelled task; otherwise the envs leak until their idle timeout. So while
cleanup runs, SIGINT is held (and handed to the previous handler afterwards), and async cleanup
runs in a shielded cancel scope with its own deadline.
"""

from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator, List

import anyio

log = logging.getLogger("drums")


@contextmanager
def sigint_held() -> Iterator[None]:
    """Hold SIGINT until the block ends, then pass it on; a no-op outside the main thread.

    Works under plain Python, trio and asyncio alike: each installs its own SIGINT handler, which
    is put back and called once the block ends (so trio or asyncio handle the signal their way).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: List[int] = []

    def hold(signum: int, frame: Any) -> None:
        if not received:
            log.warning("Ctrl-C: destroying this client's envs first (bounded by cleanup_s)")
        received.append(signum)

    try:
        previous = signal.signal(signal.SIGINT, hold)
    except ValueError:  # signals only work in the main thread of the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


@contextmanager
def shielded(seconds: float) -> Iterator[anyio.CancelScope]:
    """Async cleanup scope: shielded from outer cancellation, cancelled itself after `seconds`."""
    with sigint_held(), anyio.CancelScope(shield=True) as scope:
        scope.deadline = anyio.current_time() + seconds
        yield scope
