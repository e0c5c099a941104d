"""What the control plane does inside a live instance: agent calls (step, windows, screenshot,
exec as the desktop user), trusted commands and file writes through nsenter, file reads beneath
the slot's root from the host side, facts for the gates, quiescence and exit waits."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import trio

from drumsd.core.seams import (
    CommandResult,
    RuntimeError_,
    Screenshot,
    SlotFacts,
    SlotHandle,
    StepOutcome,
)
from drumsd.core.slot_env import slot_command_env
from drumsd.guest import protocol
from drumsd.linux import beneath, checker_exec, procfs, syscalls
from drumsd.linux.exec_helper import helper_argv
from drumsd.linux.process_trees import DEVNULL, kill_group, nsenter_path, slot_proc_files
from drumsd.runtime import agent_client
from drumsd.runtime.linux.base import (
    DESKTOP_UID,
    Instance,
    LinuxRuntimeConfig,
    agent_code,
)
from drumsd.runtime.linux.fs import InstanceFs
from drumsd.runtime.linux.instances import InstanceTable
from drumsd.runtime.linux.supervision import Supervision

# What a command run in a slot through nsenter gets instead of the daemon's environment.
_XAUTHORITY = str(PurePosixPath(protocol.SOCKET_PATH).parent / "Xauthority")  # guest/init.py's
_ROOT_ENV = slot_command_env(xauthority=_XAUTHORITY)
_DESKTOP_ENV = slot_command_env(user="user", home="/home/user", xauthority=_XAUTHORITY)


class SlotIO:
    def __init__(
        self,
        config: LinuxRuntimeConfig,
        sup: Supervision,
        fs: InstanceFs,
        table: InstanceTable,
    ) -> None:
        self.config = config
        self.sup = sup
        self.driver = sup.driver
        self.fs = fs
        self.table = table

    async def _agent(
        self, handle: SlotHandle, request: dict[str, Any], limit_s: float
    ) -> tuple[dict[str, Any], bytes]:
        inst = self.table.of(handle)
        try:
            return await self.sup.agent_call(inst, request, limit_s)
        except agent_client.AgentError as exc:
            if exc.code in (agent_client.UNREACHABLE, "failed") and not procfs.is_same_process(
                inst.pid, inst.starttime
            ):
                raise RuntimeError_(
                    "runtime_error",
                    f"slot {handle.slot_id} died ({exc.message}); reset it",
                    slot=handle.slot_id,
                ) from exc
            raise RuntimeError_(agent_code(exc.code), exc.message, slot=handle.slot_id) from exc

    async def step(
        self, handle: SlotHandle, action: Mapping[str, Any], shot: protocol.ShotSpec | None = None
    ) -> StepOutcome:
        try:
            parsed = protocol.parse_action(dict(action))
        except protocol.ProtocolError as exc:
            raise RuntimeError_("invalid_request", exc.message) from exc
        limit_s = protocol.step_timeout(parsed, None) + 5.0
        t0 = time.monotonic()
        request: dict[str, Any] = {"op": "step", "action": dict(action)}
        if shot is not None:
            request["screenshot"] = shot.to_request() or True
            self._grab_path(request)
        header, data = await self._agent(handle, request, limit_s)
        result = header.get("result") or {}
        output = None
        if "rc" in result:
            output = CommandResult(
                int(result["rc"]), str(result.get("stdout", "")), str(result.get("stderr", ""))
            )
        screenshot = _screenshot(handle, shot, header, data) if shot is not None else None
        cursor = result.get("cursor")
        at = (int(cursor["x"]), int(cursor["y"])) if isinstance(cursor, dict) else None
        return StepOutcome(parsed.type, time.monotonic() - t0, output, screenshot, at)

    async def step_batch(
        self,
        handle: SlotHandle,
        actions: Sequence[Mapping[str, Any]],
        shot: protocol.ShotSpec | None = None,
    ) -> tuple[list[dict[str, Any]], Screenshot | None]:
        """Actions run in order by the guest's worker in one request (a vendor's batch): their
        results, and the screenshot after the last when `shot` asks for one."""
        try:
            parsed = protocol.parse_batch([dict(a) for a in actions])
        except protocol.ProtocolError as exc:
            raise RuntimeError_("invalid_request", exc.message) from exc
        limit_s = sum(protocol.step_timeout(a, None) for a in parsed) + 5.0
        request: dict[str, Any] = {"op": "step", "actions": [dict(a) for a in actions]}
        if shot is not None:
            request["screenshot"] = shot.to_request() or True
            self._grab_path(request)
        header, data = await self._agent(handle, request, limit_s)
        results = list((header.get("result") or {}).get("results") or [])
        screenshot = _screenshot(handle, shot, header, data) if shot is not None else None
        return results, screenshot

    def _grab_path(self, request: dict[str, Any]) -> dict[str, Any]:
        """Under `linux.screen_grab: full`, the request's screenshot takes the guest's path
        before issue 35 (X GetImage of the whole screen, Pillow's encoder, no cache)."""
        if self.config.screen_grab == "full":
            request["fresh"] = True
        return request

    async def windows(self, handle: SlotHandle) -> list[dict[str, Any]]:
        """Top-level windows as the guest agent reads them from the X server (id, name,
        instance, class, geometry, active): no window tool needed in the image."""
        header, _ = await self._agent(handle, {"op": "windows"}, 10.0)
        return list(header.get("windows") or [])

    async def screenshot(self, handle: SlotHandle) -> bytes:
        _, png = await self._agent(handle, self._grab_path({"op": "screenshot"}), 15.0)
        return png

    async def grab(
        self, handle: SlotHandle, spec: protocol.ShotSpec, *, fresh: bool = False
    ) -> Screenshot:
        """`fresh`: the guest encodes even an unchanged screen (the benchmark's baseline; also
        every grab under `linux.screen_grab: full`)."""
        request: dict[str, Any] = {"op": "screenshot"}
        if spec != protocol.PNG_FULL:
            request["shot"] = spec.to_request()
        if fresh:
            request["fresh"] = True
        self._grab_path(request)
        header, data = await self._agent(handle, request, 15.0)
        return _screenshot(handle, spec, header, data)

    async def exec_user(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        request: dict[str, Any] = {"op": "exec", "timeout_s": timeout_s}
        request["shell" if isinstance(command, str) else "argv"] = (
            command if isinstance(command, str) else list(command)
        )
        header, _ = await self._agent(handle, request, timeout_s + 5.0)
        return CommandResult(
            int(header.get("rc", -1)), str(header.get("stdout", "")), str(header.get("stderr", ""))
        )

    def _nsenter(self, inst: Instance, argv: Sequence[str], uid: int | None = None) -> list[str]:
        ids = ["-S", str(uid), "-G", str(uid)] if uid is not None else []
        # -U: act as the slot's root (hardened: an unprivileged host uid), never as host root.
        ns = ["nsenter", "-t", str(inst.pid), "-U", "-m", "-u", "-i", "-n", "-p", "-r", "-w", *ids]
        return helper_argv(
            self.fs.helper,
            self.driver.procs_files(inst.cgroups),
            False,
            [nsenter_path(), *ns[1:], "--", *argv],
        )

    async def _run_in_slot(
        self,
        inst: Instance,
        argv: Sequence[str],
        timeout_s: float,
        stdin: bytes = b"",
        uid: int | None = None,
    ) -> CommandResult:
        try:
            with trio.fail_after(timeout_s):
                proc = await trio.run_process(
                    self._nsenter(inst, argv, uid),
                    env=_DESKTOP_ENV if uid == DESKTOP_UID else _ROOT_ENV,
                    stdin=stdin,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
        except trio.TooSlowError as exc:
            raise RuntimeError_(
                "timeout",
                f"command {list(argv)!r} in slot instance {inst.iid} ran over {timeout_s} s",
            ) from exc
        return CommandResult(
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    async def exec_trusted(
        self, handle: SlotHandle, command: str, timeout_s: float
    ) -> CommandResult:
        return await self._run_in_slot(self.table.of(handle), ["/bin/sh", "-c", command], timeout_s)

    async def exec_checker(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        """A getter's command as `nobody` through nsenter, not through the guest agent: no
        process of the desktop user is its parent or shares its uid (see linux/checker_exec)."""
        inst = self.table.of(handle)
        try:
            argv = checker_exec.checker_argv(command)
        except ValueError as exc:
            raise RuntimeError_("invalid_request", f"checker command: {exc}") from exc
        return await self._run_bounded(inst, argv, timeout_s, uid=checker_exec.CHECKER_UID)

    async def _run_bounded(
        self, inst: Instance, argv: Sequence[str], timeout_s: float, uid: int
    ) -> CommandResult:
        """Run in the slot with each output kept to checker_exec.OUTPUT_LIMIT (a command that
        prints without end costs the daemon no memory) and its whole process group killed at
        the deadline (nsenter forks the command into the slot's pid namespace)."""
        proc = await trio.lowlevel.open_process(
            self._nsenter(inst, argv, uid),
            env=_ROOT_ENV,  # nothing of the daemon's environment enters the slot (env -i after)
            stdin=DEVNULL,
            stdout=-1,
            stderr=-1,
            start_new_session=True,
        )
        out, err = bytearray(), bytearray()
        try:
            with trio.move_on_after(timeout_s) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_drain, proc.stdout, out)
                    nursery.start_soon(_drain, proc.stderr, err)
                    await proc.wait()
                    # A background child may hold the pipes: answer soon after the exit.
                    nursery.cancel_scope.deadline = trio.current_time() + 1.0
        finally:
            await _end_group(proc)
        if scope.cancelled_caught:
            raise RuntimeError_(
                "timeout",
                f"checker command {list(argv)[-1]!r} in slot instance {inst.iid} ran over "
                f"{timeout_s} s",
            )
        return CommandResult(
            proc.returncode if proc.returncode is not None else -1,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
        )

    async def connect_guest(self, handle: SlotHandle, port: int) -> trio.SocketStream:
        inst = self.table.of(handle)
        raw = await trio.to_thread.run_sync(syscalls.socket_in_netns, inst.pid)
        sock = trio.socket.from_stdlib_socket(raw)
        try:
            await sock.connect(("127.0.0.1", port))
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)

    async def read_file(self, handle: SlotHandle, path: str, max_bytes: int) -> bytes:
        # From the host side, beneath the slot's root: no process in the slot (the desktop user
        # included) can answer in the guest agent's place (issue 14).
        inst = self.table.of(handle)
        where = path if path.startswith("/") else f"/home/user/{path}"
        try:
            return await trio.to_thread.run_sync(
                beneath.read_regular, f"/proc/{inst.pid}/root", where, max_bytes
            )
        except FileNotFoundError as exc:
            raise RuntimeError_(
                "not_found", f"{path} does not exist in slot {handle.slot_id}"
            ) from exc
        except beneath.TooLarge as exc:
            raise RuntimeError_(
                "invalid_request",
                f"{path} in slot {handle.slot_id} is {exc.size} bytes, over max_bytes={max_bytes}",
            ) from exc
        except OSError as exc:
            raise RuntimeError_(
                "failed", f"cannot read {path} in slot {handle.slot_id}: {exc.strerror or exc}"
            ) from exc

    async def write_file(
        self, handle: SlotHandle, path: str, data: bytes, *, user: bool = True
    ) -> None:
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        res = await self._run_in_slot(
            self.table.of(handle),
            ["/bin/sh", "-c", script, "sh", path],
            60.0,
            stdin=data,
            uid=DESKTOP_UID if user else None,
        )
        if res.returncode != 0:
            raise RuntimeError_(
                "action_failed",
                f"writing {path} in slot {handle.slot_id} failed: {res.stderr.strip()}",
            )

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        inst = self.table.get(handle.slot_id)
        exited = inst is not None and inst.exited.is_set()
        # Abandoned on cancel (the alive_after_resume judge bounds its reads): it only reads.
        return await trio.to_thread.run_sync(
            self._read_facts, handle, exited, abandon_on_cancel=True
        )

    def _read_facts(self, handle: SlotHandle, exited: bool) -> SlotFacts:
        """Blocking: the slot's facts from /proc and its cgroups (a read that fails leaves the
        fact empty: the gates judge what is missing)."""
        pid, dirs = handle.init_pid, dict(handle.cgroups)
        identity = procfs.is_same_process(pid, handle.init_starttime)
        limits: dict[str, Any] = {}
        oom = 0
        pids_max_hits: int | None = None
        pids: list[int] = []
        memory_mib: float | None = None
        with contextlib.suppress(OSError):
            limits = dict(self.driver.limits_in_force(dirs))
            oom = self.driver.oom_kills(dirs)
            pids = self.driver.pids(dirs)
            pids_max_hits = self.driver.pids_max_hits(dirs)
        with contextlib.suppress(OSError, ValueError):
            memory_mib = self.driver.memory_bytes(dirs) / 2**20
        mountinfo, links, uid_map = slot_proc_files(pid)
        return SlotFacts(
            alive=identity and not exited,
            init_identity_ok=identity,
            limits_in_force=limits,
            mounts=mountinfo,
            net_links=links,
            namespaces=procfs.namespaces(pid),
            oom_kills=oom,
            pids=pids,
            extra={
                "pids_max_hits": pids_max_hits,
                "host_namespaces": procfs.namespaces("self"),
                "cgroup_version": self.driver.version,
                "cgroups": dirs,
                "profile": self.config.profile,
                "uid_map": uid_map,
                "memory_mib": memory_mib,
            },
        )


async def _drain(stream: trio.abc.ReceiveStream | None, buf: bytearray) -> None:
    """Read `stream` to its end, keeping at most checker_exec.OUTPUT_LIMIT bytes of it."""
    limit = checker_exec.OUTPUT_LIMIT
    if stream is None:
        return
    while chunk := await stream.receive_some(65536):
        if len(buf) < limit:
            buf += chunk[: limit - len(buf)]


async def _end_group(proc: trio.Process) -> None:
    """Kill the command's process group, wait for it (shielded, at most 5 s), close its pipes."""
    kill_group(proc.pid)
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        await proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()


def _screenshot(
    handle: SlotHandle, spec: protocol.ShotSpec, header: dict[str, Any], data: bytes
) -> Screenshot:
    if header.get("content_type", "image/png") != spec.content_type:
        # An agent restored from a checkpoint older than screenshot formats answers PNG.
        raise RuntimeError_(
            "runtime_error",
            f"slot {handle.slot_id}: its guest agent answered {header.get('content_type')} "
            f"for {spec.format}; the checkpoint predates screenshot formats (rebuild it)",
            slot=handle.slot_id,
        )
    return Screenshot(
        data,
        spec.content_type,
        int(header.get("width") or 0),
        int(header.get("height") or 0),
        bool(header.get("cached")),
        float(header.get("grab_s") or 0.0),
        float(header.get("encode_s") or 0.0),
    )
