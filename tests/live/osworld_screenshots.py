"""Screenshots of each app open on the osworld image, for docs/image.md, taken through the
daemon's screenshot API: one fresh slot per app (a restore of the template), the app launched
as the desktop user, its window waited for, then GET /v1/slots/{id}/screenshot.

    DRUMS_LIVE_IMAGES_DIR=... .venv/bin/python tests/live/osworld_screenshots.py docs/images

Prints one line per app (window found, seconds until it showed) and writes <dir>/osworld-*.png.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_daemon import http_client, start_live_daemon, stop_and_clean

# name -> (launch command, a window class xdotool finds once the app has drawn)
APPS: dict[str, tuple[str, str]] = {
    "desktop": ("true", ""),
    "files": ("nautilus --new-window /home/user", "org.gnome.Nautilus"),
    "terminal": ("gnome-terminal", "gnome-terminal"),
    "text-editor": ("gedit", "gedit"),
    "chrome": ("google-chrome about:blank", "chromium"),
    "thunderbird": ("thunderbird", "thunderbird"),
    "vlc": ("vlc", "vlc"),
    "calc": ("libreoffice --calc --norestore", "libreoffice"),
    "writer": ("libreoffice --writer --norestore", "libreoffice"),
    "impress": ("libreoffice --impress --norestore", "libreoffice"),
    "gimp": ("gimp", "gimp"),
}
SETTLE_S = 4.0  # after the window maps: let the app finish drawing its first frame


def step(http, sid: str, command: str) -> dict:
    action = {"type": "execute", "command": command}
    r = http.post(f"/v1/slots/{sid}/step", json={"action": action})
    if r.status_code != 200:
        raise RuntimeError(f"step {command!r} on {sid}: {r.status_code} {r.text}")
    return r.json()


def shoot(http, name: str, command: str, wm_class: str, out: Path) -> str:
    sid = http.post("/v1/slots", json={}).json()["id"]
    try:
        step(http, sid, f"setsid -f sh -c '{command}' >/dev/null 2>&1")
        started = time.monotonic()
        found = not wm_class
        while not found and time.monotonic() - started < 90:
            probe = step(http, sid, f"xdotool search --onlyvisible --class {wm_class}")
            found = probe["output"]["returncode"] == 0
            if not found:
                time.sleep(0.5)
        shown_s = time.monotonic() - started
        time.sleep(SETTLE_S)
        r = http.get(f"/v1/slots/{sid}/screenshot")
        r.raise_for_status()
        (out / f"osworld-{name}.png").write_bytes(r.content)
        return f"{name}: window {'shown' if found else 'NOT found'} after {shown_s:.1f} s"
    finally:
        http.delete(f"/v1/slots/{sid}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=Path("docs/images"))
    parser.add_argument("--image", default="osworld")
    parser.add_argument("--app", action="append", choices=sorted(APPS), help="default: all")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="drums-osworld-shots-"))
    daemon = start_live_daemon(tmp, image=args.image)
    try:
        with http_client(daemon, timeout=180) as http:
            for name in args.app or APPS:
                command, wm_class = APPS[name]
                print(shoot(http, name, command, wm_class, args.out), flush=True)
    finally:
        stop_and_clean(daemon, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
