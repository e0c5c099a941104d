"""Slot numbers from slot_range and host port forwarding, over the memory runtime (whose slots
share the host's loopback, so a guest port is a local port here) and real sockets."""

from __future__ import annotations

import socket
from functools import partial
from pathlib import Path

import pytest
import trio
from drumsd.core.config import Config
from drumsd.core.slot_numbers import forwarded_ports, free_numbers
from harness import create, error_of, open_api, wait_for
from pydantic import ValidationError

BASE = 41000  # host ports 41000+N; a number whose ports are busy is skipped, so runs can overlap


def test_numbers_and_ports_are_pure_functions_of_the_config() -> None:
    assert list(free_numbers({100, 102}, 100, 104)) == [101, 103, 104]
    assert forwarded_ports(7, None, 5000, {}) == {}
    assert forwarded_ports(7, 17000, 5000, {5900: 27000}) == {5000: 17007, 5900: 27007}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"slot_range": [9, 3]}, "slot_range [9, 3] must be [low, high]"),
        ({"port_base": 64000}, "host ports 64100-66000, outside 1-65535"),
        ({"port_base": 17000, "extra_ports": {"5900": 18000}}, "overlap"),
        ({"extra_ports": {"5900": 30000}}, "extra_ports needs port_base"),
        ({"port_base": 17000, "extra_ports": {"5000": 30000}}, "repeats guest_port 5000"),
        ({"port_base": 17000, "extra_ports": {"vnc": 30000}}, "extra_ports.vnc"),
    ],
)
def test_port_config_mistakes_are_named(raw: dict, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        Config.model_validate({"token_file": "/t", **raw})


async def echo_server(nursery: trio.Nursery) -> int:
    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            async for chunk in stream:
                await stream.send_all(chunk)

    listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


async def round_trip(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        await stream.send_eof()
        got = b""
        with trio.fail_after(5):
            async for chunk in stream:
                got += chunk
    return got


async def refused(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return True
    await stream.aclose()
    return False


async def test_each_slot_gets_a_number_and_its_guest_port_on_the_host(tmp_path: Path) -> None:
    async with trio.open_nursery() as servers:
        guest = await echo_server(servers)
        cfg = {"slot_range": [0, 40], "port_base": BASE, "guest_port": guest}
        async with open_api(tmp_path, **cfg) as api:
            a = await create(api)
            assert a["ports"] == {str(guest): BASE + a["number"]}
            assert await round_trip(BASE + a["number"], b"hello guest") == b"hello guest"
            b = await create(api)
            assert b["number"] > a["number"]

            # a reset keeps the number and the forwarding (to the new tree)
            r = await api.client.post(f"/v1/slots/{a['id']}/reset")
            assert r.json()["number"] == a["number"] and r.json()["ports"] == a["ports"]
            assert await round_trip(BASE + a["number"], b"after reset") == b"after reset"

            # fork children each get their own
            kids = (await api.client.post(f"/v1/slots/{b['id']}/fork", json={"n": 2})).json()
            numbers = {a["number"], b["number"], *(k["number"] for k in kids["children"])}
            assert len(numbers) == 4
            for kid in kids["children"]:
                assert await round_trip(BASE + kid["number"], b"kid") == b"kid"
            assert api.sup.ports.relayed == 4

            # destroy closes the listener and frees the number for the next slot
            gone = a["number"]
            await api.client.delete(f"/v1/slots/{a['id']}")
            await wait_for(lambda: refused(BASE + gone), what=f"port {BASE + gone} closed")
            everything = (await api.client.get("/v1/slots", params={"all": "true"})).json()
            listed = next(x for x in everything["slots"] if x["id"] == a["id"])
            assert listed["number"] is None and listed["ports"] == {}
            c = await create(api)
            assert c["number"] == gone
        servers.cancel_scope.cancel()


async def test_a_number_whose_host_port_is_busy_is_skipped(tmp_path: Path) -> None:
    async with trio.open_nursery() as servers:
        guest = await echo_server(servers)
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken = None
        for n in range(60, 80):  # the first port of this range another program could hold
            try:
                holder.bind(("127.0.0.1", BASE + n))
            except OSError:
                continue
            holder.listen()
            taken = n
            break
        assert taken is not None
        cfg = {"slot_range": [taken, taken + 5], "port_base": BASE, "guest_port": guest}
        async with open_api(tmp_path, **cfg) as api:
            s = await create(api)
            assert s["number"] > taken
            assert await round_trip(BASE + s["number"], b"x") == b"x"
        holder.close()
        servers.cancel_scope.cancel()


async def test_fork_children_get_distinct_numbers_without_forwarding(tmp_path: Path) -> None:
    async with open_api(tmp_path, slot_range=[1, 10]) as api:
        parent = await create(api)
        r = await api.client.post(f"/v1/slots/{parent['id']}/fork", json={"n": 3})
        assert r.status_code == 201, r.text
        numbers = [parent["number"], *(k["number"] for k in r.json()["children"])]
        assert numbers == [1, 2, 3, 4]


async def test_running_out_of_numbers_is_a_clear_429_and_creates_nothing(tmp_path: Path) -> None:
    async with open_api(tmp_path, slot_range=[5, 6]) as api:
        first, second = await create(api), await create(api)
        assert (first["number"], second["number"]) == (5, 6)
        assert first["ports"] == {}  # forwarding is off without port_base
        before = set(api.sup.slots)
        body = error_of(await api.client.post("/v1/slots", json={}), 429, "overloaded")
        assert "no slot number of slot_range [5, 6] is free" in body["message"]
        assert set(api.sup.slots) == before


async def test_forwarded_ports_open_again_after_a_restart(tmp_path: Path) -> None:
    async with trio.open_nursery() as servers:
        guest = await echo_server(servers)
        cfg = {"slot_range": [80, 99], "port_base": BASE, "guest_port": guest}
        opener = open_api(tmp_path, **cfg)
        async with opener as api:
            s = await create(api)
            runtime = api.runtime
        await wait_for(lambda: refused(BASE + s["number"]), what="the port closed with the daemon")
        async with open_api(tmp_path, runtime=runtime, **cfg) as api2:
            assert api2.sup.slots[s["id"]].number == s["number"]
            assert await round_trip(BASE + s["number"], b"back") == b"back"
        servers.cancel_scope.cancel()
