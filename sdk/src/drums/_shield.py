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
from typing import Any, Iterator

import anyio

log = logging.getLogger("drums")


class _HeldSigint:
    """One SIGINT hold shared by every cleanup running at once (nested, or in sibling tasks that
    end in any order): the first to start installs it, the last to end restores and delivers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.previous: Any = None
        self.received = 0

    def hold(self, signum: int, frame: Any) -> None:
        if not self.received:
            log.warning("Ctrl-C: destroying this client's envs first (bounded by cleanup_s)")
        self.received += 1

    def enter(self) -> bool:
        with self.lock:
            if self.depth == 0:
                try:
                    self.previous = signal.signal(signal.SIGINT, self.hold)
                except ValueError:  # signals only work in the main thread of the main interpreter
                    return False
                self.received = 0
            self.depth += 1
            return True

    def exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth:
                return
            previous, received = self.previous, self.received
            # None: the handler was not set from Python (an embedding host, or an interpreter
            # finalizing after Ctrl-C); signal.signal(SIGINT, None) is a TypeError, so put
            # Python's default back instead.
            if previous is None:
                previous = signal.default_int_handler
            signal.signal(signal.SIGINT, previous)
            self.previous, self.received = None, 0
        if received:
            if callable(previous):
                previous(signal.SIGINT, None)  # trio and asyncio handle it their way
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


_held = _HeldSigint()


@contextmanager
def sigint_held() -> Iterator[None]:
    """Hold SIGINT until the block ends, then pass it on; a no-op outside the main thread.

    Works under plain Python, trio and asyncio alike: each installs its own SIGINT handler, which
    is put back and called once the last such block ends.
    """
    if threading.current_thread() is not threading.main_thread() or not _held.enter():
        yield
        return
    try:
        yield
    finally:
        _held.exit()


@contextmanager
def shielded(seconds: float) -> Iterator[anyio.CancelScope]:
    """Async cleanup scope: shielded from outer cancellation, cancelled itself after `seconds`."""
    with sigint_held(), anyio.CancelScope(shield=True) as scope:
        scope.deadline = anyio.current_time() + seconds
        yield scope
