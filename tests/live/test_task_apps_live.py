"""A real daemon on the office image says which tasks need an app the image lacks (issue 19):
`GET /v1/tasks` names VS Code for the VS Code task and the GSettings schema for GNOME settings
tasks, loading such a task into a slot is refused with the same reason, and /v1/health shows the
image's apps and where OSWorld's tasks come from (here `tasks.osworld.dir`, the shared copy).
DRUMS_LIVE=1 (root, CRIU, the office image). Seconds: it shares the office daemon of the OSWorld
live tests (fixtures/gate_daemons.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import OSWORLD, office_daemon
from live_daemon import http_client

VSCODE = "276cc624-87ea-4f08-ab93-f770e3790175"
SCREENSAVER = "a4d98375-215b-4a4d-aee9-3d4370fccc41"
GIMP_UNDO = "7b7617bd-57cc-468e-9c91-40c4ec2bcb3d"


@pytest.fixture(scope="module")
def office():
    assert OSWORLD.is_dir(), f"the shared OSWorld tasks are expected at {OSWORLD}"
    return office_daemon()


def test_tasks_name_the_app_the_image_lacks(office) -> None:
    with http_client(office) as http:
        rows = {t["id"]: t for t in http.get("/v1/tasks").json()["tasks"]}
        health = http.get("/v1/health").json()
    shared = {json.loads(p.read_text())["id"] for p in OSWORLD.rglob("*.json")}
    assert shared <= rows.keys(), shared - rows.keys()  # found through tasks.osworld.dir
    vscode = rows[VSCODE]
    assert vscode["supported"] is False, vscode
    assert vscode["reason"] == (
        "needs VS Code (related_apps lists 'vscode'), which image 'office' lacks"
    ), vscode
    screensaver = rows[SCREENSAVER]
    assert screensaver["supported"] is False, screensaver
    assert "GSettings schema 'org.gnome.desktop.screensaver'" in screensaver["reason"], screensaver
    assert rows[GIMP_UNDO]["supported"] is True, rows[GIMP_UNDO]

    tasks = health["tasks"]
    assert tasks["image"] == "office", tasks
    assert {"chrome", "gimp", "libreoffice_calc"} <= set(tasks["image_apps"]), tasks
    assert "vscode" not in tasks["image_apps"], tasks
    assert tasks["osworld"]["state"] == "dir", tasks
    assert tasks["osworld"]["tasks_dir"] == str(OSWORLD), tasks


def test_loading_a_task_whose_app_is_missing_is_refused(office) -> None:
    with http_client(office) as http:
        r = http.post("/v1/slots", json={"task": VSCODE})
        assert r.status_code in (409, 422), r.text
        assert "VS Code" in r.text and "office" in r.text, r.text
        left = [s for s in http.get("/v1/slots").json()["slots"] if s["status"] != "destroyed"]
        assert left == [], left
