"""`drumsd serve`: load the config, refuse unsafe starts, run the daemon until a signal.

`main` owns the root nursery: the runtime and the slot supervisor (reaper, admission sampler,
gate timers) start first, then api/http_server.py serves the app (HTTP/1.1, on hypercorn's
protocol code; no one connection can end it). SIGTERM/SIGINT drain in-flight requests
within drain_timeout_s; a second signal stops at once.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from drumsd.core.config import (
    Config,
    is_loopback,
    listen_host_port,
)
from drumsd.core.seams import RuntimeError_, SlotRuntime
from drumsd.linux.config_file import load_config_or_report
from drumsd.linux.host_share import ClaimError, bind_listener, hold_dir
from drumsd.version import VERSION

if TYPE_CHECKING:
    from drumsd.linux.image_apps import AppManifest

log = logging.getLogger("drumsd.serve")

MIN_TOKEN_CHARS = 32


class Refusal(Exception):
    """A reason not to start, said in one line with what to do."""


def read_token(path: Path) -> str:
    """The bearer token, refusing a missing, short or group/other-readable file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise Refusal(
            f"token_file {path} does not exist; create it with 32+ random characters, mode 0600 "
            f"(e.g. `head -c 32 /dev/urandom | base64 > {path}; chmod 600 {path}`)"
        ) from None
    except OSError as exc:
        raise Refusal(f"token_file {path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise Refusal(f"token_file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise Refusal(
            f"token_file {path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o});"
            f" run `chmod 600 {path}`"
        )
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise Refusal(f"token_file {path} cannot be read: {exc}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise Refusal(
            f"token_file {path} holds {len(token)} characters, fewer than {MIN_TOKEN_CHARS}; "
            "write a longer random token"
        )
    return token


def preflight(config: Config) -> str:
    """Every refusal before anything starts; returns the token."""
    host, _ = listen_host_port(config.listen)
    if not is_loopback(host) and not config.allow_remote:
        raise Refusal(
            f"listen {config.listen} is not loopback and allow_remote is false; set allow_remote:"
            " true (and put TLS in front) to serve other hosts"
        )
    token = read_token(config.token_file)
    for key in ("state_dir", "journal_dir", "forgotten_dir"):
        path: Path = getattr(config, key)
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise Refusal(
                f"{key} {path} cannot be created: {exc.strerror}; fix the path or permissions"
            ) from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise Refusal(f"{key} {path} is not writable by this user")
    return token


def claim_host_share(config: Config) -> tuple[list[int], int]:
    """Before anything reads or changes a slot: hold the state and journal dirs (a second daemon
    on the same config stops here, touching nothing) and bind the port. Returns the lock fds
    (held for the process's life) and the bound socket's fd for the HTTP server."""
    held: list[int] = []
    try:
        for key in ("state_dir", "journal_dir"):
            held.append(hold_dir(getattr(config, key), key))
        host, port = listen_host_port(config.listen)
        return held, bind_listener(host, port).detach()
    except ClaimError as exc:
        for fd in held:
            os.close(fd)
        raise Refusal(str(exc)) from None


@asynccontextmanager
async def open_runtime(config: Config) -> AsyncIterator[SlotRuntime]:
    """The runtime named by config `runtime`: linux (the real one) or memory (tests only)."""
    if config.runtime == "memory":
        from drumsd.runtime.memory_runtime import MemoryRuntime

        log.warning("runtime=memory: no real desktops; for control-plane tests only")
        # Control-plane tests slow the fake restores down to catch a daemon mid-create.
        delay = float(os.environ.get("DRUMS_MEMORY_RESTORE_DELAY_S", "0") or 0)
        yield MemoryRuntime(config.state_dir, restore_delay_s=delay)
        return
    try:
        from drumsd.runtime.linux import LinuxRuntimeConfig, open_linux_runtime
    except ImportError as exc:
        raise Refusal(
            f"the Linux runtime cannot be loaded ({exc}); reinstall drumsd, or set runtime: "
            '"memory" only for control-plane tests'
        ) from None
    async with open_linux_runtime(LinuxRuntimeConfig.from_config(config)) as runtime:
        yield runtime


def default_image_apps(config: Config) -> AppManifest | None:
    """The apps of the default image (config `lower`, or the built `default_image` profile), which
    `GET /v1/tasks` checks tasks against; None when no image is built yet (apps unchecked)."""
    from drumsd.linux.image_apps import manifest_for_root
    from drumsd.linux.state_files import find_image

    if config.lower is not None:
        root = config.lower
    else:
        found = find_image(config.images_dir, config.default_image)
        if found is None:
            log.warning("no %s image: tasks' apps are not checked", config.default_image)
            return None
        root = found[0]
    manifest = manifest_for_root(root, config.default_image)
    name = manifest.profile or config.default_image
    log.info("image=%s apps: %s", name, ", ".join(sorted(manifest.apps)))
    return manifest


def task_seams(config: Config, runtime: SlotRuntime) -> dict[str, object]:
    """The task bridge as the supervisor's `tasks` and `verifier` seams, for the Linux runtime.
    The memory runtime keeps the placeholders (no task runs on a fake desktop)."""
    if config.runtime != "linux":
        return {}
    try:
        from drumsd.tasks.bridge import TaskBridge, context_from_config
        from drumsd.tasks.checker import CheckerSlots
        from drumsd.tasks.checker_venv import load_checker_venv
    except ImportError as exc:
        log.warning("no task bridge (%s): tasks are unsupported, verify has no checker", exc)
        return {}
    venv = load_checker_venv(path=config.tasks.checker_venv)
    if venv is None:
        log.warning(
            "the checker venv %s is not built: OSWorld metric checkers are unsupported until "
            "`python -m drumsd.tasks` builds it",
            config.tasks.checker_venv or "for the current pins",
        )
    from drumsd.tasks.osworld_pin import resolve_osworld

    apps = default_image_apps(config)
    osworld = resolve_osworld(config.tasks.osworld)
    if osworld.configured:
        (log.info if osworld.tasks_dir else log.warning)("osworld: %s", osworld.detail)
    try:
        ctx = context_from_config(config.tasks, venv, apps=apps)
    except ValueError as exc:  # tasks.exploits_report unreadable or not the suite's JSON
        raise Refusal(str(exc)) from None
    if osworld.tasks_dir is not None and osworld.tasks_dir not in ctx.task_dirs:
        ctx = ctx.model_copy(update={"task_dirs": [*ctx.task_dirs, osworld.tasks_dir]})
    checkers = None
    if config.tasks.resident_checkers and ctx.checker is not None:
        from drumsd.tasks.checker_pool import CheckerPool

        checkers = CheckerPool(ctx.checker, max_rss_mib=config.tasks.checker_worker_max_rss_mib)
    slots = CheckerSlots(config.tasks.max_concurrent_checkers, config.tasks.checker_memory_mib)
    bridge = TaskBridge(ctx, runtime, checkers=checkers, checker_slots=slots)
    bridge.status = {
        "image": apps.profile if apps else None,
        "image_apps": sorted(apps.apps) if apps else None,
        "osworld": osworld.to_json(),
        "warnings": [osworld.detail] if osworld.configured and not osworld.tasks_dir else [],
    }
    return {"tasks": bridge, "verifier": bridge}


async def start_gate_seams(config: Config, nursery: trio.Nursery) -> dict[str, object]:
    """The crash watch (started here, before the supervisor, so no slot is restored unwatched)
    and the gate evidence reader, for the Linux runtime. With crash_watch on, a connector that
    cannot be opened refuses the start."""
    if config.runtime != "linux":
        return {}
    from drumsd.linux.proc_events import ProcEventsError
    from drumsd.runtime.crash_watch import CrashWatch
    from drumsd.runtime.gate_evidence import GateEvidence

    view = config.procview_dir is not None
    seams: dict[str, object] = {"evidence": GateEvidence(procview=view)}
    if not config.crash_watch:
        log.warning("crash_watch is off: the no_app_crash gate passes unobserved")
        return seams
    watch = CrashWatch()
    try:
        await nursery.start(watch.run)
    except ProcEventsError as exc:
        raise Refusal(
            f"crash_watch is on but the kernel's process events connector cannot be opened: {exc}"
            "; run drumsd as root in the host's network namespace, or set crash_watch: false "
            "(no_app_crash is then not observed)"
        ) from None
    seams["crash_watch"] = watch
    return seams


async def _watch_signals(
    shutdown: trio.Event,
    on_first: list,
    root: trio.CancelScope,
    drain_timeout_s: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if not shutdown.is_set():
                log.info(
                    "%s: draining requests (at most %.0fs); send again to stop now",
                    name,
                    drain_timeout_s,
                )
                for fn in on_first:
                    fn()
                shutdown.set()
                # The hard limit on the whole shutdown: drain, then stop the supervisor.
                root.deadline = min(root.deadline, trio.current_time() + drain_timeout_s + 2)
            else:
                log.warning("%s again: stopping now", name)
                root.cancel()
                return


async def serve_async(config: Config, token: str, listen_fd: int | None = None) -> None:
    from drumsd.api.app import create_app
    from drumsd.api.http_server import HTTPServer, hyper_config
    from drumsd.linux.journal_io import Journal
    from drumsd.runtime.supervisor import Supervisor

    async with open_runtime(config) as runtime, trio.open_nursery() as root:
        shutdown = trio.Event()
        hooks: list = []
        await root.start(
            partial(_watch_signals, shutdown, hooks, root.cancel_scope, config.drain_timeout_s)
        )
        journal = await trio.to_thread.run_sync(Journal, config.journal_dir)
        seams = await trio.to_thread.run_sync(task_seams, config, runtime)
        checkers = getattr(seams.get("tasks"), "checkers", None)
        if checkers is not None:  # the resident checker worker starts before the first verify
            await root.start(checkers.serve)
        seams.update(await start_gate_seams(config, root))
        supervisor = Supervisor(config, runtime, journal, version=VERSION, **seams)  # type: ignore[arg-type]
        with trio.fail_after(300):  # reconcile and adoption have a limit too
            await root.start(supervisor.run)
        hooks.append(lambda: setattr(supervisor, "draining", True))

        app = create_app(supervisor, config, token)
        if listen_fd is not None:
            sock = socket.socket(fileno=listen_fd)
        else:
            try:
                sock = bind_listener(*listen_host_port(config.listen))
            except ClaimError as exc:
                raise Refusal(str(exc)) from None
        # The socket is held here, outside the server: a restarted accept loop listens on it again.
        http = HTTPServer(app, hyper_config(config.drain_timeout_s), sock, shutdown)

        async def run_http(*, task_status: trio.TaskStatus[list[str]]) -> None:
            await http.serve(task_status=task_status)
            root.cancel_scope.cancel()  # HTTP drained: stop the supervisor and the runtime

        binds = await root.start(run_http)
        log.info(
            "listening on %s (profile=%s, runtime=%s)",
            ", ".join(binds),
            config.profile,
            config.runtime,
        )
        print(f"drumsd: listening on {', '.join(binds)}", file=sys.stderr, flush=True)


def _reason(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc)


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def main_serve(config_path: Path, *, trusted_unhardened: bool = False) -> int:
    config = load_config_or_report(config_path, prefix="drumsd: ")
    if config is None:
        return 2
    if trusted_unhardened:
        config = config.model_copy(update={"profile": "trusted"})
    logging.basicConfig(
        level=config.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        token = preflight(config)
        _held, listen_fd = claim_host_share(config)
        trio.run(serve_async, config, token, listen_fd)
    except (Refusal, RuntimeError_) as exc:
        print(f"drumsd: refusing to start: {_reason(exc)}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        from drumsd.api.http_server import ListenerFailed

        failed = group.subgroup(ListenerFailed)
        if failed is not None:
            print(f"drumsd: stopped: {_leaves(failed)[0]}", file=sys.stderr)
            return 1
        # A refusal from inside a nursery (e.g. the runtime's own start checks).
        found = group.subgroup((Refusal, RuntimeError_))
        if found is None:
            raise
        first = _leaves(found)[0]
        print(f"drumsd: refusing to start: {_reason(first)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    log.info("stopped")
    return 0
