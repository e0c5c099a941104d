"""`drumsd bench episodes`' options: what the run, the host side and the report all read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from drumsd.bench.common import CACHE_ROOT, CRIU


@dataclass(frozen=True)
class EpisodeBenchOptions:
    image: str = "office"
    cache_root: Path = CACHE_ROOT
    criu: Path = CRIU
    tasks_dir: Path = Path("examples/tasks")
    tasks: Sequence[str] = ()  # task ids (or id prefixes) of tasks_dir; empty = all of them
    episodes: int = 12  # per path
    concurrency: int = 2
    steps: int = 20
    task_resets: int = 3  # per task, per path
    phase_episodes: int = 6  # per path, one at a time, CPU read between phases (0: none)
    cold_boots: int = 3  # office boots vary (1.2 s to 6 s seen): a median of 3
    skip_boot: bool = False
    # The warm-up: one short episode on the first task (False), or two on every task of the mix
    # (True), so the timed episodes find each task's checkpoint and spares as a long run's do.
    warm_each_task: bool = False
    alive_after_s: float = 1.0
    background_s: float = 3.0
    state_root: Path = Path("/run/drums-bench-episodes")
    # Each daemon's state_dir on a tmpfs of its own, as a deployment has it (DESIGN: "state_dir
    # (tmpfs for slots)"; the NixOS module mounts one), whatever the state root is on (False:
    # on the state root's own filesystem, e.g. to measure a disk-backed state_dir).
    state_tmpfs: bool = True
    out: Path = Path("bench-episodes.json")
    keep_logs: bool = False
    ramp: Sequence[int] = ()  # the density ramp's concurrency levels (empty: no ramp)
    ramp_rounds: int = 2  # episodes per concurrent worker at each level of the ramp
    ramp_config: str = ""  # JSON merged into the ramp daemon's config (an A/B's arm)
    profile: bool = False  # with ramp: what each level's slow steps overlapped (episodes_profile)
    profile_interval_s: float = 0.1  # the profile's sampling period
    features_off: str = "33"  # whose features the `features off` path switches off: 33, 35, all
