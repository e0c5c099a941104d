"""Impress on the osworld image draws its shape toolbar icons in its first frames (issue 32).

With LibreOffice's PNG colibre icons, the GTK3 VCL drew some toolbar items blank for good (the
Drawing bar's six shape menus, Display Views, Media): enabled, their icons in the set, the same
30 s later. The image sets colibre's SVG icons instead (image_osworld.LIBREOFFICE_ICONS). The test
starts Impress in a restored desktop, takes the Drawing bar's shape menus from the accessibility
tree once they are up, and checks each one's icon area in the screenshot holds an icon, not only
the toolbar's background, at once and again 5 s later.

The tree's boxes are off from the screenshot's by some pixels (LibreOffice's GTK3 accessibility
reports y about 20 px high), so they are first moved to where the menus' dropdown arrows, drawn
either way, are darkest.

Opt-in: DRUMS_LIVE_OSWORLD=1 (with DRUMS_LIVE=1's root and CRIU), after
`bash scripts/setup.sh osworld` (DRUMS_LIVE_IMAGES_DIR for an image built elsewhere); a template
boot of the osworld image and Impress's start (about 2 minutes).
"""

from __future__ import annotations

import io
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from harness import poll
from live_daemon import http_client, osworld_opt_in, start_live_daemon, stop_and_clean

osworld_opt_in("the osworld Impress icons test is")

SHAPE_MENUS = (
    "Basic Shapes",
    "Symbol Shapes",
    "Arrow Shapes",
    "Flowchart Shapes",
    "Callout Shapes",
    "Star Shapes",
)
ARROW_PX = 14  # a dropdown button's right part: its arrow
# A drawn icon has at least this many pixels far from the toolbar's background (24 px shapes
# have 40-160); a blank one had 0-2 once aligned on the arrows.
MIN_INK = 20

Box = tuple[int, int, int, int]


@pytest.fixture(scope="module")
def daemon():
    tmp = Path(tempfile.mkdtemp(prefix="drums-impress-"))
    d = start_live_daemon(tmp, image="osworld", start_limit_s=120)
    yield d
    stop_and_clean(d, tmp / "state", tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def shape_menus(http, sid: str) -> dict[str, Box] | None:
    """Boxes (left, top, right, bottom) of the shape menus as the tree has them, once all are."""
    r = http.get(f"/v1/slots/{sid}/accessibility")
    assert r.status_code == 200, r.text
    found: dict[str, Box] = {}
    for el in ET.fromstring(r.json()["tree"]).iter():
        attrs = {k.rsplit("}", 1)[-1]: v for k, v in el.attrib.items()}
        if el.get("name") not in SHAPE_MENUS or "button" not in el.tag or "size" not in attrs:
            continue
        if "screencoord" not in attrs:
            continue
        x, y = (int(v) for v in attrs["screencoord"].strip("()").split(","))
        w, h = (int(v) for v in attrs["size"].strip("()").split(","))
        found[el.get("name", "")] = (x, y, x + w, y + h)
    return found if set(found) == set(SHAPE_MENUS) else None


def dark(image: Image.Image, box: Box) -> int:
    return sum(1 for p in image.crop(box).convert("L").getdata() if p < 90)


def aligned(image: Image.Image, boxes: dict[str, Box]) -> dict[str, Box]:
    """The boxes moved by the shift that puts the most dark arrow pixels in their arrow parts."""

    def arrows(dx: int, dy: int) -> int:
        return sum(
            dark(image, (r - ARROW_PX + dx, t + dy, r + dx, b + dy))
            for _, t, r, b in boxes.values()
        )

    dx, dy = max(
        ((dx, dy) for dx in range(-30, 31, 2) for dy in range(-10, 61, 2)), key=lambda d: arrows(*d)
    )
    return {name: (x0 + dx, y0 + dy, x1 + dx, y1 + dy) for name, (x0, y0, x1, y1) in boxes.items()}


def ink(image: Image.Image, box: Box) -> int:
    """Pixels of a menu's icon area (left of its arrow) far from the area's commonest colour."""
    left, top, right, bottom = box
    area = image.crop((left + 3, top + 3, right - ARROW_PX, bottom - 3)).convert("RGB")
    pixels = list(area.getdata())
    background = Counter(pixels).most_common(1)[0][0]
    return sum(
        1 for p in pixels if max(abs(a - b) for a, b in zip(p, background, strict=True)) > 60
    )


def screenshot(http, sid: str) -> Image.Image:
    r = http.get(f"/v1/slots/{sid}/screenshot")
    assert r.status_code == 200, r.text
    return Image.open(io.BytesIO(r.content))


def test_impress_draws_its_shape_menus_at_once(daemon):
    with http_client(daemon) as http:
        r = http.post("/v1/slots", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            step = {"type": "execute", "command": "setsid -f libreoffice --impress >/dev/null 2>&1"}
            r = http.post(f"/v1/slots/{sid}/step", json={"action": step})
            assert r.status_code == 200, r.text
            boxes = poll(
                "Impress's shape menus in the tree", lambda: shape_menus(http, sid), 120, 1
            )
            shots = [screenshot(http, sid)]
            time.sleep(5.0)
            shots.append(screenshot(http, sid))
            for when, shot in zip(("at once", "5 s later"), shots, strict=True):
                counts = {name: ink(shot, box) for name, box in aligned(shot, boxes).items()}
                blank = [name for name, n in counts.items() if n < MIN_INK]
                assert not blank, f"{when}: blank shape menus {blank} (ink: {counts})"
        finally:
            http.delete(f"/v1/slots/{sid}")
