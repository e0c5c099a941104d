"""Zero pages of a slot's SysV shared memory (Xvfb's framebuffer) are not dumped (issue 35): on
a real desktop whose root window is black, a save's shared-memory page images hold no all-zero
page and are smaller than the segment's data, and the desktop restored from it shows the same
screen. On the code before (every allocated page of the segment written) the page images hold
~the whole 8 MB framebuffer. DRUMS_LIVE=1 (root, CRIU, the base image)."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from drumsd.core.save_delta import PAGE, parse_pagemap
from drumsd.linux import save_delta
from gate_daemons import create, destroy, execute, settled_gates, shared_daemon, state_of
from live_daemon import http_client, require_live

FRAMEBUFFER = 1920 * 1080 * 4


def _shm_pages(checkpoint: Path, tmp: Path) -> list[bytes]:
    """Every page of the shared-memory page images (`pagemap-shmem-*.img` and their pages) as
    CRIU wrote them (a delta save's assembled, as for a restore)."""
    images = tmp / "images"
    shutil.copytree(checkpoint / "images", images)
    save_delta.assemble(checkpoint, images)
    pages = []
    for pm in sorted(images.glob("pagemap-shmem-*.img")):
        m = parse_pagemap(pm.read_bytes(), pm.name)
        data = (images / m.pages_name).read_bytes()
        pages += [data[i : i + PAGE] for i in range(0, len(data), PAGE)]
    return pages


def _pixels(png: bytes) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return im.convert("RGB").tobytes()


def test_a_save_writes_no_zero_page_of_the_framebuffer_and_restores_the_same_screen(
    tmp_path: Path,
) -> None:
    require_live()
    daemon = shared_daemon("hardened")
    state = state_of(daemon)
    with http_client(daemon) as http:
        slot = create(http)
        out = execute(http, slot["id"], "DISPLAY=:0 xsetroot -solid black && echo ok")["output"]
        assert (out.get("stdout") or "").strip() == "ok", out
        before = http.get(f"/v1/slots/{slot['id']}/screenshot")  # reads the whole segment
        assert before.status_code == 200, before.text
        r = http.post(f"/v1/slots/{slot['id']}/capture", json={})
        assert r.status_code == 201, r.text
        saved = r.json()
        destroy(http, slot["id"])
        d = state / "checkpoints" / saved["id"]
        meta = json.loads((d / "meta.json").read_text())
        pages = _shm_pages(d, tmp_path)
        assert pages, "no shared-memory page image in the dump"
        zero = pages.count(bytes(PAGE))
        assert zero == 0, f"{zero} of {len(pages)} shared-memory pages written are all zero"
        holes = meta["shm_holes"]
        assert holes is not None and holes["segments"] >= 1, meta
        # the black root around the xterm: ~3.7 MiB of the 7.9 MiB framebuffer seen here
        assert holes["removed_bytes"] > FRAMEBUFFER // 4, holes
        assert len(pages) * PAGE <= holes["data_bytes"] - holes["removed_bytes"]

        again = create(http, from_state=saved["id"])
        report = settled_gates(http, again["id"])
        assert all(g["status"] == "pass" for g in report.values()), report
        after = http.get(f"/v1/slots/{again['id']}/screenshot")
        assert after.status_code == 200, after.text
        assert _pixels(after.content) == _pixels(before.content)
        destroy(http, again["id"])
        http.delete(f"/v1/checkpoints/{saved['id']}")
