"""The console's load check: a real `drumsd serve` (in-memory runtime) with 200 slots, idle for a
window, then watched by Chromium's console for the same window; the console's cost is the
difference in the daemon's CPU time (utime+stime of its process, every thread), same run.

Opt-in (DRUMS_CONSOLE_LOAD=1: about a minute) and needs /usr/bin/chromium. Prints a table and,
with DRUMS_BENCH_OUT=path, writes the figures as JSON (docs/bench/console-load.json).
The in-memory runtime's screens are small synthetic PNGs: what this measures is the console's
own work (slot rows, host panel, thumbnail requests, revalidations); scaling a changed real
screen costs `scale_png_ms` each, measured in the same run on a 1280x800 screenshot.
"""

from __future__ import annotations

import io
import json
import os
import random
import statistics
import time
from pathlib import Path

import pytest
from drumsd.api.console_frames import scale_png
from drumsd_process import Daemon, base_config, free_port, write_token
from PIL import Image

SLOTS = 200
WINDOW_S = 12.0
CHROMIUM = Path(os.environ.get("DRUMS_CHROMIUM", "/usr/bin/chromium"))
BUDGET = 0.05  # of one core

pytestmark = pytest.mark.skipif(
    os.environ.get("DRUMS_CONSOLE_LOAD") != "1",
    reason="the console load check is opt-in: DRUMS_CONSOLE_LOAD=1 (about a minute)",
)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cores_used(pid: int, window_s: float) -> float:
    start_cpu, start = cpu_s(pid), time.monotonic()
    time.sleep(window_s)
    return (cpu_s(pid) - start_cpu) / (time.monotonic() - start)


def scale_png_ms(repeats: int = 10) -> float:
    rng = random.Random(7)
    im = Image.frombytes("RGB", (1280, 800), rng.randbytes(1280 * 800 * 3))
    out = io.BytesIO()
    im.save(out, "PNG", compress_level=1)
    png = out.getvalue()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        scale_png(png)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def test_console_with_200_slots_costs_under_5_percent_of_a_core(tmp_path: Path) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    port = free_port()
    token = write_token(tmp_path / "token")
    config = base_config(tmp_path, port)
    (tmp_path / "drumsd.json").write_text(json.dumps(config))
    daemon = Daemon(tmp_path, tmp_path / "drumsd.json", token, f"http://127.0.0.1:{port}")
    daemon.start()
    results: dict[str, object] = {"slots": SLOTS, "window_s": WINDOW_S}
    try:
        with daemon.client() as http:
            for _ in range(SLOTS):
                assert http.post("/v1/slots", json={}).status_code == 201
            assert len(http.get("/v1/slots").json()["slots"]) == SLOTS
        assert daemon.proc is not None
        pid = daemon.proc.pid
        time.sleep(2)  # the creations' gate judging is over
        idle = cores_used(pid, WINDOW_S)
        scenarios = {}
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
            )
            # A usual screen (the cards in view get thumbnails), then one tall enough that
            # every one of the 200 cards is in view.
            for name, viewport in (
                ("1600x1000", {"width": 1600, "height": 1000}),
                ("all_200_in_view", {"width": 1600, "height": 9000}),
            ):
                page = browser.new_page(viewport=viewport)
                page.goto(f"{daemon.url}/console/login")
                page.fill("#token", token)
                page.click("#login")
                page.wait_for_function(
                    "() => document.querySelectorAll('.card img[data-etag]').length >= 12"
                )
                page.wait_for_timeout(2000)
                used = cores_used(pid, WINDOW_S)
                thumbs = page.evaluate(
                    "() => document.querySelectorAll('.card img[data-etag]').length"
                )
                scenarios[name] = {
                    "daemon_cores": round(used, 4),
                    "console_cores": round(used - idle, 4),
                    "cards_with_thumbnail": thumbs,
                }
                page.close()
            browser.close()
        results.update(
            idle_cores=round(idle, 4),
            scenarios=scenarios,
            scale_png_ms=round(scale_png_ms(), 2),
            budget_cores=BUDGET,
        )
    finally:
        daemon.stop()

    print(f"\nconsole load check: {SLOTS} slots, windows of {WINDOW_S:.0f}s, same daemon")
    print(f"{'scenario':<18} {'daemon cores':>12} {'console cores':>14} {'thumbnails':>10}")
    print(f"{'idle (no console)':<18} {results['idle_cores']:>12.4f} {'':>14} {'':>10}")
    for name, s in scenarios.items():
        print(
            f"{name:<18} {s['daemon_cores']:>12.4f} {s['console_cores']:>14.4f}"
            f" {s['cards_with_thumbnail']:>10}"
        )
    print(f"scaling one changed 1280x800 screen: {results['scale_png_ms']} ms (median of 10)")
    if out := os.environ.get("DRUMS_BENCH_OUT"):
        Path(out).write_text(json.dumps(results, indent=1) + "\n")
    for name, s in scenarios.items():
        assert s["console_cores"] < BUDGET, (name, results)
