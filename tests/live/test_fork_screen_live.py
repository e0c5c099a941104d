"""A fork's children inherit their parent's encoded screen (issue 35).

Before a fork's prefork is dumped the supervisor has the parent's guest encode its screen as a
full-size PNG (`ops_fork.encode_screen`); the guest keeps the image with the X DAMAGE state it was
taken at, so the dump holds both and each child's first screenshot is answered from that image
(`X-Drums-Screenshot-Cached: true`, the parent's bytes) instead of 16 children each encoding the
same screen (~75 ms of CPU each for an office desktop with Impress open; `drumsd bench --forks
--fork-warm` measures the fork with and without). On the code before, the parent was never
grabbed here, so its children's first screenshots were encoded (cached false).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import create, destroy, shared_daemon
from live_daemon import http_client


def test_the_children_of_a_fork_answer_their_first_screenshot_from_the_parents_image() -> None:
    daemon = shared_daemon("hardened")  # skips (fails under DRUMS_LIVE=1) without CRIU
    with http_client(daemon) as http:
        parent = create(http)["id"]
        children: list[str] = []
        try:
            r = http.post(f"/v1/slots/{parent}/fork", json={"n": 2})
            assert r.status_code == 201, r.text
            children = [c["id"] for c in r.json()["children"]]
            shots = [http.get(f"/v1/slots/{c}/screenshot") for c in children]
            for child, shot in zip(children, shots, strict=True):
                assert shot.status_code == 200, shot.text
                assert shot.headers["X-Drums-Screenshot-Cached"] == "true", child
            mine = http.get(f"/v1/slots/{parent}/screenshot")
            assert mine.status_code == 200, mine.text
            assert all(shot.content == mine.content for shot in shots)
        finally:
            for slot in [*children, parent]:
                destroy(http, slot)
