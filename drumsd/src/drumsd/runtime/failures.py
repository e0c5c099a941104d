"""The one place a runtime failure becomes an API error and a metric.

Operations wrap their runtime call in `runtime_failures(...)`; a deadline (trio.TooSlowError) turns
into `timeout`, a `RuntimeError_` into its own code with the slot named, anything unexpected is
counted and logged with the slot before it reaches the app's 500 handler. `bounded_cleanup` gives
the supervisor's own cleanup a deadline that applies whatever the runtime shields inside.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import trio

from drumsd.core.errors import DrumsdError
from drumsd.core.metrics import MetricsWindow
from drumsd.core.seams import RuntimeError_

log = logging.getLogger("drumsd.supervisor")


def as_api_error(exc: RuntimeError_, slot_id: str | None = None) -> DrumsdError:
    detail = dict(exc.detail)
    if slot_id:
        detail.setdefault("slot", slot_id)
    return DrumsdError(exc.code, exc.message, **detail)


def failure_text(exc: BaseException, cancelled: str) -> str:
    """What a record's `failure` says about an operation that did not finish."""
    if isinstance(exc, RuntimeError_):
        return f"{exc.code}: {exc.message}"
    if isinstance(exc, Exception):
        return f"unexpected: {type(exc).__name__}: {exc}"
    return cancelled


@contextmanager
def runtime_failures(
    metrics: MetricsWindow,
    *,
    what: str,
    slot_id: str | None,
    timeout_s: float | None = None,
    timeout_metric: str = "timeout",
) -> Iterator[None]:
    """Map a deadline, a RuntimeError_ and an unexpected error raised inside the block."""
    try:
        yield
    except DrumsdError:
        raise
    except trio.TooSlowError:
        metrics.failure(timeout_metric)
        limit = f" took longer than {timeout_s:g}s" if timeout_s is not None else " timed out"
        raise DrumsdError("timeout", f"{what}{limit}", slot=slot_id) from None
    except RuntimeError_ as exc:
        metrics.failure(exc.code)
        raise as_api_error(exc, slot_id) from exc
    except Exception:
        metrics.failure("unexpected")
        log.exception("slot=%s %s failed unexpectedly", slot_id, what)
        raise


async def bounded_cleanup(
    nursery: trio.Nursery | None,
    what: str,
    slot_id: str | None,
    deadline_s: float,
    fn: Callable[..., Awaitable[object]],
    *args: object,
) -> bool:
    """Run a cleanup shielded from the caller's cancellation, waiting at most `deadline_s`.

    The cleanup runs as its own task in the supervisor's nursery, so the deadline applies even when
    the runtime shields its work or blocks in a thread: past it the caller goes on (the record is
    written, the slot marked) and the task finishes, or is swept at the next start. True when it
    finished in time."""
    done = trio.Event()

    async def body() -> None:
        try:
            await fn(*args)
        except RuntimeError_ as exc:
            log.error("slot=%s %s failed: %s; the next start sweeps it", slot_id, what, exc.message)
        except Exception:
            log.exception("slot=%s %s failed unexpectedly; the next start sweeps it", slot_id, what)
        finally:
            done.set()

    with trio.CancelScope(shield=True):
        if nursery is not None:
            try:
                nursery.start_soon(body)
            except RuntimeError:  # the nursery is closing (the daemon stops): run it here
                nursery = None
        if nursery is None:  # no supervisor nursery (not running): bounded inline
            with trio.move_on_after(deadline_s):
                await body()
        else:
            with trio.move_on_after(deadline_s):
                await done.wait()
    if not done.is_set():
        log.error(
            "slot=%s %s did not finish within %gs; going on, the next start sweeps what it left",
            slot_id,
            what,
            deadline_s,
        )
    return done.is_set()
