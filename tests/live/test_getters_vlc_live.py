"""OSWorld's VLC and wallpaper getters on a restored `osworld` desktop (the image with VLC and
GNOME's schemas), through the API: vlc_playing_info (VLC's HTTP interface in the slot,
is_vlc_playing) and vlc_config (vlcrc, check_qt_minimal_view), each 1 after a scripted solution and
0 when nothing is done; vm_wallpaper (gsettings' picture-uri, compare_images) 1.0 after the
wallpaper is set and low (a flat picture) before.

Opt-in with the other osworld image tests: DRUMS_LIVE_OSWORLD=1 after `bash scripts/setup.sh
osworld` (the image's package layer takes 9-15 min to build, more than CI's budget allows)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from drumsd.tasks.testing import png_image
from gate_daemons import episode, execute, put_file, shared_daemon
from harness import poll
from live_daemon import osworld_opt_in

osworld_opt_in("the osworld image tests are")

TONE = "/home/user/Music/tone.wav"
# A minute of a 440 Hz tone (VLC still plays it at verify), written with the stdlib in the slot.
WRITE_TONE = (
    'mkdir -p /home/user/Music && python3 -c "import math, struct, wave; '
    f"w = wave.open('{TONE}', 'wb'); w.setnchannels(1); w.setsampwidth(2); w.setframerate(8000); "
    "w.writeframes(b''.join(struct.pack('<h', int(8000 * math.sin(i / 8000 * 6.283 * 440))) "
    'for i in range(8000 * 60))); w.close()"'
)
# VLC with its HTTP interface as OSWorld's VM configures it (port 8080, password "password").
VLC = "vlc --extraintf http --http-host 127.0.0.1 --http-port 8080 --http-password password"
STATUS = (
    'python3 -c "import base64, urllib.request as u; r = u.Request('
    "'http://127.0.0.1:8080/requests/status.xml{}'); r.add_header('Authorization', 'Basic ' + "
    "base64.b64encode(b':password').decode()); print(u.urlopen(r, timeout=5).read().decode())\""
)

PLAYING_TASK: dict[str, Any] = {
    "id": "drums-getters-vlc-playing",
    "instruction": "Play tone.wav in VLC.",
    "related_apps": ["vlc"],
    "config": [
        {"type": "execute", "parameters": {"shell": True, "command": WRITE_TONE}},
        {"type": "launch", "parameters": {"command": VLC + " --loop"}},
    ],
    "evaluator": {
        "func": "is_vlc_playing",
        "result": {"type": "vlc_playing_info", "dest": "status.xml"},
        "expected": {"type": "rule", "rules": {"type": "file_name", "file_name": "tone.wav"}},
    },
}

CONFIG_TASK: dict[str, Any] = {
    "id": "drums-getters-vlc-config",
    "instruction": "Make VLC start in minimal view.",
    "related_apps": ["vlc"],
    "config": [{"type": "launch", "parameters": {"command": "vlc"}}],
    "evaluator": {
        "func": "check_qt_minimal_view",
        "result": {"type": "vlc_config", "dest": "vlcrc"},
        "expected": {"type": "rule", "rules": {"expected_qt_minimal_view": 1}},
    },
}


@pytest.fixture(scope="module")
def osworld():
    return shared_daemon("osworld", image="osworld", eval_timeout_s=60.0)  # as the image test


def _status(http: Any, sid: str, query: str = "") -> str:
    out = execute(http, sid, STATUS.format(query))["output"]
    return str(out["stdout"]) if out["returncode"] == 0 else ""


def _play(http: Any, sid: str) -> None:
    poll("VLC's HTTP interface answers", lambda: "<state>" in _status(http, sid), limit_s=60)
    _status(http, sid, f"?command=in_play&input=file://{TONE}")
    poll("VLC plays", lambda: "<state>playing</state>" in _status(http, sid), limit_s=30)


def _minimal_view(http: Any, sid: str) -> None:
    # What Tools > Preferences saves, written after VLC has quit (it rewrites vlcrc on exit).
    rc = "/home/user/.config/vlc/vlcrc"
    command = (
        f"pkill -x vlc; sleep 1; mkdir -p $(dirname {rc}); touch {rc}; "
        f"sed -i '/qt-minimal-view=/d' {rc}; printf '[qt]\\nqt-minimal-view=1\\n' >> {rc}"
    )
    assert execute(http, sid, command)["output"]["returncode"] == 0


def _episode(daemon: Any, task: dict[str, Any], solve: Any) -> dict[str, Any]:
    def vlc_up(http: Any, sid: str) -> None:
        # either way VLC must be up: 0 is "not playing", not "gone"
        poll("VLC's HTTP interface", lambda: "<state>" in _status(http, sid), limit_s=60)

    prepare = vlc_up if task is PLAYING_TASK else None
    last = "done" if solve is not None else None
    return episode(daemon, task, None, last, solve=solve, prepare=prepare)


@pytest.mark.parametrize("solved", [True, False], ids=["solved", "nothing"])
def test_vlc_playing_info(osworld, solved):
    result = _episode(osworld, PLAYING_TASK, _play if solved else None)
    assert result["score"] == (1.0 if solved else 0.0), result


@pytest.mark.parametrize("solved", [True, False], ids=["solved", "nothing"])
def test_vlc_config(osworld, solved):
    result = _episode(osworld, CONFIG_TASK, _minimal_view if solved else None)
    assert result["score"] == (1.0 if solved else 0.0), result


PICTURES = "/home/user/Pictures"
WALLPAPER_TASK: dict[str, Any] = {
    "id": "drums-getters-wallpaper",
    "instruction": "Make ~/Pictures/new.png the desktop background.",
    "config": [
        {"type": "execute", "parameters": {"shell": True, "command": (
            put_file(f"{PICTURES}/new.png", png_image(64, 64)) + " && "
            + put_file(f"{PICTURES}/old.png", png_image(64, 64, slope=(0, 0))) + " && "
            f"gsettings set org.gnome.desktop.background picture-uri file://{PICTURES}/old.png")}},
    ],
    "evaluator": {
        "func": "compare_images",
        "result": {"type": "vm_wallpaper", "dest": "background.png"},
        "expected": {"type": "vm_file", "path": f"{PICTURES}/new.png", "dest": "new.png"},
    },
}  # fmt: skip


@pytest.mark.parametrize("solved", [True, False], ids=["solved", "nothing"])
def test_vm_wallpaper(osworld, solved):
    def set_wallpaper(http: Any, sid: str) -> None:
        uri = f"file://{PICTURES}/new.png"
        out = execute(http, sid, f"gsettings set org.gnome.desktop.background picture-uri {uri}")
        assert out["output"]["returncode"] == 0, out

    result = _episode(osworld, WALLPAPER_TASK, set_wallpaper if solved else None)
    if solved:
        assert result["score"] == 1.0, result
    else:
        print(f"untouched wallpaper: compare_images {result['score']}")
        assert result["score"] is not None and result["score"] < 0.5, result
