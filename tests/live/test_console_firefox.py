"""The console in Firefox (Debian's firefox-esr, headless, driven over WebDriver BiDi by
fixtures/firefox_bidi.py) against a real daemon with two live desktops, each its own root colour:
log in through the form (real key presses and clicks), one card per slot whose thumbnail loaded
and is that slot's screen (and follows it when it changes), a slot page with its gates and its
screen as the API's screenshot shows it, no script error in the page,
the session cookie HttpOnly and SameSite=Strict, the token in no request URL, and a browser
profile without the cookie refused.

Opt-in, DRUMS_CONSOLE_FIREFOX=1 (Firefox's start costs seconds of CPU; CI has no room), on top
of what the live tests need (DRUMS_LIVE=1, root, CRIU, the base image); firefox-esr from Debian
(`apt-get install --no-install-recommends firefox-esr`), or DRUMS_FIREFOX=path.
"""

from __future__ import annotations

import base64
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from drumsd.api.console_frames import scale_png
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from firefox_bidi import Firefox, Tab
from gate_daemons import coloured_slots, execute, gates
from live_daemon import Daemon, http_client
from test_console_live import (
    _difference,
    _png,
    daemon,  # noqa: F401 - the Chromium test's daemon (same config)
)

pytestmark = pytest.mark.skipif(
    os.environ.get("DRUMS_CONSOLE_FIREFOX") != "1",
    reason="the console in Firefox is opt-in: DRUMS_CONSOLE_FIREFOX=1 (and DRUMS_LIVE=1)",
)

FIREFOX = Path(os.environ.get("DRUMS_FIREFOX", "/usr/bin/firefox-esr"))
COLOURS = ("#d35400", "#16a085")  # one root window colour per slot


@pytest.fixture(scope="module")
def slots(daemon: Daemon) -> Iterator[list[str]]:  # noqa: F811 - the imported fixture
    with coloured_slots(daemon, COLOURS) as (_, ids):
        yield ids


@pytest.fixture
def firefox(tmp_path: Path) -> Iterator[Firefox]:
    if not os.access(FIREFOX, os.X_OK):
        pytest.fail(
            f"no Firefox at {FIREFOX} (apt-get install --no-install-recommends firefox-esr)"
        )
    ff = Firefox(FIREFOX, tmp_path)
    try:
        yield ff
    finally:
        ff.close()


def _shown(tab: Tab, selector: str) -> Image.Image:
    """The pixels the page shows in this <img> (drawn on a canvas)."""
    data_url = tab.js(
        """const img = document.querySelector(a0);
        const c = document.createElement("canvas");
        c.width = img.naturalWidth; c.height = img.naturalHeight;
        c.getContext("2d").drawImage(img, 0, 0);
        return c.toDataURL("image/png");""",
        selector,
    )
    return _png(base64.b64decode(data_url.split(",", 1)[1]))


def test_console_in_firefox(daemon: Daemon, slots: list[str], firefox: Firefox) -> None:  # noqa: F811
    token, url = daemon.token, daemon.url
    firefox.subscribe("log.entryAdded", "network.beforeRequestSent")
    tab = firefox.tab()
    tab.set_viewport(1400, 1000)
    started = time.monotonic()

    # No session: the page sends to the login form; log in through it, keys and clicks.
    assert tab.goto(f"{url}/console").endswith("/console/login")
    tab.click("#token")
    tab.type(token)
    tab.click("#login")
    tab.wait_for("the grid after login", "return location.pathname === '/console';")

    # One card per live slot, each with a thumbnail that loaded and is that slot's own screen.
    tab.js("document.getElementById('grid').scrollIntoView();")
    try:
        tab.wait_for(
            "a loaded thumbnail on every card",
            """const imgs = [...document.querySelectorAll('.card img[data-etag]')];
            return imgs.length >= 2 && imgs.every((i) => i.complete && i.naturalWidth > 0);""",
        )
    except AssertionError:
        tab.screenshot(Path("/tmp/console-firefox-fail.png"))
        print(tab.js("return document.getElementById('grid').innerHTML;")[:3000])
        raise
    cards = tab.js("return [...document.querySelectorAll('.card')].map((c) => c.dataset.slot);")
    assert sorted(cards) == sorted(slots), cards
    sizes = tab.js("return [...document.querySelectorAll('.card img')].map((i) => i.naturalWidth);")
    assert all(w > 0 for w in sizes), sizes
    with http_client(daemon) as http:
        screens = {
            sid: _png(scale_png(http.get(f"/v1/slots/{sid}/screenshot").content)) for sid in slots
        }
        api_gates = {sid: gates(http, sid) for sid in slots}
    diffs = {}
    for sid, other in (slots, slots[::-1]):
        shown = _shown(tab, f'.card[data-slot="{sid}"] img')
        own, theirs = _difference(shown, screens[sid]), _difference(shown, screens[other])
        assert own < 4 and own < theirs / 3, (sid, own, theirs)
        diffs[sid] = (round(own, 2), round(theirs, 1))

    # The grid follows the desktops: a slot's new screen reaches its card within a few refreshes.
    changed = slots[0]
    with http_client(daemon) as http:
        assert execute(http, changed, "xsetroot -solid '#f1c40f'")["output"]["returncode"] == 0
        screen = _png(scale_png(http.get(f"/v1/slots/{changed}/screenshot").content))
    assert _difference(screen, screens[changed]) > 30  # the new colour is another screen
    deadline = time.monotonic() + 15
    while (d := _difference(_shown(tab, f'.card[data-slot="{changed}"] img'), screen)) >= 4:
        assert time.monotonic() < deadline, f"card of {changed} still {d:.1f} off its new screen"
        time.sleep(0.5)

    # A slot page: its gates as the daemon reports them, its screen; read-only by default.
    sid = slots[1]
    tab.click(f'.card[data-slot="{sid}"]')
    tab.wait_for("the slot page", "return location.hash === '#/slot/' + a0;", sid)
    shown_gates = tab.wait_for(
        "the slot's gates",
        """const rows = [...document.querySelectorAll('#gates tbody tr[data-gate]')];
        const shown = rows.map((r) => [r.dataset.gate, r.className]);
        return rows.length && Object.fromEntries(shown);""",
    )
    assert shown_gates == {n: f"gate-{g['status']}" for n, g in api_gates[sid].items()}
    assert set(shown_gates.values()) == {"gate-pass"}, shown_gates
    tab.wait_for(
        "the slot's screen",
        """const f = document.getElementById('frame');
        return f.dataset.etag && f.complete && f.naturalWidth > 0;""",
    )
    with http_client(daemon) as http:
        full = _png(http.get(f"/v1/slots/{sid}/screenshot").content)
    frame = _shown(tab, "#frame")
    assert frame.size == full.size and _difference(frame, full) < 4, frame.size
    assert sid in tab.js("return document.getElementById('slot-title').textContent;")
    assert tab.js("return document.getElementById('act-destroy').disabled;") is True
    elapsed = time.monotonic() - started

    # The cookie: a session id, HttpOnly (the page's script cannot read it), SameSite=Strict.
    (cookie,) = [c for c in firefox.cookies(tab) if c["name"] == "drums_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "strict" and cookie["path"] == "/console"
    assert cookie["value"]["value"] != token
    assert "drums_console" not in tab.js("return document.cookie;")

    # The page ran without a script error; the token went out in no request URL.
    events = firefox.drain()
    errors = [
        e["params"]
        for e in events
        if e["method"] == "log.entryAdded"
        and e["params"]["source"]["context"] == tab.id
        and e["params"]["level"] == "error"
    ]
    assert not errors, errors
    urls = [
        e["params"]["request"]["url"]
        for e in events
        if e["method"] == "network.beforeRequestSent" and e["params"]["context"] == tab.id
    ]
    assert any("/thumbnail" in u for u in urls) and any("/frame" in u for u in urls), urls
    assert not [u for u in urls if token in u]

    # Another profile, no cookie: the page sends to the login form, the data is refused.
    anonymous = firefox.tab(firefox.user_context())
    assert anonymous.goto(f"{url}/console").endswith("/console/login")
    refused = anonymous.js(
        """const a = await fetch('/console/api/slots');
        const t = await fetch(`/console/api/slots/${a0}/thumbnail`);
        return [a.status, (await a.json()).error.code, t.status];""",
        sid,
    )
    assert refused == [401, "unauthorized", 401], refused
    assert not [c for c in firefox.cookies(anonymous) if c["name"] == "drums_console"]
    print(
        f"{firefox.version}: started in {firefox.startup_s:.1f}s; console session "
        f"{elapsed:.1f}s; {len(urls)} requests; thumbnail vs own/other screen: {diffs}"
    )
