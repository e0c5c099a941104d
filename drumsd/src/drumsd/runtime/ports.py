"""Slot numbers and host port forwarding: each live slot holds a number of `slot_range`, and with
`port_base` set its guest ports are served on the host's loopback (docs/runtime.md, "Ports").

A connection to a forwarded port is relayed to the same port on the slot's own loopback, in the
namespace of whatever tree serves the slot at that moment (a reset swaps it); the listeners close
when the slot stops being live.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from drumsd.core.errors import DrumsdError
from drumsd.core.records import SlotRecord, is_live
from drumsd.core.seams import GuestStream, RuntimeError_
from drumsd.core.slot_numbers import forwarded_ports, free_numbers
from drumsd.linux import host_ports
from drumsd.runtime.handles import handle_from_json

if TYPE_CHECKING:
    import socket

    from drumsd.core.config import Config
    from drumsd.core.seams import SlotRuntime

log = logging.getLogger("drumsd.ports")

RELAY_CHUNK = 65536


class PortsHost(Protocol):
    """What the port forwards use of the supervisor: the slots, the config, the runtime that
    opens a stream into a slot, and its nursery for the relays."""

    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    @property
    def config(self) -> Config: ...
    @property
    def runtime(self) -> SlotRuntime: ...
    @property
    def nursery(self) -> trio.Nursery | None: ...
    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None: ...


class PortForwards:
    def __init__(self, sup: PortsHost) -> None:
        self.sup = sup
        self._reserved: set[int] = set()  # numbers being tried (between choice and bind)
        self._held: dict[str, int] = {}  # slot -> number, from assign until it is not live
        self._scopes: dict[str, trio.CancelScope] = {}
        self.relayed = 0  # connections relayed into slots, for tests and health

    def _taken(self, rec_id: str) -> set[int]:
        held = {
            r.number
            for r in self.sup.slots.values()
            if r.id != rec_id and r.number is not None and is_live(r)
        }
        return held | self._reserved | {n for sid, n in self._held.items() if sid != rec_id}

    async def assign(self, rec: SlotRecord) -> None:
        """Give a new slot its number and, with forwarding on, listeners on its host ports (the
        first number whose ports are free on this host: another daemon may hold some). Raises
        `overloaded` when no number is left."""
        cfg = self.sup.config
        low, high = cfg.slot_range
        skipped: list[str] = []
        for number in free_numbers(self._taken(rec.id), low, high):
            ports = forwarded_ports(number, cfg.port_base, cfg.guest_port, cfg.extra_ports)
            self._reserved.add(number)
            try:
                socks = await trio.to_thread.run_sync(host_ports.listen_loopback, ports.values())
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                skipped.append(str(exc))
                continue
            finally:
                self._reserved.discard(number)
            rec.number, rec.ports = number, ports
            self._held[rec.id] = number
            if skipped:
                log.info(
                    "slot=%s number %d; skipped numbers whose ports are busy: %s",
                    rec.id,
                    number,
                    "; ".join(skipped[:4]),
                )
            self._serve(rec.id, ports, socks)
            return
        raise DrumsdError(
            "overloaded",
            f"no slot number of slot_range [{low}, {high}] is free"
            + (f" (host ports busy: {'; '.join(skipped[:4])})" if skipped else "")
            + "; destroy slots, widen slot_range or move port_base",
            retry_after_s=5.0,
        )

    async def reopen(self) -> None:
        """After a restart: listen again for the live slots a previous daemon left (their
        numbers are in the journal). A port taken meanwhile is logged and not forwarded."""
        for rec in list(self.sup.slots.values()):
            if not is_live(rec) or rec.id in self._scopes or not rec.ports:
                continue
            try:
                socks = await trio.to_thread.run_sync(
                    host_ports.listen_loopback, rec.ports.values()
                )
            except OSError as exc:
                log.error(
                    "slot=%s ports %s not forwarded after restart: %s", rec.id, rec.ports, exc
                )
                continue
            self._serve(rec.id, rec.ports, socks)

    def saved(self, rec: SlotRecord) -> None:
        """Every slot save: a slot no longer live closes its listeners."""
        if not is_live(rec):
            self._held.pop(rec.id, None)
            scope = self._scopes.pop(rec.id, None)
            if scope is not None:
                scope.cancel()

    def _serve(self, slot_id: str, ports: dict[int, int], socks: list[socket.socket]) -> None:
        if not socks or self.sup.nursery is None:
            for sock in socks:
                sock.close()
            return
        scope = trio.CancelScope()
        self._scopes[slot_id] = scope
        # listen_loopback returns the sockets in the order of the ports it was given
        pairs = [
            (trio.SocketListener(trio.socket.from_stdlib_socket(sock)), guest)
            for sock, guest in zip(socks, ports.keys(), strict=True)
        ]
        self.sup.spawn(self._run, slot_id, scope, pairs)

    async def _run(
        self,
        slot_id: str,
        scope: trio.CancelScope,
        pairs: list[tuple[trio.SocketListener, int]],
    ) -> None:
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    for listener, guest_port in pairs:
                        nursery.start_soon(self._accept, slot_id, listener, guest_port)
        finally:
            with trio.CancelScope(shield=True):
                for listener, _ in pairs:
                    await listener.aclose()

    async def _accept(self, slot_id: str, listener: trio.SocketListener, guest_port: int) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                client = await listener.accept()
                nursery.start_soon(self._relay, slot_id, client, guest_port)

    async def _relay(self, slot_id: str, client: trio.SocketStream, guest_port: int) -> None:
        # One connection's failure ends that connection only, never the slot's listeners.
        try:
            await self._relay_one(slot_id, client, guest_port)
        except Exception:
            log.exception("slot=%s relay to guest port %d failed", slot_id, guest_port)

    async def _relay_one(self, slot_id: str, client: trio.SocketStream, guest_port: int) -> None:
        async with client:
            rec = self.sup.slots.get(slot_id)
            if rec is None or rec.handle is None or not is_live(rec):
                return  # not restored yet, or going: the client sees the connection close
            try:
                guest = await self.sup.runtime.connect_guest(
                    handle_from_json(rec.handle), guest_port
                )
            except (OSError, RuntimeError_) as exc:
                log.info("slot=%s guest port %d not reachable: %s", slot_id, guest_port, exc)
                return
            self.relayed += 1
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, guest, nursery.cancel_scope)
                    nursery.start_soon(_pump, guest, client, nursery.cancel_scope)
            finally:
                with trio.CancelScope(shield=True):
                    await guest.aclose()


async def _pump(src: GuestStream, dst: GuestStream, done: trio.CancelScope) -> None:
    """Copy one direction; when it ends (EOF or a broken side) pass the half-close on, or end
    both directions when the other side cannot take one."""
    try:
        while chunk := await src.receive_some(RELAY_CHUNK):
            await dst.send_all(chunk)
        send_eof = getattr(dst, "send_eof", None)
        if send_eof is None:
            done.cancel()
        else:
            await send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        done.cancel()
