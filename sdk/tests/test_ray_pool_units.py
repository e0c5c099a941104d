"""drums.ray's pure parts: placement by free capacity, the node registry and lease files, and
the `drums pool join` command line, one host agent over a fake client (no Ray cluster
needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray")

from drums.ray._cli import desktops_admitted, main, ray_start_argv
from drums.ray._placement import HostSlot, choose_host, ghost_changes, hosts_from_nodes
from drums.ray._registry import (
    HostEntry,
    clear_tombstone,
    held_env_ids,
    orphaned_leases,
    read_host,
    tombstones,
    write_host,
    write_lease,
    write_tombstone,
)


def node(node_id: str, label: str, desktops: float, alive: bool = True) -> dict:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "Resources": {"CPU": 1.0, "drums_desktops": desktops, "drums_host": 1.0},
        "Labels": {"drums-host": label},
    }


def test_hosts_from_ray_nodes_skip_dead_and_non_drums_nodes() -> None:
    nodes = [
        node("n1", "h1", 6),
        node("n2", "h2", 4, alive=False),
        {"NodeID": "n3", "Alive": True, "Resources": {"CPU": 2.0}, "Labels": {}},
    ]
    hosts = hosts_from_nodes(nodes, {"n1": {"drums_desktops": 2.0}})
    assert hosts == [HostSlot("n1", "h1", 6, 2)]


def test_ghost_seats_follow_the_daemons_slots_no_pool_env_holds() -> None:
    """Slots made outside the pool get a seat once seen outside every lease on two sweeps in
    a row (a pool env between its create and its lease write is not counted twice); the
    gateway's own creates at once; a destroyed or now-held slot gives its seat back."""
    live, held = {"s-1", "s-2", "s-3"}, {"s-1"}
    assert ghost_changes(live, held, set(), set()) == (set(), set())  # first sight: wait
    add, remove = ghost_changes(live, held, {"s-2", "s-3"}, set())
    assert (add, remove) == ({"s-2", "s-3"}, set())
    assert ghost_changes(live, held, set(), set(), known={"s-3"}) == ({"s-3"}, set())
    # s-2 destroyed directly on its host, s-3 now in a lease: both seats go.
    assert ghost_changes({"s-1", "s-3"}, {"s-1", "s-3"}, {"s-3"}, {"s-2", "s-3"}) == (
        set(),
        {"s-2", "s-3"},
    )


def test_leases_of_live_processes_are_held_and_tombstones_persist(tmp_path: Path) -> None:
    write_lease("h1", ["s-1", "s-2"], tmp_path)
    dead = tmp_path / "h1.leases" / "999999999-1.json"
    dead.write_text(json.dumps(["s-9"]))
    assert held_env_ids("h1", tmp_path) == {"s-1", "s-2"}
    assert tombstones("h1", tmp_path) == []
    write_tombstone("h1", "s-7", tmp_path)
    write_tombstone("h1", "s-7", tmp_path)
    assert tombstones("h1", tmp_path) == ["s-7"] and tombstones("h2", tmp_path) == []
    clear_tombstone("h1", "s-7", tmp_path)
    assert tombstones("h1", tmp_path) == []


def test_placement_fills_the_freest_host_not_the_first() -> None:
    hosts = [HostSlot("a", "h1", 6, 6), HostSlot("b", "h2", 4, 4), HostSlot("c", "h3", 4, 4)]
    placed: dict[str, int] = {}
    for _ in range(12):
        host = choose_host(hosts, pending=placed)
        assert host is not None
        placed[host.node_id] = placed.get(host.node_id, 0) + 1
    assert placed == {"a": 6, "b": 3, "c": 3}
    assert choose_host(hosts, pending={"a": 6, "b": 4, "c": 4}) is None


def test_placement_skips_down_hosts_and_needs_room_for_a_fork() -> None:
    hosts = [HostSlot("a", "h1", 6, 6), HostSlot("b", "h2", 4, 3)]
    assert choose_host(hosts, down=["h1"]).label == "h2"  # type: ignore[union-attr]
    assert choose_host(hosts, down=["h1"], need=4) is None


def test_registry_round_trip_and_a_missing_host_says_how_to_join(tmp_path: Path) -> None:
    write_host(HostEntry("h1", "http://127.0.0.1:7071", "/etc/drums/token"), tmp_path)
    assert read_host("h1", tmp_path) == HostEntry("h1", "http://127.0.0.1:7071", "/etc/drums/token")
    with pytest.raises(LookupError, match="drums pool join --node-label h9"):
        read_host("h9", tmp_path)


def test_leases_of_dead_processes_are_orphaned_and_live_ones_are_not(tmp_path: Path) -> None:
    write_lease("h1", ["slot-mine"], tmp_path)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from drums.ray._registry import write_lease;"
            " write_lease('h1', ['slot-a', 'slot-b'], Path(sys.argv[1]))",
            str(tmp_path),
        ],
        check=True,
    )
    assert child.returncode == 0
    orphans = orphaned_leases("h1", tmp_path)
    assert list(orphans.values()) == [["slot-a", "slot-b"]]
    assert all(not p.name.startswith(f"{os.getpid()}-") for p in orphans)
    write_lease("h1", [], tmp_path)  # nothing held: the lease goes
    assert not any(p.name.startswith(f"{os.getpid()}-") for p in (tmp_path / "h1.leases").iterdir())


def test_join_capacity_is_what_stays_above_the_floor_per_slot() -> None:
    assert desktops_admitted(20_000, 500, 4096) == 31
    assert desktops_admitted(20_000, None, 4096) == 15  # no slot measured: env_mib fallback
    assert desktops_admitted(3_000, 500, 4096) == 0
    assert desktops_admitted(None, 500, 4096) == 0


def test_join_runs_ray_start_with_the_resources_and_the_label() -> None:
    argv = ray_start_argv("10.0.0.1:6379", "gpu-box-3", 12, True, ["--num-cpus=0"])
    assert argv == [
        "ray",
        "start",
        "--address=10.0.0.1:6379",
        '--resources={"drums_host": 1, "drums_desktops": 12}',
        "--labels=drums-host=gpu-box-3",
        "--block",
        "--num-cpus=0",
    ]


def test_join_without_a_daemon_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["pool", "join", "--address", "127.0.0.1:1", "--drumsd-url", "http://127.0.0.1:9"])
    assert code == 1
    assert "did not answer" in capsys.readouterr().err


# ---------------------------------------------------------------- the gateway's pure parts

from drums.ray._gateway import (  # noqa: E402
    ID_KEYS,
    Gateway,
    merge_health,
    merge_prometheus,
    split_path,
    tag_ids,
    untag_ids,
)


def test_ids_carry_their_host_both_ways() -> None:
    answer = {"id": "s-0a1b", "state": "ready", "checkpoint": "tpl-base-abc", "task": "e0df"}
    tagged = tag_ids(answer, "h1")
    assert tagged == {
        "id": "h1~s-0a1b",
        "state": "ready",
        "checkpoint": "h1~tpl-base-abc",
        "task": "e0df",
    }
    assert untag_ids({"prefork": "h1~pf-77"}, ["h1", "h2"]) == ({"prefork": "pf-77"}, "h1")
    assert untag_ids({"note": "h9~s-1"}, ["h1"]) == ({"note": "h9~s-1"}, None)
    assert split_path("/v1/slots/h2~s-9/step") == ("h2", "/v1/slots/s-9/step")
    assert split_path("/v1/checkpoints/h1~st-3") == ("h1", "/v1/checkpoints/st-3")
    assert split_path("/v1/slots") == (None, "/v1/slots")


def test_id_shaped_user_data_passes_through_the_gateway_unchanged() -> None:
    """Only the API's id fields carry a host: a command's stdout, a label, an inline task's
    text or a file's content that happens to look like an id is the user's, both ways."""
    step = {
        "slot": "s-0a1b",
        "output": {"stdout": "s-abc\n", "stderr": "st-1", "returncode": 0},
        "terminal": {"slot": "s-0a1b", "text": "pf-2 tpl-x", "source": "xterm"},
        "labels": {"id": "s-abc", "run": "st-9"},
    }
    tagged = tag_ids(step, "h1")
    assert tagged["slot"] == "h1~s-0a1b" and tagged["terminal"]["slot"] == "h1~s-0a1b"
    assert tagged["output"] == step["output"]
    assert tagged["terminal"]["text"] == "pf-2 tpl-x"
    assert tagged["labels"] == step["labels"]
    create = {
        "from_state": "h1~st-5",
        "labels": {"note": "h1~s-abc"},
        "task": {"id": "h1~s-abc", "instruction": "type h1~s-abc", "config": []},
    }
    body, host = untag_ids(create, ["h1"])
    assert host == "h1" and body["from_state"] == "st-5"
    assert body["labels"] == create["labels"] and body["task"] == create["task"]
    action = {"action": {"type": "type", "text": "h1~s-abc"}}
    assert untag_ids(action, ["h1"]) == (action, None)
    branch = {"parent": "s-1", "checkpoint": "pf-2", "children": [{"id": "s-3", "parent": "s-1"}]}
    assert tag_ids(branch, "h2") == {
        "parent": "h2~s-1",
        "checkpoint": "h2~pf-2",
        "children": [{"id": "h2~s-3", "parent": "h2~s-1"}],
    }


def test_the_gateways_id_fields_are_fields_of_the_api() -> None:
    """ID_KEYS names fields drums.models or the console rows really have, so a renamed API
    field cannot leave the gateway rewriting a key nothing sends."""
    from pydantic import BaseModel

    from drums import models

    fields = {
        name
        for model in vars(models).values()
        if isinstance(model, type) and issubclass(model, BaseModel)
        for name in model.model_fields
    }
    # Fields of answers that are not pydantic models: console rows, a branch's lists, the
    # daemon's reconcile and archive summaries.
    outside_models = {"template", "members", "destroyed", "adopted", "swept", "slots"}
    assert ID_KEYS - fields <= outside_models
    assert {"id", "checkpoint", "parent", "children", "from_state", "prefork"} <= ID_KEYS


def test_health_and_prometheus_aggregate_and_name_the_dead_host() -> None:
    up = {
        "status": "ok",
        "version": "0.1.0",
        "profile": "hardened",
        "slots_by_state": {"ready": 2},
        "checkpoints": [{"id": "tpl-base-1"}],
        "admission": {"admitting": True},
        "warnings": [],
    }
    merged = merge_health({"h1": up, "h2": up, "h3": {"error": {"code": "host_down"}}})
    assert merged["admission"]["mem_available_mib"] is None  # no host said
    up = {
        **up,
        "admission": {"admitting": True, "mem_available_mib": 1000, "slot_cost_mib": 90},
        "ksm": {"enabled": True, "saved_mib": 10, "pages": {"shared": 2}},
        "pools": {"spares": {"parked": 2}},
        "crash_watch": {"ok": True},
    }
    dearer = {
        **up,
        "admission": {"admitting": False, "mem_available_mib": 500, "slot_cost_mib": 120},
    }
    pool = merge_health({"h1": up, "h2": dearer})
    assert pool["admission"]["admitting"] is True
    assert pool["admission"]["mem_available_mib"] == 1500
    assert pool["admission"]["slot_cost_mib"] == 120
    assert pool["ksm"] == {"enabled": True, "saved_mib": 20, "pages": {"shared": 4}}
    assert pool["pools"]["spares"] == {"h1": {"parked": 2}, "h2": {"parked": 2}}
    assert pool["crash_watch"] == {"h1": {"ok": True}, "h2": {"ok": True}}
    assert merged["slots_by_state"] == {"ready": 4}
    assert merged["status"] == "degraded" and "h3: host_down" in merged["warnings"]
    assert [c["id"] for c in merged["checkpoints"]] == ["h1~tpl-base-1", "h2~tpl-base-1"]
    text = merge_prometheus(
        {"h1": '# TYPE x gauge\nx 1\ny{a="b"} 2\n', "h2": "# TYPE x gauge\nx 3\n"}
    )
    assert text.splitlines() == [
        "# TYPE x gauge",
        'x{host="h1"} 1',
        'y{host="h1",a="b"} 2',
        'x{host="h2"} 3',
    ]


async def test_gateway_places_by_free_routes_by_id_and_needs_its_token() -> None:
    sent: list = []

    async def forward(label, method, path, query, body):
        sent.append((label, method, path, body))
        if label == "h2" and method == "POST":
            return 503, "application/json", b'{"error": {"code": "host_down"}}'
        return 201, "application/json", b'{"id": "s-1", "state": "ready"}'

    async def hosts(fresh=False):
        return [("h1", 2), ("h2", 5)]

    gw = Gateway("t" * 40, forward, hosts)
    assert (await gw.handle("GET", "/v1/slots", "", "Bearer nope", b""))[0] == 401
    ok = "Bearer " + "t" * 40
    status, _, body = await gw.handle("POST", "/v1/slots", "", ok, b"{}")
    # h2 is freest but its drumsd is down: the create goes to h1, and says so in its id.
    assert status == 201 and b'"h1~s-1"' in body
    assert [s[0] for s in sent] == ["h2", "h1"]
    await gw.handle("POST", "/v1/slots/h1~s-1/step", "", ok, b'{"action": {"type": "done"}}')
    assert sent[-1][:3] == ("h1", "POST", "/v1/slots/s-1/step")
    status, _, body = await gw.handle("GET", "/v1/slots/h7~s-1", "", ok, b"")
    assert status == 503 and b"host_down" in body
    status, _, _ = await gw.handle("POST", "/v1/slots", "", ok, b"{not json")
    assert status == 400


async def test_a_silent_session_loses_its_envs_and_a_renewed_one_keeps_them() -> None:
    """Fate-sharing for gateway clients: envs made under X-Drums-Session go when the session
    is silent for longer than the TTL (its process died); a renew keeps them; a close through
    the gateway takes an env off its session."""
    sent: list = []
    made = iter(range(100))

    async def forward(label, method, path, query, body):
        sent.append((method, path))
        if method == "POST" and path == "/v1/slots":
            return 201, "application/json", json.dumps({"id": f"s-{next(made)}"}).encode()
        if method == "POST" and path.endswith("/fork"):
            kids = [{"id": f"s-{next(made)}"} for _ in range(2)]
            return 201, "application/json", json.dumps({"children": kids}).encode()
        return 200, "application/json", b"{}"

    async def hosts(fresh=False):
        return [("h1", 8)]

    gw = Gateway("t" * 40, forward, hosts, session_ttl_s=10)
    ok = "Bearer " + "t" * 40
    for _ in range(3):
        await gw.handle("POST", "/v1/slots", "", ok, b"{}", session="dead")
    await gw.handle("POST", "/v1/slots/h1~s-0/fork", "", ok, b'{"n": 2}', session="dead")
    await gw.handle("DELETE", "/v1/slots/h1~s-1", "", ok, b"", session="dead")
    await gw.handle("POST", "/v1/slots", "", ok, b"{}", session="alive")
    assert gw.sessions["dead"].envs == {"h1~s-0", "h1~s-2", "h1~s-3", "h1~s-4"}
    status, _, body = await gw.handle("POST", "/v1/sessions/renew", "", ok, b"", session="x")
    assert status == 200 and json.loads(body) == {"session": "x", "ttl_s": 10, "envs": 0}
    assert await gw.reap_sessions() == []  # everyone was heard from just now
    gw.sessions["dead"].last_seen -= 11
    sent.clear()
    assert await gw.reap_sessions() == ["h1~s-0", "h1~s-2", "h1~s-3", "h1~s-4"]
    assert sent == [("DELETE", f"/v1/slots/s-{i}") for i in (0, 2, 3, 4)]
    assert set(gw.sessions) == {"alive", "x"}
    # A request on its way keeps its session, however long it takes.
    gw.sessions["alive"].busy, gw.sessions["alive"].last_seen = 1, -1e9
    assert await gw.reap_sessions() == [] and "alive" in gw.sessions
    # The session header on a wrong token changes nothing.
    await gw.handle("POST", "/v1/slots", "", "Bearer nope", b"{}", session="intruder")
    assert "intruder" not in gw.sessions


class _FakeEnv:
    def __init__(self, env_id: str, closed: list[str]) -> None:
        self.id = env_id
        self.slot = f"slot {env_id}"
        self._closed = closed

    def observe(self) -> str:
        return f"screen of {self.id}"

    def close(self) -> None:
        self._closed.append(self.id)


class _FakeClient:
    def __init__(self) -> None:
        self.made = 0
        self.closed: list[str] = []

    def create(self, **kwargs: object) -> _FakeEnv:
        self.made += 1
        return _FakeEnv(f"s-{self.made}", self.closed)


def test_one_agent_holds_many_envs_and_its_lease_names_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drums.ray import _actors
    from drums.ray._registry import lease_dir

    monkeypatch.setenv("DRUMS_POOL_DIR", str(tmp_path))
    client = _FakeClient()
    monkeypatch.setattr(_actors, "connect_host", lambda label: client)
    agent = _actors.HostAgent("h1")

    def lease() -> list[str]:
        files = list(lease_dir("h1").glob("*.json"))
        return [] if not files else sorted(json.loads(files[0].read_text()))

    assert agent.create({}) == ("ok", {"id": "s-1", "pid": os.getpid(), "slot": "slot s-1"})
    assert agent.create({})[0] == "ok"
    assert lease() == ["s-1", "s-2"]  # the keeper would destroy both if this process died
    assert agent.call("s-2", "observe", (), {}) == ("ok", "screen of s-2")
    status, fields = agent.call("s-9", "observe", (), {})
    assert status == "err" and fields["code"] == "env_gone" and fields["env_id"] == "s-9"
    assert agent.close("s-1") == ("ok", None) and client.closed == ["s-1"]
    assert lease() == ["s-2"]
    agent.close("s-2")
    assert list(lease_dir("h1").glob("*.json")) == []  # nothing held, no lease left


def _bare_pool(node_id: str = "n1", local_calls: bool = True) -> Any:
    from drums.ray._pool import Pool

    pool = Pool.__new__(Pool)  # no Ray: only what PoolEnv and _direct read
    pool._down, pool._envs, pool.down_ttl_s = {}, {}, 30.0
    pool.local_calls, pool._node_id = local_calls, node_id
    return pool


class _NoAgent:
    """An agent that must not be called: the env is on this process's node."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"agent.{name} called for a local env")


def test_a_local_env_is_called_directly_and_fails_as_through_its_agent() -> None:
    from drums import ConnectionFailed, EnvGone
    from drums.ray._pool import HostDown, PoolEnv

    class Direct:
        def step(self, action: Any, *, screenshot: bool = False) -> Any:
            return ("stepped", action, screenshot)

        def observe(self) -> Any:
            raise ConnectionFailed("GET /v1/slots/s-1/screenshot: cannot reach drumsd")

        def gates(self) -> Any:
            raise EnvGone("env s-1 is gone", env_id="s-1")

    pool = _bare_pool()
    env = PoolEnv(pool, _NoAgent(), "s-1", HostSlot("n1", "h1", 2, 1), None, Direct())
    assert env.step("x", screenshot=True) == ("stepped", "x", True)
    with pytest.raises(EnvGone):
        env.gates()
    assert pool._down_now() == []
    with pytest.raises(HostDown) as caught:
        env.observe()
    assert caught.value.code == "host_down" and caught.value.detail["host"] == "h1"
    assert pool._down_now() == ["h1"]  # new creates skip it, as when the agent says so


def test_only_an_env_on_this_node_gets_a_direct_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drums import models as m
    from drums.ray import _pool

    monkeypatch.setenv("DRUMS_POOL_DIR", str(tmp_path))
    monkeypatch.setattr(_pool, "_LOCAL", {})
    (tmp_path / "token").write_text("t" * 40)
    write_host(HostEntry("h1", "http://127.0.0.1:9", str(tmp_path / "token")), tmp_path)
    slot = m.Slot.model_validate(
        {"id": "s-1", "state": "ready", "checkpoint": "base", "created_at": 0.0,
         "last_used_at": 0.0, "idle_timeout_s": 900.0}
    )  # fmt: skip
    here, there = HostSlot("n1", "h1", 2, 1), HostSlot("n2", "h2", 2, 1)
    direct = _bare_pool()._direct(here, slot)
    assert direct is not None and direct.id == "s-1" and not direct.owned
    assert _bare_pool()._direct(there, slot) is None
    assert _bare_pool(local_calls=False)._direct(here, slot) is None
    # A host of this node that this process cannot reach (not registered here): the agent.
    assert _bare_pool()._direct(HostSlot("n1", "h9", 2, 1), slot) is None


def test_the_async_pool_env_runs_each_call_in_a_thread() -> None:
    import threading

    import anyio

    from drums.ray._async import AsyncPoolEnv

    main = threading.get_ident()

    class Env:
        id, host, closed = "s-1", "h1", False

        def step(self, action: Any, *, screenshot: bool = False) -> Any:
            return (action, screenshot, threading.get_ident() != main)

        def close(self) -> None:
            self.closed = True

    async def run() -> Any:
        async with AsyncPoolEnv(Env()) as env:  # type: ignore[arg-type]
            return await env.step("x", screenshot=True), env.env

    stepped, inner = anyio.run(run)
    assert stepped == ("x", True, True) and inner.closed


def test_a_pool_save_is_lease_bound_unless_keep_false() -> None:
    """As Env.save() and the MCP server's save: a state outlives the pool (its lease bounds it);
    keep=False makes the pool delete it when it closes."""
    from drums.ray._pool import PoolEnv

    class Direct:
        def save(self, **kwargs: Any) -> Any:
            assert kwargs["keep"] is True  # the host keeps it; the pool decides its end
            saved.append(f"c-{len(saved)}")
            return SimpleNamespace(id=saved[-1])

    saved: list[str] = []
    pool = _bare_pool()
    pool._state_hosts, pool._owned_states = {}, {}
    env = PoolEnv(pool, _NoAgent(), "s-1", HostSlot("n1", "h1", 2, 1), None, Direct())
    kept = env.save()
    owned = env.save(keep=False)
    assert kept.id not in pool._owned_states
    assert pool._owned_states == {owned.id: "h1"}
    assert pool._state_hosts == {kept.id: "h1", owned.id: "h1"}
