"""Warm spares on real desktops, through the API of a real daemon (Linux runtime, base image).

A claimed spare is pristine (its screen equals the checkpoint's, its upper layer passes the
state_hash gate), takes input and passes every gate; a branch served partly from spares and
partly by restores gives identical children; the spares of a deleted checkpoint leave no process,
mount, cgroup or directory behind; with spares disabled, create and reset take the restore path
and still work. DRUMS_LIVE=1 (root, CRIU, the base image).
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import poll
from live_daemon import Daemon, http_client, mounts_under, start_live_daemon, stop_and_clean

PER_CHECKPOINT = 2


def _start(name: str, **overrides: Any) -> tuple[Daemon, Path, Path]:
    # state_dir on /run (tmpfs, as in production) so the test can look at instance dirs.
    state = Path(f"/run/drums-spares-{name}-{os.getpid()}")
    state.mkdir(mode=0o755, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"drums-spares-{name}-"))
    daemon = start_live_daemon(tmp, image="base", state_dir=str(state), **overrides)
    return daemon, state, tmp


@pytest.fixture(scope="module")
def warm() -> Iterator[tuple[Daemon, Path]]:
    daemon, state, tmp = _start(
        "warm",
        spares={"enabled": True, "per_checkpoint": PER_CHECKPOINT, "per_host": 4},
        ksm={"enabled": True},
    )
    try:
        yield daemon, state
    finally:
        stop_and_clean(daemon, state, tmp)


@pytest.fixture(scope="module")
def cold() -> Iterator[tuple[Daemon, Path]]:
    daemon, state, tmp = _start("cold", spares={"enabled": False})
    try:
        yield daemon, state
    finally:
        stop_and_clean(daemon, state, tmp)


# --- helpers -------------------------------------------------------------------------------------


def _template(http: httpx.Client) -> str:
    cps = http.get("/v1/checkpoints").json()["checkpoints"]
    return next(cp["id"] for cp in cps if cp["kind"] == "template")


def _pools(http: httpx.Client) -> dict[str, Any]:
    return http.get("/v1/health").json()["pools"]["spares"]


def _pool(http: httpx.Client, cid: str) -> dict[str, Any]:
    return _pools(http)["checkpoints"].get(cid, {"size": 0, "hits": 0, "misses": 0})


def _wait_pool_full(http: httpx.Client, cid: str, n: int = PER_CHECKPOINT) -> dict[str, Any]:
    return poll(f"{n} spares of {cid}", lambda: (p := _pool(http, cid))["size"] >= n and p, 60)


def _digest(png: bytes) -> str:
    """A digest of the pixels (encoders may differ in bytes for equal pixels)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    try:
        from PIL import Image

        return hashlib.sha256(Image.open(io.BytesIO(png)).convert("RGB").tobytes()).hexdigest()
    except ImportError:
        return hashlib.sha256(png).hexdigest()


def _screen(http: httpx.Client, sid: str) -> str:
    r = http.get(f"/v1/slots/{sid}/screenshot")
    assert r.status_code == 200, r.text
    return _digest(r.content)


def _step(http: httpx.Client, sid: str, action: dict[str, Any]) -> None:
    r = http.post(f"/v1/slots/{sid}/step", json={"action": action})
    assert r.status_code == 200, r.text


def _type_into_xterm(http: httpx.Client, sid: str, text: str) -> None:
    _step(http, sid, {"type": "click", "x": 300, "y": 200})  # focus the xterm (+40+40)
    _step(http, sid, {"type": "type", "text": text})
    _step(http, sid, {"type": "key", "key": "enter"})


def _screen_changes(http: httpx.Client, sid: str, before: str) -> str:
    return poll(f"slot {sid}: screen changes", lambda: (s := _screen(http, sid)) != before and s)


def _valid(http: httpx.Client, sid: str) -> dict[str, Any]:
    """The gate report once judged (alive_after_resume waits a moment): every gate passed."""
    report = poll(
        f"slot {sid}: gates judged",
        lambda: (g := http.get(f"/v1/slots/{sid}/gates").json())["valid"] is not None and g,
    )
    assert report["valid"] is True, report["failed"]
    assert {g["name"]: g["status"] for g in report["gates"]}["state_hash"] == "pass"
    return report


def _create(http: httpx.Client, **body: Any) -> str:
    r = http.post("/v1/slots", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _owned(state: Path, owner: str) -> dict[str, dict[str, Any]]:
    """Instance dirs whose owner.json names `owner`: iid -> record."""
    out = {}
    for d in (state / "slots").iterdir():
        try:
            rec = json.loads((d / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if rec.get("owner") == owner:
            out[d.name] = rec
    return out


def _traces(state: Path, iid: str, init: tuple[int, int] | None) -> list[str]:
    """What is left on the host of instance `iid`: its dir, mounts, cgroups, init process."""
    left = []
    d = state / "slots" / iid
    if d.exists():
        left.append(f"dir {d}")
    left += [f"mount {m}" for m in mounts_under(d)]
    left += [f"cgroup {c}" for c in glob.glob(f"/sys/fs/cgroup/*/**/{iid}", recursive=True)]
    if init is not None:
        pid, start = init
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[19] == str(start):
                left.append(f"process {pid}")
        except OSError:
            pass
    return left


def _instance_of(state: Path, sid: str) -> str:
    found = _owned(state, f"slot:{sid}")
    assert len(found) == 1, found
    return next(iter(found))


# --- tests ---------------------------------------------------------------------------------------


def test_claimed_spare_is_pristine_takes_input_and_passes_gates(warm) -> None:
    daemon, state = warm
    with http_client(daemon) as http:
        cid = _template(http)
        before = _wait_pool_full(http, cid)
        health = http.get("/v1/health").json()
        assert health["ksm"]["enabled"] is True and "saved_bytes" in health["ksm"], health["ksm"]

        sid = _create(http)
        assert _pool(http, cid)["hits"] == before["hits"] + 1
        assert _instance_of(state, sid).startswith("spare-")  # the thawed spare now serves it
        original = _screen(http, sid)
        _valid(http, sid)

        _type_into_xterm(http, sid, "echo typed-into-a-spare")
        _screen_changes(http, sid, original)

        # Reset through a spare: a different pristine tree with the checkpoint's screen.
        _wait_pool_full(http, cid)
        hits = _pool(http, cid)["hits"]
        r = http.post(f"/v1/slots/{sid}/reset", json={})
        assert r.status_code == 200, r.text
        assert _pool(http, cid)["hits"] == hits + 1
        assert _screen(http, sid) == original
        _valid(http, sid)

        pools = _pools(http)
        assert pools["checkpoints"][cid]["claim_p50_s"] is not None
        metrics = http.get("/v1/metrics").json()
        assert metrics["latencies"]["spare_claim"]["count"] >= 2
        assert metrics["counters"]["spare_hits"] >= 2
        http.delete(f"/v1/slots/{sid}")


def test_branch_from_spares_and_restores_alike_and_deleted_checkpoint_leaves_nothing(
    warm,
) -> None:
    daemon, state = warm
    with http_client(daemon) as http:
        src = _create(http)
        pristine = _screen(http, src)
        _type_into_xterm(http, src, "echo prefork-state")
        _screen_changes(http, src, pristine)
        r = http.post(f"/v1/slots/{src}/prefork", json={})
        assert r.status_code in (200, 201), r.text
        pf = r.json()["id"]
        screen_at_prefork = _screen(http, src)
        before = _wait_pool_full(http, pf)

        # 4 children, 2 spares: two are thaws, two take the restore path; all the same state.
        r = http.post(f"/v1/slots/{src}/fork", json={"n": 4, "prefork": pf})
        assert r.status_code in (200, 201), r.text
        children = [c["id"] for c in r.json()["children"]]
        after = _pool(http, pf)
        assert after["hits"] - before["hits"] == PER_CHECKPOINT, after
        assert after["misses"] - before["misses"] == 4 - PER_CHECKPOINT, after
        for child in children:
            assert _screen(http, child) == screen_at_prefork
            _valid(http, child)
        for child in children:
            http.delete(f"/v1/slots/{child}")

        # The pool refills; deleting the checkpoint kills its spares and leaves nothing.
        _wait_pool_full(http, pf)
        spares = _owned(state, f"spare:{pf}")
        assert len(spares) >= PER_CHECKPOINT, spares
        inits = {iid: tuple(rec["init"]) if "init" in rec else None for iid, rec in spares.items()}
        assert all(inits.values()), inits  # else the process check below would prove nothing
        assert all(_traces(state, iid, inits[iid]) for iid in spares)  # they exist before
        r = http.delete(f"/v1/checkpoints/{pf}")
        assert r.status_code == 200, r.text
        poll(
            f"spares of deleted {pf} gone",
            lambda: (
                not any(_traces(state, iid, inits[iid]) for iid in spares)
                and not _owned(state, f"spare:{pf}")
            ),
            limit_s=20,
        )
        assert pf not in _pools(http)["checkpoints"]

        # A destroyed slot served by a claimed spare leaves nothing either.
        iid = _instance_of(state, src)
        init = json.loads((state / "slots" / iid / "owner.json").read_text()).get("init")
        http.delete(f"/v1/slots/{src}")
        poll(f"slot {src} gone", lambda: not _traces(state, iid, tuple(init) if init else None))


def test_without_spares_reset_takes_the_restore_path_and_works(cold) -> None:
    daemon, state = cold
    with http_client(daemon) as http:
        pools = _pools(http)
        assert pools["enabled"] is False and pools["checkpoints"] == {}
        sid = _create(http)
        assert not _instance_of(state, sid).startswith("spare-")  # restored on demand
        original = _screen(http, sid)
        _valid(http, sid)
        _type_into_xterm(http, sid, "echo no-spares-here")
        _screen_changes(http, sid, original)
        r = http.post(f"/v1/slots/{sid}/reset", json={})
        assert r.status_code == 200, r.text
        assert not _instance_of(state, sid).startswith("spare-")
        assert _screen(http, sid) == original
        _valid(http, sid)
        assert not _owned(state, f"spare:{_template(http)}")
        http.delete(f"/v1/slots/{sid}")


def test_killed_parked_spares_are_skipped_and_leave_nothing(warm) -> None:
    daemon, state = warm
    with http_client(daemon) as http:
        cid = _template(http)
        _wait_pool_full(http, cid)
        parked = _owned(state, f"spare:{cid}")
        inits = {iid: tuple(rec["init"]) for iid, rec in parked.items()}
        assert len(inits) >= PER_CHECKPOINT, parked
        for pid, _ in inits.values():
            os.kill(pid, 9)  # frozen: the kill lands when a claim thaws it
        before = _pool(http, cid)
        started = time.monotonic()
        sid = _create(http)
        assert time.monotonic() - started < 15, "dead spares must be skipped, not waited for"
        after = _pool(http, cid)
        # Each dead spare is dropped without a thaw; the create falls back to a restore.
        assert (after["hits"], after["misses"]) == (before["hits"], before["misses"] + 1)
        _valid(http, sid)
        # The dead spares carried the slot's name until disposed of (in the background).
        served_by = poll(
            f"slot {sid}: one instance",
            lambda: len(o := _owned(state, f"slot:{sid}")) == 1 and next(iter(o)),
        )
        assert served_by not in inits
        # Each dead spare is named in the daemon's log, with why it was passed over.
        dead = {
            line.split(" iid=")[1].split()[0]
            for line in daemon.log().splitlines()
            if line.startswith("drums.runtime spare_dead ") and f" slot={sid} " in line
        }
        assert dead == set(inits), (dead, set(inits))
        poll(
            "killed spares gone",
            lambda: not any(_traces(state, iid, inits[iid]) for iid in inits),
            limit_s=20,
        )
        http.delete(f"/v1/slots/{sid}")
