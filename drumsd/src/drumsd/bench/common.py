"""What every bench shares: the progress callback, the slot limits benches restore with, the quiet
window a cold boot waits for, the nearest-rank percentile and the host arguments (image, image
cache, CRIU). The bench modules import this one and never each other in a circle."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from drumsd.core.seams import SlotLimits

Progress = Callable[[str], None]
QUIET_WINDOW_S = 0.5
BENCH_LIMITS = SlotLimits(vcpus=1.0, memory_mib=2048, pids_max=1024, tmpfs_mib=512)
CACHE_ROOT = Path("/var/cache/drums")
CRIU = Path("/usr/local/sbin/criu")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def add_host_args(parser: argparse.ArgumentParser, image: str, image_help: str) -> None:
    """The image and the host's CRIU and image cache, as every bench takes them."""
    parser.add_argument("--image", default=image, help=image_help)
    parser.add_argument("--cache-root", type=Path, default=CACHE_ROOT)
    parser.add_argument("--criu", type=Path, default=CRIU)
