"""A desktop app's inotify watch on a directory of the overlay root whose dentry the kernel has
evicted: the watch's fdinfo then carries no file handle, and CRIU 4.2.1 refuses the whole dump
(`parse_fdinfo_pid_s: error parsing [inotify wd:.. ino:.. sdev:..]`). Seen on office saves and
osworld preforks under memory pressure; here the eviction is forced with drop_caches."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import create, destroy, execute, put_file, shared_daemon
from harness import poll
from live_daemon import http_client, require_live

WATCHER = b"""import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
for d in ("/home/user/watched", "/home/user/watched/deeper"):
    os.makedirs(d, exist_ok=True)
    assert libc.inotify_add_watch(fd, d.encode(), 0xFCE) > 0, ctypes.get_errno()
open("/tmp/watching", "w").write(str(os.getpid()))
time.sleep(100000)
"""


def _drop_dentries() -> None:
    Path("/proc/sys/vm/drop_caches").write_text("2\n")


def test_a_dump_with_an_inotify_watch_on_an_evicted_overlay_dentry_succeeds():
    require_live()
    daemon = shared_daemon("hardened")
    with http_client(daemon) as http:
        sid = create(http)["id"]
        try:
            out = execute(http, sid, put_file("/tmp/watcher.py", WATCHER))
            assert out["output"]["returncode"] == 0, out
            execute(http, sid, "setsid -f python3 /tmp/watcher.py >/dev/null 2>&1 </dev/null")
            poll(
                "the watcher holds its watches",
                lambda: execute(http, sid, "cat /tmp/watching")["output"]["returncode"] == 0,
                limit_s=20,
            )
            retries = daemon.log().count("dump_retry")
            _drop_dentries()
            r = http.post(f"/v1/slots/{sid}/capture", json={})
            assert r.status_code == 201, r.text
            # The first dump was refused and the second went (not an eviction that missed).
            assert daemon.log().count("dump_retry") == retries + 1, daemon.log()[-3000:]
            http.delete(f"/v1/checkpoints/{r.json()['id']}")
        finally:
            destroy(http, sid)
