"""Reconcile's sweep of checkpoint directories: what no record names goes, the rest stays."""

from __future__ import annotations

from pathlib import Path

from drumsd.linux.state_files import sweep_unowned_dirs


def test_dirs_no_record_names_are_removed_and_named(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for name in ("tpl-base-1", "st-kept", "tk-orphan", "pf-orphan", "bench-abc"):
        (root / name / "images").mkdir(parents=True)
    (root / "a-file").write_text("not a checkpoint")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    keep = {root / "tpl-base-1", tmp_path / "checkpoints" / "." / "st-kept"}
    removed = sweep_unowned_dirs(root, keep, ("bench-",))
    assert removed == ["pf-orphan", "tk-orphan"]
    assert sorted(p.name for p in root.iterdir()) == [
        "a-file",
        "bench-abc",
        "link",
        "st-kept",
        "tpl-base-1",
    ]
    assert outside.is_dir()


def test_a_missing_root_sweeps_nothing(tmp_path: Path) -> None:
    assert sweep_unowned_dirs(tmp_path / "none", set(), ()) == []
