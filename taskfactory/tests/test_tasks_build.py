"""The build: determinism, counts, file layout, what goes in which file."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

from drums_tasks import FAMILIES, VERIFIER_MODULE, load_all
from drums_tasks.build import (
    DEFAULT_PER_FAMILY,
    MIN_NEAR_MISSES,
    MIN_TASKS,
    build,
    diff_trees,
    generate,
    main,
)
from drums_tasks.spec import solutions_json, task_json
from drums_tasks.verifier import CHECKS


def test_at_least_37_families_over_six_apps() -> None:
    load_all()
    assert len(FAMILIES) >= 37
    assert len({f.app for f in FAMILIES.values()}) >= 6


def test_same_inputs_same_bytes() -> None:
    load_all()
    for name in FAMILIES:
        a_id, a = generate(3, name, 5)
        b_id, b = generate(3, name, 5)
        assert a_id == b_id
        assert a.files == b.files, name
        assert task_json(a, a_id, 3, 5) == task_json(b, b_id, 3, 5), name
        assert solutions_json(a, a_id) == solutions_json(b, b_id), name


def test_different_seeds_differ() -> None:
    load_all()
    differ = sum(generate(1, n, 0)[1].files != generate(2, n, 0)[1].files for n in FAMILIES)
    assert differ >= len(FAMILIES) - 2  # a family may rarely repeat its inputs across seeds


def test_two_builds_are_byte_identical(
    small_build: Path, small_per_family: int, tmp_path: Path
) -> None:
    build(7, tmp_path, per_family=small_per_family, log=lambda _m: None)
    assert diff_trees(small_build, tmp_path) == []


def test_check_flag_detects_no_difference_and_builds(tmp_path: Path) -> None:
    fams = ["calc_set_value", "files_rename"]
    assert (
        main(
            [
                "--seed",
                "1",
                "--out",
                str(tmp_path),
                "--check",
                "--per-family",
                "2",
                "--families",
                *fams,
            ]
        )
        == 0
    )
    assert (tmp_path / "tasks.jsonl").read_text().count("\n") == 4


def test_diff_trees_sees_a_changed_byte(small_build: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(small_build, copy)
    victim = copy / "tasks.jsonl"
    data = bytearray(victim.read_bytes())
    data[10] ^= 1
    victim.write_bytes(bytes(data))
    assert diff_trees(small_build, copy) == ["tasks.jsonl"]


def test_default_size_meets_the_floor() -> None:
    load_all()
    per = max(DEFAULT_PER_FAMILY, math.ceil(MIN_TASKS / len(FAMILIES)))
    assert per * len(FAMILIES) >= MIN_TASKS
    # every task has at least 3 near misses (checked per family below), so the floor holds
    assert 3 * per * len(FAMILIES) >= MIN_NEAR_MISSES


def test_every_task_has_three_near_misses(small_build: Path) -> None:
    for name in FAMILIES:
        for i in range(6):
            assert len(generate(11, name, i)[1].near_misses) >= 3, (name, i)
    for line in (small_build / "solutions.jsonl").open():
        s = json.loads(line)
        assert len(s["near_misses"]) >= 3, s["id"]


def test_index_counts_and_hashes(small_build: Path, small_per_family: int) -> None:
    index = json.loads((small_build / "index.json").read_text())
    assert index["verifier_module"] == VERIFIER_MODULE
    counts = index["counts"]
    assert counts["tasks"] == small_per_family * len(FAMILIES)
    assert sum(f["tasks"] for f in counts["by_family"].values()) == counts["tasks"]
    assert sum(a["tasks"] for a in counts["by_app"].values()) == counts["tasks"]
    sols = [json.loads(x) for x in (small_build / "solutions.jsonl").open()]
    assert counts["near_misses"] == sum(len(s["near_misses"]) for s in sols)
    on_disk = {
        p.relative_to(small_build).as_posix()
        for p in small_build.rglob("*")
        if p.is_file() and p.name != "index.json"
    }
    assert set(index["files"]) == on_disk
    for rel, digest in index["files"].items():
        assert hashlib.sha256((small_build / rel).read_bytes()).hexdigest() == digest


def test_tasks_carry_no_solutions_and_a_complete_evaluator(small_build: Path) -> None:
    tasks = [json.loads(x) for x in (small_build / "tasks.jsonl").open()]
    sols = {json.loads(x)["id"]: json.loads(x) for x in (small_build / "solutions.jsonl").open()}
    assert len({t["id"] for t in tasks}) == len(tasks)
    for t in tasks:
        text = json.dumps(t)
        assert "near_misses" not in text and "oracle" not in text
        assert set(t) >= {"id", "instruction", "config", "evaluator"}
        ev = t["evaluator"]
        assert ev["func"] == "drums_verifier" and ev["module"] == VERIFIER_MODULE
        assert (
            ev["check"] in CHECKS and ev["check_alt"] in CHECKS and ev["check"] != ev["check_alt"]
        )
        results = ev["result"] if isinstance(ev["result"], list) else [ev["result"]]
        dests = [r["dest"] for r in results]
        assert len(set(dests)) == len(dests)
        assert all(r["type"] == "vm_file" and r["path"].startswith("/home/user/") for r in results)
        files = [d["file"] for d in ev["options"].get("docs", [])] or (
            [ev["options"]["file"]] if "file" in ev["options"] else []
        )
        assert set(files) <= set(dests)
        assert set(ev["scope"]) == {"roots", "seeded", "allow"}
        assert t["id"] in sols


def test_scope_manifest_hashes_match_the_seeded_assets(small_build: Path) -> None:
    for line in (small_build / "tasks.jsonl").open():
        t = json.loads(line)
        placed = {
            f["path"]: f["src"]
            for step in t["config"]
            if step["type"] == "drums_files"
            for f in step["parameters"]["files"]
        }
        seeded = t["evaluator"]["scope"]["seeded"]
        assert seeded, t["id"]
        for path, digest in seeded.items():
            asset = small_build / "assets" / t["id"] / placed[path]
            assert hashlib.sha256(asset.read_bytes()).hexdigest() == digest
        roots = t["evaluator"]["scope"]["roots"]
        for path in placed:
            assert any(path.startswith(r + "/") for r in roots), (t["id"], path)


def test_actions_use_the_daemon_action_format(small_build: Path) -> None:
    kinds = {"wait", "execute"}
    for line in (small_build / "solutions.jsonl").open():
        s = json.loads(line)
        branches = [s["oracle"], s["scope_probe"], *s["near_misses"]]
        assert s["oracle"]["actions"]
        for b in branches:
            for a in b["actions"]:
                if isinstance(a, str):
                    assert a.startswith("import pyautogui; pyautogui.")
                    compile(a, "<action>", "exec")
                else:
                    assert a["type"] in kinds
                    if a["type"] == "execute":
                        assert isinstance(a["command"], list) and a["command"]


def test_generated_verifier_module_imports_standalone(small_build: Path) -> None:
    path = small_build / f"{VERIFIER_MODULE}.py"
    spec = importlib.util.spec_from_file_location(VERIFIER_MODULE, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[VERIFIER_MODULE] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(VERIFIER_MODULE, None)
    assert set(mod.CHECKS) == set(CHECKS)
    assert not re.search(r"^\s*(from|import) drums_tasks", path.read_text(), re.M)


def test_actions_refuse_text_pyautogui_mistypes() -> None:
    import pytest
    from drums_tasks.actions import write

    with pytest.raises(ValueError, match="mistypes"):
        write('=COUNTIF(A1:A9;"<=5")')
    with pytest.raises(ValueError, match="non-ASCII"):
        write("caf\u00e9")
    assert "pyautogui.write('a>b'" in write("a>b")


def test_set_order_is_by_family_name_and_index(small_build: Path, tmp_path: Path) -> None:
    # Registration order follows which family module imports which; the set must not.
    keys = [
        (t["drums"]["family"], t["drums"]["index"])
        for t in map(json.loads, (small_build / "tasks.jsonl").open())
    ]
    assert keys == sorted(keys)
    out = tmp_path / "two"
    build(0, out, per_family=1, families=["writer_heading", "calc_set_value", "writer_heading"])
    fams = [json.loads(x)["drums"]["family"] for x in (out / "tasks.jsonl").open()]
    assert fams == ["calc_set_value", "writer_heading"]
