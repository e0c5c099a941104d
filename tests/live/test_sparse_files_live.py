"""Sparse files in a slot cost what they hold (issue 39, D3).

A free `truncate -s 16G ~/sparse.bin` made a save take 19 s (1.3 s without it) and a create from
that state 46 s, the state said size_mib 16472, and with 8 TiB the save never ended, held the slot
lock for good and health said ok. Here a slot makes a 16 GiB and an 8 TiB sparse file with data at
a few offsets; its save and a create from the state must take about what a save and a create of
the same desktop without them take (same run), the state's size_mib must stay small, the restored
files must have the same apparent sizes and the same bytes where they hold data, the episode must
be valid (state_hash included), and destroy and health must be prompt and clean.
DRUMS_LIVE=1 (root, CRIU, the base image).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import create, destroy, execute, settled_gates, shared_daemon
from live_daemon import http_client, require_live

GIB, TIB = 1 << 30, 1 << 40
# path in the home dir -> (apparent size, {offset: bytes written there})
FILES = {
    "sparse16g.bin": (16 * GIB, {0: "head16", 7 * GIB: "middle16", 16 * GIB - 6: "tail16"}),
    "sparse8t.bin": (8 * TIB, {3 * TIB + 12345: "middle8t", 8 * TIB - 5: "end8t"}),
    # /tmp and /dev/shm are tmpfs mounts of the slot's own: CRIU dumps them as tar images
    "/tmp/sparse-tmp.bin": (8 * TIB, {5 * GIB: "tmp8t"}),
    "/dev/shm/sparse-shm.bin": (16 * GIB, {GIB: "shm16g"}),
}
# Generous: the sparse save and create may take this many times the plain ones, plus slack for
# a loaded CI host (today's code took 15x for 16 GiB and never finished for 8 TiB).
RATIO, SLACK_S = 3.0, 5.0

# Runs in the slot: each file's size and a sha256 of its data extents (offset, bytes), so "the
# same bytes where it holds data" is one comparison, without reading a hole.
FACTS = r"""
import hashlib, json, os, sys
out = {}
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    h, pos, real = hashlib.sha256(), 0, os.fstat(fd).st_blocks * 512
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        data = os.pread(fd, end - start, start)
        lead = len(data) - len(data.lstrip(b"\0"))
        if data.strip(b"\0"):
            h.update(str(start + lead).encode() + b":" + data.strip(b"\0"))
        pos = end
    out[path] = {"size": size, "data_sha256": h.hexdigest(), "real": real}
print(json.dumps(out))
"""


def _make_files() -> str:
    lines = []
    for path, (size, pieces) in FILES.items():
        lines.append(f"truncate -s {size} {path}")
        for offset, text in pieces.items():
            lines.append(
                f"printf {text} | dd of={path} bs=1 seek={offset} conv=notrunc status=none"
            )
    return "cd ~ && " + " && ".join(lines)


def _facts(http, slot_id: str) -> dict:
    script = FACTS.strip().replace("'", "'\"'\"'")
    out = execute(http, slot_id, f"cd ~ && python3 -c '{script}' {' '.join(FILES)}")["output"]
    assert out["returncode"] == 0, out
    return json.loads(out["stdout"])


def _timed(fn):
    t0 = time.monotonic()
    result = fn()
    return result, time.monotonic() - t0


def _save(http, slot_id: str, timeout_s: float) -> dict:
    r = http.post(f"/v1/slots/{slot_id}/capture", json={}, timeout=timeout_s)
    assert r.status_code == 201, r.text
    return r.json()


def test_sparse_files_save_restore_and_destroy_as_fast_as_a_plain_slot():
    require_live()
    daemon = shared_daemon("hardened")
    made: list[str] = []
    states: list[str] = []
    with http_client(daemon) as http:
        try:
            source = create(http)["id"]
            made.append(source)
            plain, base_save_s = _timed(lambda: _save(http, source, 120))
            states.append(plain["id"])
            plain_child, base_create_s = _timed(lambda: create(http, from_state=plain["id"]))
            made.append(plain_child["id"])
            save_limit = RATIO * base_save_s + SLACK_S
            create_limit = RATIO * base_create_s + SLACK_S

            out = execute(http, source, _make_files())["output"]
            assert out["returncode"] == 0, out
            before = _facts(http, source)
            for path, (size, _) in FILES.items():
                assert before[path]["size"] == size, before

            # The client gives up at the limit: today's code hashed every hole (never ending
            # for 8 TiB), so the request itself is what fails.
            state, save_s = _timed(lambda: _save(http, source, save_limit))
            states.append(state["id"])
            print(
                f"save: plain {base_save_s:.2f} s, sparse {save_s:.2f} s "
                f"({save_s / base_save_s:.2f}x); size_mib {plain['size_mib']:.1f} -> "
                f"{state['size_mib']:.1f}, apparent_mib {state['apparent_mib']:.0f}"
            )
            assert save_s < save_limit
            assert state["size_mib"] < plain["size_mib"] + 64, state
            in_upper = sum(size for path, (size, _) in FILES.items() if not path.startswith("/"))
            assert state["apparent_mib"] >= in_upper / (1 << 20), state

            r = http.get(f"/v1/checkpoints/{state['id']}")
            assert r.status_code == 200 and r.json()["size_mib"] == state["size_mib"], r.text

            child, create_s = _timed(
                lambda: http.post("/v1/slots", json={"from_state": state["id"]}, timeout=60)
            )
            assert child.status_code == 201, child.text
            child_id = child.json()["id"]
            made.append(child_id)
            print(
                f"create from state: plain {base_create_s:.2f} s, sparse {create_s:.2f} s "
                f"({create_s / base_create_s:.2f}x)"
            )
            assert create_s < create_limit
            report = settled_gates(http, child_id)
            failed = {n: g["evidence"] for n, g in report.items() if g["status"] != "pass"}
            assert not failed, failed

            after = _facts(http, child_id)
            for path in FILES:
                assert after[path]["size"] == before[path]["size"], (path, before, after)
                assert after[path]["data_sha256"] == before[path]["data_sha256"], (path, after)
                assert after[path]["real"] < 64 << 20, (path, after)

            for slot_id in (child_id, source):
                t0 = time.monotonic()
                r = http.delete(f"/v1/slots/{slot_id}", timeout=60)
                assert r.status_code == 200, r.text
                assert time.monotonic() - t0 < 30
            health = http.get("/v1/health").json()
            stuck = [w for w in health["warnings"] if "held the slot" in w or "worker thread" in w]
            assert not stuck, stuck
        finally:
            for slot_id in made:
                destroy(http, slot_id)
            for cp in states:
                http.delete(f"/v1/checkpoints/{cp}")
