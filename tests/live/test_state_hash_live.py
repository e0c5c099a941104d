"""state_hash on fork children whose desktop changes its files right after the restore.

Seen with Chromium under load: every fork child after the first few failed state_hash with its
own writes (`Web Data`, leveldb logs) reported as a mismatch, because the children's episodes
begin one after another and the gate judged "written by the tree" from the episode start minus
the restore time, not from when each tree's restore began. A removed directory was a mismatch
even without load (its files' parent dir is gone, so nothing dated the removal).

Here a process of the parent's desktop waits until it finds itself in another network
namespace (only a restore does that: the parent keeps its own), then removes a directory with
a file in it, rewrites a file and writes a marker. Every child must start a valid episode, and
the test fails if no child made its change before its gate was read. A change made to the
upper before the restore still fails the gate: test_gates_live.py's tampered-upper test.

A file the desktop maps shared and writable changes with no write(), and on the upper's tmpfs
with no new mtime or ctime once a read fault mapped its page (Chromium's BrowserMetrics file;
it quarantined a valid episode in a bench run): a second process reads its mapping after the
restore, then writes it, and keeps it mapped. Every child must start a valid episode, and at
least one child's state_hash evidence must name the file under `upper_mapped`.
DRUMS_LIVE=1 (root, CRIU, the base image).
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import create, destroy, execute, settled_gates, shared_daemon
from harness import poll
from live_daemon import http_client, require_live

CHILDREN = 4

# Seeds ~/churn, then waits for a restore into a new netns and changes it at once.
CHURN = r"""
mkdir -p ~/churn/sub && echo seeded > ~/churn/sub/f && echo v1 > ~/churn/kept
ns0=$(readlink /proc/self/ns/net)
while [ "$(readlink /proc/self/ns/net)" = "$ns0" ]; do sleep 0.01; done
rm -rf ~/churn/sub
echo v2 > ~/churn/kept
date +%s.%N > ~/churn/removed
"""


def _churn_command() -> str:
    script = CHURN.strip().replace("'", "'\"'\"'")
    return f"setsid sh -c '{script}' </dev/null >/dev/null 2>&1 &"


def _read(http, slot_id: str, path: str) -> str:
    out = execute(http, slot_id, f"cat {path} 2>/dev/null || true")["output"]
    return (out.get("stdout") or "").strip()


def _fork_valid_children(
    command: str,
    seeded: str,
    seed: tuple[str, str],
    changed_path: str,
    judge: Callable[[dict], bool],
) -> None:
    """On a fresh parent: run `command`, wait until the file `seed[0]` reads `seed[1]` (`seeded`
    names it), fork CHILDREN; every child's gates must pass, each child must write
    `changed_path` after its restore, and `judge(state_hash evidence)` must hold for at least
    one child whose gate read came after its change. The parent never writes it."""
    require_live()
    daemon = shared_daemon("hardened")
    with http_client(daemon) as http:
        parent = create(http)["id"]
        children: list[str] = []
        try:
            execute(http, parent, command)
            poll(
                f"the parent's process {seeded}",
                lambda: _read(http, parent, seed[0]) == seed[1],
                limit_s=20,
            )
            r = http.post(f"/v1/slots/{parent}/fork", json={"n": CHILDREN})
            assert r.status_code == 201, r.text
            children = [c["id"] for c in r.json()["children"]]
            exercised = 0
            for child in children:
                report = settled_gates(http, child)
                failed = {n: g["evidence"] for n, g in report.items() if g["status"] != "pass"}
                assert not failed, (child, failed)
                changed_at = poll(
                    f"child {child} wrote {changed_path} after its restore",
                    lambda c=child: _stamp(http, c, changed_path),
                    limit_s=20,
                )
                checked_at = datetime.fromisoformat(report["state_hash"]["checked_at"])
                if changed_at < checked_at.timestamp() and judge(report["state_hash"]["evidence"]):
                    exercised += 1
            # Otherwise no child's gate saw its tree's change: nothing above exercised the rule.
            assert exercised >= 1, "no child changed its upper before its state_hash read"
            # The parent was never restored: its process is still waiting.
            assert _stamp(http, parent, changed_path) is None
        finally:
            for sid in [*children, parent]:
                destroy(http, sid)


def _stamp(http, slot_id: str, path: str) -> float | None:
    text = _read(http, slot_id, path)
    return float(text) if text else None


def test_fork_children_whose_app_removes_files_at_once_pass_state_hash():
    _fork_valid_children(
        _churn_command(),
        "seeded ~/churn",
        ("~/churn/kept", "v1"),
        "~/churn/removed",
        lambda evidence: True,
    )


# Maps ~/mapped/counter shared, waits for a restore into a new netns, then reads its page (on the
# upper's tmpfs that maps it writable) and writes it: the file changes, its times do not.
MAPPER = """
import mmap, os, time
d = os.path.expanduser("~/mapped")
os.makedirs(d, exist_ok=True)
with open(d + "/counter", "wb") as f:
    f.write(b"\\0" * 4096)
fd = os.open(d + "/counter", os.O_RDWR)
m = mmap.mmap(fd, 4096, mmap.MAP_SHARED)
ns0 = os.readlink("/proc/self/ns/net")
open(d + "/ready", "w").write("1")
while os.readlink("/proc/self/ns/net") == ns0:
    time.sleep(0.01)
m[0]
m[0:8] = b"restored"
open(d + "/written", "w").write(repr(time.time()))
while True:
    time.sleep(1)
"""
COUNTER = "home/user/mapped/counter"


def _mapper_command() -> str:
    script = base64.b64encode(MAPPER.strip().encode()).decode()
    run = f"echo {script} | base64 -d > /tmp/mapper.py && exec python3 /tmp/mapper.py"
    return f"setsid sh -c '{run}' </dev/null >/dev/null 2>&1 &"


def test_fork_children_whose_app_writes_a_shared_mapping_pass_state_hash():
    _fork_valid_children(
        _mapper_command(),
        "mapped ~/mapped/counter",
        ("~/mapped/ready", "1"),
        "~/mapped/written",
        lambda evidence: evidence.get("upper_mapped") == [COUNTER],
    )
