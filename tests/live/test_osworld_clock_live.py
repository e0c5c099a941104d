"""The top bar's clock of a restored osworld desktop shows the current minute at once (issue 32).

GNOME Shell's clock waits for its next minute on a CLOCK_REALTIME timer that CRIU re-arms relative
to the restore, so without the osworld profile's after-restore command a desktop restored in a
later minute than its template's capture showed the capture's minute for up to a minute. The
test captures a desktop early in a minute (the Shell's timer then has most of the minute left),
restores it in the next minute with warm spares off (a spare restored long before its claim has
let its timer expire while frozen and shows the right minute anyway), and reads the Shell's clock
text through the accessibility tree against the slot's `date`, after the create and a reset.

Opt-in: DRUMS_LIVE_OSWORLD=1 (with DRUMS_LIVE=1's root and CRIU), after
`bash scripts/setup.sh osworld`; a template boot of the osworld image and up to two minutes'
waits for the right second (about 3 minutes in all).
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from harness import poll
from live_daemon import http_client, osworld_opt_in, start_live_daemon, stop_and_clean

osworld_opt_in("the osworld clock test is")

# The Shell's clock text: "Dec 6 18:28" in 24-hour mode (the separator is U+2236 RATIO after a
# left-to-right mark), "6:28 PM" in 12-hour mode; hour and minute are what is compared.
CLOCK = re.compile(r"(\d{1,2})\u200e?[:\u2236](\d\d)")


@pytest.fixture(scope="module")
def daemon():
    tmp = Path(tempfile.mkdtemp(prefix="drums-clock-"))
    d = start_live_daemon(tmp, image="osworld", start_limit_s=120, spares={"enabled": False})
    yield d
    stop_and_clean(d, tmp / "state", tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def shell_clock(http, sid: str) -> tuple[int, int]:
    """(hour modulo 12, minute) of the label of GNOME Shell's top-bar clock."""
    r = http.get(f"/v1/slots/{sid}/accessibility")
    assert r.status_code == 200, r.text
    root = ET.fromstring(r.json()["tree"])
    shell = next((app for app in root if app.get("name") == "gnome-shell"), None)
    assert shell is not None, "no gnome-shell in the accessibility tree"
    for node in shell.iter():
        m = CLOCK.search(node.get("name") or "") if node.tag.endswith("label") else None
        if m:
            return int(m.group(1)) % 12, int(m.group(2))
    raise AssertionError("no clock label in gnome-shell's accessibility tree")


def slot_minute(http, sid: str) -> tuple[int, int]:
    r = http.post(
        f"/v1/slots/{sid}/step", json={"action": {"type": "execute", "command": "date +%H:%M"}}
    )
    assert r.status_code == 200, r.text
    hour, minute = r.json()["output"]["stdout"].strip().split(":")
    return int(hour) % 12, int(minute)


def utc_second() -> int:
    return datetime.now(UTC).second


def assert_current(http, sid: str, captured: datetime) -> None:
    before = slot_minute(http, sid)
    shown = shell_clock(http, sid)
    after = slot_minute(http, sid)
    assert shown in (before, after), (
        f"the Shell's clock shows {shown} (hour mod 12, minute), the slot's date said {before} "
        f"before and {after} after (the checkpoint was captured at {captured:%H:%M:%S} UTC)"
    )


def capture_early_in_a_minute(http, sid: str) -> tuple[str, datetime]:
    """A saved checkpoint of `sid` dumped in the first half of a minute: the Shell's timer then
    has over 20 s to run, the time a restore without the after-restore command shows the
    capture's minute for."""
    for _ in range(3):
        poll("the start of a minute", lambda: 1 <= utc_second() <= 8, 65, 0.2)
        r = http.post(f"/v1/slots/{sid}/capture", json={})
        assert r.status_code == 201, r.text
        done = datetime.now(UTC)
        if done.second <= 40:
            return r.json()["id"], done
        http.delete(f"/v1/checkpoints/{r.json()['id']}")  # dumped too late in its minute
    raise AssertionError("three captures each ended past second 40 of their minute")


def test_a_restored_desktop_shows_the_current_minute(daemon):
    with http_client(daemon) as http:
        r = http.post("/v1/slots", json={})
        assert r.status_code == 201, r.text
        source = r.json()["id"]
        try:
            cp, captured = capture_early_in_a_minute(http, source)
        finally:
            http.delete(f"/v1/slots/{source}")
        minute = captured.replace(second=0, microsecond=0)
        # Restored in the next minute, within the Shell's timer's time left at the capture.
        poll("the next minute", lambda: datetime.now(UTC) >= minute + timedelta(minutes=1), 65)
        r = http.post("/v1/slots", json={"from_state": cp})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            assert_current(http, sid, captured)
            # A reset is a restore too (of the same checkpoint, into the same slot).
            r = http.post(f"/v1/slots/{sid}/reset")
            assert r.status_code == 200, r.text
            assert_current(http, sid, captured)
        finally:
            http.delete(f"/v1/slots/{sid}")
            http.delete(f"/v1/checkpoints/{cp}")
