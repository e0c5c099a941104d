"""drums_tasks.validate against a real drumsd (Linux runtime, `office` image).

A bounded sample of the task factory's tasks (one of Calc, Writer and the terminal) goes through
the whole validator: create on the task, gates, fork into no-op, oracle, every near miss and the
scope probe, act in each child, verify each. Every sampled task must be accepted, or its
rejection must name why after every branch ran (a daemon failure is never an explanation).
About 40 s per task on a 2-core host, plus a one-off template checkpoint of the image.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_daemon import Daemon, require_live
from validator_fixture import (
    build_set,
    install_set,
    run_validation,
    start_validator_daemon,
    stop_validator_daemon,
)

# One family per app, cheap ones: Calc, Writer, the terminal.
FAMILIES = {
    "calc_set_value": "libreoffice_calc",
    "writer_bold_paragraph": "libreoffice_writer",
    "term_sort_unique": "os",
}


@pytest.fixture(scope="module")
def validator_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    require_live("office")
    tmp = tmp_path_factory.mktemp("validator")
    build = build_set(tmp / "build", seed=1, per_family=1, families=list(FAMILIES))
    root = Path(f"/run/drums-validator-{os.getpid()}")
    installed = install_set(build, root)
    daemon = start_validator_daemon(installed, tmp / "daemon")
    try:
        yield daemon, installed
    finally:
        stop_validator_daemon(daemon)
        shutil.rmtree(root, ignore_errors=True)


def test_validator_accepts_or_explains_a_sample(
    validator_host: tuple[Daemon, Path], tmp_path: Path
) -> None:
    daemon, installed = validator_host
    report = tmp_path / "report.jsonl"
    started = time.monotonic()
    summary = run_validation(daemon.url, daemon.token, installed, report, 1, list(FAMILIES))
    wall = time.monotonic() - started
    verdicts: list[dict[str, Any]] = [json.loads(line) for line in report.read_text().splitlines()]
    print(f"validated {len(verdicts)} tasks in {wall:.1f}s: {json.dumps(summary)}")

    tasks = {json.loads(line)["id"]: json.loads(line) for line in open(installed / "tasks.jsonl")}
    assert sorted(v["family"] for v in verdicts) == sorted(FAMILIES)
    assert {tasks[v["id"]]["snapshot"] for v in verdicts} == set(FAMILIES.values())
    for v in verdicts:
        branches = {b["name"]: b for b in v["branches"]}
        line = f"{v['family']} {v['id']} {v['seconds']:.1f}s"
        # Every branch ran: no-op, oracle, at least one near miss, the scope probe.
        assert {"noop", "oracle", "scope_probe"} <= set(branches), f"{line}: {v['reasons']}"
        assert any(name.startswith("near:") for name in branches), line
        if v["accepted"]:
            print(f"{line} accepted ({len(branches)} branches)")
            assert v["reasons"] == []
            assert branches["oracle"]["score"] == 1.0 and branches["noop"]["score"] == 0.0
            assert "scope_violation" in branches["scope_probe"]["flags"]
        else:
            print(f"{line} REJECTED: {v['reasons']}")
            assert v["reasons"] and all(r.strip() for r in v["reasons"]), line
    assert summary["tasks"] == len(verdicts)
    assert summary["accepted"] == sum(v["accepted"] for v in verdicts)
