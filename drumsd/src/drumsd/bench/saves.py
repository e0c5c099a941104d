"""`drumsd bench --saves`: a save of a desktop that changed one document since its restore,
stored full and as what changed since the checkpoint it was restored from (`save_delta_depth`),
in the same run, the two in alternating order each round so host load falls on both alike.

The desktop is restored from a saved state of itself (the parent). Per round: one document
written (a line appended to ~/Documents/notes.txt and the same line typed in the focused
window), then a full capture and a delta capture of it: each one's wall (the runtime's capture:
CRIU's dump with the upper copied, the comparison with the parent and its pack for a delta, the
upper's hash), CRIU's dump alone, the bytes its directory alone holds; then two restores of
each until the agent answers: the first copies its images onto the runtime's tmpfs (a delta's
page images are assembled there), the second reads that copy. Medians; table + JSON."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from drumsd.bench.common import (
    BENCH_LIMITS,
    CACHE_ROOT,
    CRIU,
    Progress,
    bench_runtime,
    host_facts,
    options_json,
    publish,
    stderr_progress,
)
from drumsd.bench.dump_phases import dump_phases
from drumsd.core.save_delta import parse_pagemap
from drumsd.core.seams import CheckpointRef, RuntimeError_, SaveParent, SlotHandle
from drumsd.linux import state_files

MODES = ("full", "delta")
TARGET_BYTES = 0.15  # issue 35: a delta save <= 15% of a full dump's bytes
TARGET_TIME = 0.50  # ... and <= 50% of its time
DEPTH = 8  # the daemon's default save_delta_depth


@dataclass(frozen=True)
class SaveBenchOptions:
    image: str = "office"
    cache_root: Path = CACHE_ROOT
    state_dir: Path = Path("/run/drums-bench")
    criu: Path = CRIU
    profile: str = "hardened"
    apps: Sequence[str] = ("libreoffice --calc --norestore",)
    rounds: int = 5
    out: Path = Path("bench-saves.json")
    ksm: bool = True  # a merge by ksmd counts as a write to write tracking (write_track.py)
    track_writes: bool = False  # the saved desktop armed (linux.track_writes): a tracked delta


async def _change_document(rt: Any, h: SlotHandle, line: str) -> None:
    cmd = f"mkdir -p ~/Documents && echo '{line}' >> ~/Documents/notes.txt"
    await rt.exec_user(h, cmd, 20.0)
    await rt.step(h, {"type": "type", "text": f"{line}\n"})
    await trio.sleep(1.0)  # the app's redraw and its own writes settle, as before a save


async def _restore(rt: Any, ref: CheckpointRef, slot_id: str) -> tuple[float, float]:
    """Wall until the agent answers, and the CPU of criu and the restored tree until then."""
    t0 = time.monotonic()
    h = await rt.restore(slot_id, ref, BENCH_LIMITS)
    took = time.monotonic() - t0
    await rt.screenshot(h)  # it answers: restored whole
    await rt.destroy(h.slot_id)
    return took, float(h.extra.get("phases", {}).get("restore_cpu", 0.0))


async def one_save(
    rt: Any, h: SlotHandle, mode: str, dest: Path, parent: Path, tag: str
) -> dict[str, Any]:
    against = SaveParent(parent, DEPTH) if mode == "delta" else None
    t0 = time.monotonic()
    ref = await rt.capture(h, f"bench-save-{tag}", dest, parent=against)
    capture_s = time.monotonic() - t0
    meta = json.loads((dest / "meta.json").read_text())
    if mode == "delta" and not meta.get("delta"):
        raise RuntimeError(f"{dest}: the delta capture was stored full")
    got: dict[str, Any] = {
        "capture_s": capture_s,
        "dump_s": float(meta["dump_s"]),
        "bytes": state_files.dir_usage(dest).apparent_bytes,
    }
    got["tracked"] = int(bool(meta.get("tracked")))  # CRIU wrote only the written pages
    if meta.get("delta"):
        d = meta["delta"]
        keys = ["diff_s", "diff_cpu_s", "pages_bytes", "pages_fresh", "pages_stored"]
        keys += ["upper_bytes", "upper_linked"]
        got |= {k: d[k] for k in keys if k in d}
    links = meta.get("upper_links")
    if links:  # linked by the post-dump copy as unchanged since the restore
        got |= {f"upper_links_{k}": links[k] for k in ("files", "bytes", "recorded", "took_s")}
    shm = meta.get("shm_holes")
    if shm:  # what CRIU would have written of the SysV segments, and the zero pages it did not
        got |= {"shm_data_bytes": shm["data_bytes"], "shm_removed_bytes": shm["removed_bytes"]}
        got["shm_holes_s"] = shm["took_s"]
    got["shm_written_bytes"] = shm_pages_bytes(dest / "images")
    with contextlib.suppress(OSError):
        log = (dest / "images" / "dump.log").read_text(errors="replace")
        got |= {f"criu {k}": v for k, v in dump_phases(log).items()}
    got["restore_first_s"], _ = await _restore(rt, ref, f"bench-sv-{tag}-1")
    got["restore_cached_s"], got["restore_cpu_s"] = await _restore(rt, ref, f"bench-sv-{tag}-2")
    await rt.forget_checkpoint(ref.id)  # its tmpfs copy goes
    shutil.rmtree(dest, ignore_errors=True)
    return got


def shm_pages_bytes(images: Path) -> int:
    """Bytes of the shared-memory page images CRIU wrote (SysV segments, memfds, shared
    anonymous memory: `pagemap-shmem-*.img`)."""
    total = 0
    for pm in images.glob("pagemap-shmem-*.img"):
        with contextlib.suppress(OSError, ValueError):
            total += parse_pagemap(pm.read_bytes(), pm.name).size
    return total


def summarize_mode(rounds: list[dict[str, Any]]) -> dict[str, float]:
    keys = sorted({k for r in rounds for k in r})
    return {k: round(statistics.median(float(r[k]) for r in rounds if k in r), 4) for k in keys}


async def run_save_bench(opts: SaveBenchOptions, progress: Progress = print) -> dict[str, Any]:
    from drumsd.linux.image import find_image
    from drumsd.runtime.linux import LinuxRuntimeConfig

    image = find_image(opts.image, opts.cache_root)
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    cfg = LinuxRuntimeConfig(
        state_dir=opts.state_dir,
        criu=opts.criu,
        profile=opts.profile,
        spares_per_checkpoint=0,
        ksm=opts.ksm,
        track_writes=opts.track_writes,
    )
    results: dict[str, Any] = {
        "host": host_facts(opts.state_dir),
        "image": {"profile": image.profile, "sha256": image.sha256},
        "options": options_json(opts),
    }
    ck_dir = opts.state_dir / "checkpoints" / f"bench-saves-{uuid.uuid4().hex[:6]}"
    rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    failed: dict[str, list[str]] = {m: [] for m in MODES}
    async with bench_runtime(cfg) as rt:
        try:
            progress(f"template of {image.profile} with {list(opts.apps)} ...")
            template = await rt.make_template(
                image.root, image.sha256, "bench-saves", ck_dir / "template", apps=opts.apps
            )
            first = await rt.restore("bench-sv-first", template, BENCH_LIMITS)
            await rt.quiescent(first, 0.5, 60.0, cfg.quiesce_poll_ms)
            parent = await rt.capture(first, "bench-save-parent", ck_dir / "parent")
            await rt.destroy(first.slot_id)
            h = await rt.restore("bench-sv", parent, BENCH_LIMITS)
            await rt.quiescent(h, 0.5, 60.0, cfg.quiesce_poll_ms)
            for r in range(opts.rounds):
                await _change_document(rt, h, f"round {r + 1}: one line more")
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    progress(f"round {r + 1}/{opts.rounds}: {mode} save ...")
                    dest = ck_dir / f"{mode}-{r}"
                    try:
                        got = await one_save(rt, h, mode, dest, parent.dir, f"{mode}{r}")
                    except RuntimeError_ as exc:  # a dump CRIU refused: counted, not measured
                        progress(f"  failed: {exc.message[:300]}")
                        failed[mode].append(exc.message)
                        shutil.rmtree(dest, ignore_errors=True)
                        continue
                    progress(
                        f"  {got['capture_s']:.3f} s, {got['bytes'] / (1 << 20):.1f} MiB; "
                        f"restores {got['restore_first_s']:.3f} s then "
                        f"{got['restore_cached_s']:.3f} s"
                    )
                    rounds[mode].append(got)
        finally:
            with trio.CancelScope(shield=True):
                for slot_id in ("bench-sv", "bench-sv-first"):
                    await rt.destroy(slot_id)
                for cp in ("bench-save-parent", "bench-saves"):
                    await rt.forget_checkpoint(cp)
                shutil.rmtree(ck_dir, ignore_errors=True)
    results["host"]["loadavg_end"] = os.getloadavg()
    results["rounds"] = rounds
    results["failed"] = failed
    if not all(rounds.values()):
        raise RuntimeError(f"no save of some kind was measured: {failed}")
    modes = {m: summarize_mode(rounds[m]) for m in MODES}
    results["modes"] = modes
    full, delta = modes["full"], modes["delta"]
    results["ratios"] = {
        k: round(delta[k] / full[k], 3)
        for k in (
            "bytes",
            "capture_s",
            "dump_s",
            "restore_first_s",
            "restore_cached_s",
            "restore_cpu_s",
        )
        if full.get(k)
    }
    results["targets"] = {
        f"bytes<={TARGET_BYTES}": results["ratios"]["bytes"] <= TARGET_BYTES,
        f"time<={TARGET_TIME}": results["ratios"]["capture_s"] <= TARGET_TIME,
    }
    return results


def render_saves(r: dict[str, Any]) -> str:
    """Full beside delta: medians over the rounds, and delta / full."""
    o = r["options"]
    rows = [
        ("stored (MiB, what its dir alone holds)", "bytes", 1 / (1 << 20)),
        ("save wall (s)", "capture_s", 1.0),
        ("  CRIU dump with upper copy (s)", "dump_s", 1.0),
        ("  comparison, pack, links (s)", "diff_s", 1.0),
        ("  the same, CPU of its thread (s)", "diff_cpu_s", 1.0),
        ("first restore, images to tmpfs (s)", "restore_first_s", 1.0),
        ("restore from the tmpfs copy (s)", "restore_cached_s", 1.0),
        ("  CPU of criu and the tree until it answers (s)", "restore_cpu_s", 1.0),
    ]
    head = f"save after one document changed, {o['image']} {o['apps']}, median of {o['rounds']}"
    w = max(len(head), *(len(a) for a, _, _ in rows))
    lines = [f"{head:<{w}}" + "".join(f"{m:>10}" for m in (*MODES, "ratio"))]
    for label, key, scale in rows:
        cells = [r["modes"][m].get(key) for m in MODES]
        shown = "".join(f"{c * scale:>10.3f}" if c is not None else f"{'-':>10}" for c in cells)
        ratio = r["ratios"].get(key)
        lines.append(f"{label:<{w}}{shown}" + (f"{ratio:>10.3f}" if ratio is not None else ""))
    phases = sorted(
        {k for m in MODES for k in r["modes"][m] if k.startswith("criu ") and k != "criu total"}
    )
    if phases:
        lines.append("CRIU's dump from its log (s):")
        for key in (*phases, "criu total"):
            cells = [r["modes"][m].get(key) for m in MODES]
            shown = "".join(f"{c:>10.3f}" if c is not None else f"{'-':>10}" for c in cells)
            lines.append(f"  {key.removeprefix('criu '):<{w - 2}}{shown}")
    f = r["modes"]["full"]
    if "shm_data_bytes" in f:
        lines.append(
            "shared memory per dump: {:.2f} MiB allocated, {:.2f} MiB of zero pages made holes "
            "({:.3f} s frozen), {:.2f} MiB written".format(
                f["shm_data_bytes"] / (1 << 20),
                f["shm_removed_bytes"] / (1 << 20),
                f.get("shm_holes_s", 0.0),
                f.get("shm_written_bytes", 0) / (1 << 20),
            )
        )
    d = r["modes"]["delta"]
    if "pages_bytes" in d:
        fresh, pages, stored = (
            d[k] / (1 << 20) for k in ("pages_fresh", "pages_bytes", "pages_stored")
        )
        lines.append(
            f"delta pages: {fresh:.1f} of {pages:.1f} MiB differ from the parent's, stored in "
            f"{stored:.1f} MiB (zstd)"
        )
    lines.append("targets: " + ", ".join(f"{k} {v}" for k, v in r["targets"].items()))
    return "\n".join(lines)


def main_save_bench(opts: SaveBenchOptions) -> int:
    results = trio.run(run_save_bench, opts, stderr_progress)
    publish(results, render_saves(results), opts.out)
    return 0 if all(results["targets"].values()) else 1
