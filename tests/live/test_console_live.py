"""The console in a real browser (Debian's Chromium, headless, driven by Playwright) against a
real daemon with four live desktops, one of them quarantined by a failed gate (its xterm killed
with SIGSEGV under the crash watch): log in, four thumbnails that are the slots' own screens,
the host history's charts, the quarantined slot's failed gate, last screen and episode step by
step, the verdict filter, quarantine and release clicked (and a release refused, its reason shown
in the page), a destroy behind a confirmation, the failure record the quarantined slot leaves
once destroyed; the token in no request URL, response body or log line; no cookie, no data.
DRUMS_LIVE=1 (root, CRIU, the base image) and /usr/bin/chromium."""

from __future__ import annotations

import base64
import io
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from drumsd.api.console_frames import scale_png
from PIL import Image, ImageChops, ImageStat

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import coloured_slots, execute, shared_daemon
from harness import poll
from live_daemon import Daemon, http_client

# DRUMS_CONSOLE_SCREENSHOTS=dir: keep PNGs of the grid and the quarantined slot's page (docs/).
SHOTS = os.environ.get("DRUMS_CONSOLE_SCREENSHOTS")
CHROMIUM = Path(os.environ.get("DRUMS_CHROMIUM", "/usr/bin/chromium"))
COLOURS = ("#c0392b", "#27ae60", "#2980b9", "#8e44ad")  # one root window colour per slot


@pytest.fixture(scope="module")
def daemon() -> Daemon:
    # The gate tests' daemon (same config): in a full run its template is made once.
    return shared_daemon("hardened")


@pytest.fixture(scope="module")
def slots(daemon: Daemon) -> Iterator[list[str]]:
    with coloured_slots(daemon, COLOURS) as (http, ids):
        # The last one crashes its xterm: no_app_crash fails and the slot is quarantined.
        execute(http, ids[3], "pkill -SEGV -x xterm")
        poll(
            "slot quarantined by no_app_crash",
            lambda: http.get(f"/v1/slots/{ids[3]}").json()["state"] == "quarantined",
            limit_s=20,
        )
        yield ids


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _png(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")


def _difference(a: Image.Image, b: Image.Image) -> float:
    """Mean absolute difference per channel, 0..255."""
    if a.size != b.size:
        b = b.resize(a.size)
    return sum(ImageStat.Stat(ImageChops.difference(a, b)).mean) / 3


def test_console_in_chromium(daemon: Daemon, slots: list[str], browser) -> None:
    token = daemon.token
    quarantined, kept = slots[3], slots[:3]
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    requests: list[str] = []
    responses = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("response", lambda r: responses.append(r))
    started = time.monotonic()

    page.goto(f"{daemon.url}/console")
    assert page.url.endswith("/console/login")
    page.fill("#token", token)
    page.check("#actions")
    page.click("#login")
    page.wait_for_url(f"{daemon.url}/console")
    page.locator("#grid").scroll_into_view_if_needed()  # thumbnails load for visible cards
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('.card img[data-etag]').length >= 4"
        )
    except Exception:
        page.screenshot(path="/tmp/console-fail.png", full_page=True)
        print(page.inner_html("#grid")[:3000])
        print(daemon.log()[-3000:])
        raise

    # Four thumbnails, each its own slot's screen (the root colours tell them apart).
    with http_client(daemon) as http:
        screens = {
            sid: _png(scale_png(http.get(f"/v1/slots/{sid}/screenshot").content)) for sid in slots
        }
    diffs: dict[str, tuple[float, float]] = {}
    for sid in slots:
        # The pixels the page shows (canvas of the <img>), not a second download.
        data_url = page.evaluate(
            """(sid) => {
                const img = document.querySelector(`.card[data-slot="${sid}"] img`);
                const c = document.createElement("canvas");
                c.width = img.naturalWidth; c.height = img.naturalHeight;
                c.getContext("2d").drawImage(img, 0, 0);
                return c.toDataURL("image/png");
            }""",
            sid,
        )
        b64 = data_url.split(",", 1)[1]
        thumb = _png(base64.b64decode(b64))
        own = _difference(thumb, screens[sid])
        others = [_difference(thumb, screens[o]) for o in slots if o != sid]
        assert own < 4 and own < min(others) / 3, (sid, own, others)
        diffs[sid] = (round(own, 2), round(min(others), 1))

    # The host history's charts, drawn in the page: the live slots' line ends at (at least) 4.
    page.wait_for_function(
        """() => {
            const key = document.querySelector('.chart[data-chart="slots"] .key.s0');
            return key && parseInt(key.textContent.split(" ")[1]) >= 4;
        }""",
        timeout=15000,
    )
    assert page.locator(".chart").count() == 6
    assert page.locator('.chart[data-chart="slots"] polyline').count() == 2

    if SHOTS:
        page.wait_for_timeout(2500)  # the host panel's first refresh
        page.screenshot(path=str(Path(SHOTS) / "console-grid.png"))

    # The verdict filter: one quarantined card, then the three valid ones.
    page.select_option("#f-verdict", "quarantined")
    shown = page.locator(".card:not([hidden])")
    assert shown.count() == 1 and shown.first.get_attribute("data-slot") == quarantined
    page.select_option("#f-verdict", "valid")
    assert sorted(
        c.get_attribute("data-slot") for c in page.locator(".card:not([hidden])").all()
    ) == sorted(kept)
    page.select_option("#f-verdict", "")

    # The quarantined slot's page: its failed gate with the crash as evidence, its screen.
    page.click(f'.card[data-slot="{quarantined}"]')
    failed = page.locator('#gates tr[data-gate="no_app_crash"].gate-fail')
    failed.wait_for()
    assert "xterm" in failed.inner_text() and "SIGSEGV" in failed.inner_text()
    page.wait_for_function("() => document.getElementById('frame').dataset.etag")
    assert "quarantined" in page.inner_text("#slot-title")
    page.click("#load-timeline")
    page.locator("#timeline tbody tr", has_text="quarantined").first.wait_for()
    # Its episode step by step: the test's two steps, then the crash gate's failure after them.
    steps = page.locator('#episode tr[data-kind="step"]')
    steps.first.wait_for()
    texts = [t.inner_text() for t in steps.all()]
    assert "xsetroot" in texts[0] and "pkill -SEGV" in texts[-1], texts
    crash = page.locator('#episode tr[data-kind="gate"][data-gate="no_app_crash"].gate-fail')
    assert f"after step {len(texts)}" in crash.inner_text(), crash.inner_text()
    assert page.locator('#episode tr[data-kind="event"][data-event="quarantined"]').count() == 1
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / "console-slot.png"), full_page=True)

    # Quarantine then release in the browser, each behind its confirmation; then a release that
    # someone else made first while the dialog was open: refused, and the page says why.
    held = kept[1]
    page.goto(f"{daemon.url}/console#/slot/{held}")
    enabled = "(id) => !document.getElementById(id).disabled"
    page.wait_for_function(enabled, arg="act-quarantine")
    page.click("#act-quarantine")
    page.click("#confirm-ok")
    page.locator('#act-result.done[data-action="quarantine"]').wait_for()
    with http_client(daemon) as http:
        got = http.get(f"/v1/slots/{held}").json()
        assert got["state"] == "quarantined" and "console" in got["quarantine_reason"], got
        page.wait_for_function(enabled, arg="act-release")
        page.click("#act-release")
        page.click("#confirm-ok")
        page.locator('#act-result.done[data-action="release"]').wait_for()
        assert http.get(f"/v1/slots/{held}").json()["state"] == "ready"
        r = http.post(f"/v1/slots/{held}/quarantine", json={"reason": "live test"})
        assert r.status_code == 200, r.text
        page.wait_for_function(enabled, arg="act-release")
        page.click("#act-release")  # the confirmation is open...
        assert http.post(f"/v1/slots/{held}/release", json={}).status_code == 200  # ...released
        page.click("#confirm-ok")
        refused = page.locator('#act-result.refused[data-action="release"]')
        refused.wait_for()
        assert "not quarantined" in refused.inner_text(), refused.inner_text()
        page.wait_for_timeout(1200)  # a slot refresh later the reason is still shown
        assert refused.is_visible()
        assert http.get(f"/v1/slots/{held}").json()["state"] == "ready"

    # Destroy behind a confirmation: cancel keeps the slot, confirm destroys it.
    victim = kept[0]
    page.goto(f"{daemon.url}/console#/slot/{victim}")
    page.wait_for_function("() => !document.getElementById('act-destroy').disabled")
    page.click("#act-destroy")
    page.click("#confirm-cancel")
    with http_client(daemon) as http:
        assert http.get(f"/v1/slots/{victim}").json()["state"] == "ready"
        page.click("#act-destroy")
        page.click("#confirm-ok")
        poll(
            f"slot {victim} destroyed from the console",
            lambda: http.get(f"/v1/slots/{victim}").status_code == 410,
            limit_s=30,
        )
    page.wait_for_url(f"{daemon.url}/console#/")

    # Destroyed, the quarantined slot leaves a failure record: its gates and its last screen.
    with http_client(daemon) as http:
        assert http.delete(f"/v1/slots/{quarantined}").status_code == 200
    page.goto(f"{daemon.url}/console#/records")
    row = page.locator(f'#records tr[data-slot="{quarantined}"][data-kind="full"]')
    row.wait_for()
    row.locator("a").click()
    page.locator('#record-gates tr[data-gate="no_app_crash"].gate-fail').wait_for()
    page.wait_for_function("() => document.getElementById('record-shot').naturalWidth > 0")
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / "console-record.png"))
    elapsed = time.monotonic() - started

    # The token went out once, in the login POST's body: never in a URL, never back.
    assert not [u for u in requests if token in u]
    bodies = 0
    for r in responses:
        try:
            body = r.body()
        except Exception:  # redirects and dropped blobs have no body to read
            continue
        bodies += 1
        assert token.encode() not in body, r.url
    assert bodies >= 10
    assert token not in daemon.log()

    # Without the cookie: the page sends to the login form, the data is refused.
    anonymous = browser.new_context()
    r = anonymous.request.get(f"{daemon.url}/console/api/slots")
    assert r.status == 401 and r.json()["error"]["code"] == "unauthorized"
    r = anonymous.request.get(f"{daemon.url}/console/api/slots/{quarantined}/thumbnail")
    assert r.status == 401
    r = anonymous.request.get(f"{daemon.url}/console", max_redirects=0)
    assert r.status == 303 and r.headers["location"] == "/console/login"
    anonymous.close()
    context.close()
    print(f"console browser session: {elapsed:.1f}s; thumbnail vs own/other screens: {diffs}")
