"""Each test run here writes its result for the trainer matrix (docs/trainer-matrix.json).

conftest.py hooks `record` into pytest's report of every test's call phase, in the workspace run
and in the trainer venvs' runs of the *_check.py modules alike. One JSON file a test and mode
(fake drumsd or live desktops) under build/trainer-matrix/ (DRUMS_MATRIX_RESULTS overrides):
the outcome, the date, the seconds, the versions of the trainer packages installed where it ran,
and what the test recorded with pytest's `record_property` (its key figures).
scripts/render_trainer_matrix.py --update folds them into docs/trainer-matrix.json and renders
the docs' table from it.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import json
import os
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# the distributions whose versions a matrix row names
PACKAGES = ("verl", "transferqueue", "skyrl-train", "skyrl", "skyrl-gym", "verifiers", "mcp",
            "openai", "prime-rl", "prime-rl-configs", "torch", "ray", "transformers")  # fmt: skip
# set by the live runs of the trainer checks: the desktops are real
LIVE_VARS = ("DRUMS_VERL_LIVE_TASK", "DRUMS_SKYRL_LIVE_TASK", "DRUMS_SKYRL_VLM_LIVE_TASK")


def results_dir() -> Path:
    return Path(os.environ.get("DRUMS_MATRIX_RESULTS") or REPO / "build" / "trainer-matrix")


@functools.cache
def installed_versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def check_id(nodeid: str) -> str:
    """`verifiers_env/tests/verl_check.py::test_x[p]` -> `verl_check.py::test_x[p]`."""
    path, _, name = nodeid.partition("::")
    return f"{Path(path).name}::{name}"


def mode(live_marker: bool) -> str:
    return "live" if live_marker or any(os.environ.get(v) for v in LIVE_VARS) else "fake"


def record(report: Any, live_marker: bool) -> Path | None:
    """Write the result of one test (its call phase, or a skip at set-up)."""
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return None
    check = check_id(report.nodeid)
    run_mode = mode(live_marker)
    facts = {key: value for key, value in report.user_properties}
    result = {
        "check": check,
        "mode": run_mode,
        "outcome": report.outcome,
        "date": datetime.date.today().isoformat(),
        "seconds": round(report.duration, 1),
        "versions": installed_versions(),
        "facts": facts,
    }
    if report.skipped and isinstance(report.longrepr, tuple):
        result["skip_reason"] = str(report.longrepr[2]).removeprefix("Skipped: ")
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^\w.-]+", "_", check)
    path = out / f"{name}.{run_mode}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    return path
