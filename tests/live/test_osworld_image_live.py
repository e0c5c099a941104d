"""The osworld image on real restored desktops (issues 19 and 21): the shared GNOME settings tasks
score 1 after a scripted solution and 0 without, the desktop's accessibility tree comes back in
OSWorld's XML (through the API, the SDK's DesktopEnv and the `accessibility_tree` getter) from
slots restored from the template, and GNOME's apps open.

Opt-in: DRUMS_LIVE_OSWORLD=1 (with DRUMS_LIVE=1's root and CRIU), after
`bash scripts/setup.sh osworld` (the image build takes about ten minutes and 3 GB, so CI's
default setup does not build it). Without the opt-in the tests skip saying so; with it, a missing
image is a failure.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import OSWORLD, create, destroy, episode, execute, shared_daemon
from harness import poll
from live_daemon import http_client, osworld_opt_in

osworld_opt_in("the osworld image tests are")

# The shared GNOME settings tasks and the command that solves each.
SETTINGS_TASKS = {
    "a4d98375-215b-4a4d-aee9-3d4370fccc41": "gsettings set org.gnome.desktop.screensaver "
    "lock-enabled true",
    "bedcedc4-4d72-425e-ad62-21960b11fe0d": "gsettings set org.gnome.desktop.session idle-delay 0",
    "f9be0997-4b7c-45c5-b05c-4612b44a6118": "gsettings set org.gnome.desktop.notifications "
    "show-banners false",
    "3ce045a0-877b-42aa-8d2c-b4a863336ab8": "gsettings set org.gnome.desktop.interface "
    "text-scaling-factor 1.5",
}
ST = "https://accessibility.ubuntu.example.org/ns/state"


@pytest.fixture(scope="module")
def osworld():
    return shared_daemon("osworld", image="osworld", eval_timeout_s=60.0)


@pytest.mark.parametrize("solved", [True, False], ids=["solved", "nothing"])
@pytest.mark.parametrize("task", sorted(SETTINGS_TASKS), ids=lambda t: t[:8])
def test_gnome_settings_tasks_score_on_the_osworld_image(osworld, task, solved):
    assert (OSWORLD / "os" / f"{task}.json").exists()
    with http_client(osworld) as http:
        listed = http.get(f"/v1/tasks/{task}").json()
    assert listed["supported"] is True, listed
    result = episode(osworld, task, SETTINGS_TASKS[task] if solved else None, None)
    assert result["score"] == (1.0 if solved else 0.0), result


def _tree(http, sid: str) -> ET.Element:
    r = http.get(f"/v1/slots/{sid}/accessibility")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tree"], body
    return ET.fromstring(body["tree"])


def _app_names(root: ET.Element) -> set[str]:
    return {app.get("name", "") for app in root}


def test_the_accessibility_tree_of_a_restored_desktop(osworld):
    """Every slot is a CRIU restore of the template, whose tree holds the AT-SPI buses: an app
    started after the restore registers on the restored bus and shows in the tree, with OSWorld's
    namespaced states and positions; a reset (another restore) serves the tree again."""
    with http_client(osworld) as http:
        sid = create(http)["id"]
        try:
            execute(http, sid, "setsid -f gnome-terminal --title=drums-a11y >/dev/null 2>&1")
            root = poll(
                "gnome-terminal in the accessibility tree",
                lambda: _tree_with(http, sid, "gnome-terminal-server"),
                limit_s=60,
            )
            assert root.tag == "desktop-frame"
            showing = [e for e in root.iter() if e.get(f"{{{ST}}}showing") == "true"]
            assert showing, "no showing element"
            assert r_ok(http.post(f"/v1/slots/{sid}/reset"))
            after = _tree(http, sid)
            assert after.tag == "desktop-frame"
            assert "gnome-terminal-server" not in _app_names(after)  # the reset restored the start
        finally:
            destroy(http, sid)


def _tree_with(http, sid: str, app: str) -> ET.Element | None:
    root = _tree(http, sid)
    return root if app in _app_names(root) else None


def r_ok(r) -> bool:
    assert r.status_code == 200, r.text
    return True


def test_desktopenv_puts_the_tree_in_the_observation(osworld):
    import drums
    from drums.osworld import DesktopEnv

    with (
        drums.connect(osworld.url, token=osworld.token) as client,
        DesktopEnv(client=client, image="osworld", require_a11y_tree=True) as env,
    ):
        obs = env.reset()
        tree = ET.fromstring(obs["accessibility_tree"])
        assert tree.tag == "desktop-frame" and obs["screenshot"][:4] == b"\x89PNG"
