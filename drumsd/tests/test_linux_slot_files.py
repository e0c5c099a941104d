"""The Linux runtime's file work, on temp dirs: owner.json records, the uid ranges a previous
daemon's instance dirs hold, a restore's outcome read from CRIU's work dir, a dump's files."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from drumsd.linux import checkpoint_files, mounts, process_trees, slot_fs


def test_owner_record_keeps_earlier_fields_across_writes(tmp_path: Path) -> None:
    paths = slot_fs.make_instance_dir(tmp_path, "slot-a-1", "spare:ck", 3)
    slot_fs.write_owner(paths, None, init=(42, 4242))
    slot_fs.write_owner(paths, "slot:a")  # a claim: owner changes, uid range and init stay
    record = json.loads((paths.dir / "owner.json").read_text())
    assert record == {"owner": "slot:a", "uid_index": 3, "init": [42, 4242]}
    assert slot_fs.read_owner(paths.dir) == "slot:a"
    assert not (paths.dir / "owner.json.tmp").exists()


def test_a_missing_or_broken_owner_record_reads_as_empty(tmp_path: Path) -> None:
    assert slot_fs.read_owner_record(tmp_path) == {}
    (tmp_path / "owner.json").write_text("[1, 2")
    assert slot_fs.read_owner_record(tmp_path) == {}
    assert slot_fs.read_owner(tmp_path) is None


def test_held_uid_ranges_are_those_named_by_instance_dirs(tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    assert slot_fs.held_uid_ranges(slots) == set() and slots.is_dir()
    slot_fs.make_instance_dir(tmp_path, "a", "slot:a", 5)
    slot_fs.make_instance_dir(tmp_path, "b", "slot:b", None)  # trusted: no range
    (slots / "c").mkdir()  # no owner.json at all
    assert slot_fs.held_uid_ranges(slots) == {5}
    assert sorted(slot_fs.instance_names(slots)) == ["a", "b", "c"]
    assert slot_fs.instance_names(tmp_path / "absent") == []


def test_teardown_fs_removes_the_dir_and_names_its_range(tmp_path: Path) -> None:
    paths = slot_fs.make_instance_dir(tmp_path, "a", "slot:a", 7)
    (paths.dir / "rw").mkdir()
    assert slot_fs.teardown_fs(paths) == 7
    assert not paths.dir.exists()
    assert slot_fs.teardown_fs(mounts.SlotPaths.of(tmp_path, "gone")) is None


def test_restore_outcome_reads_the_pid_or_the_errors(tmp_path: Path) -> None:
    paths = slot_fs.make_instance_dir(tmp_path, "a", "slot:a", None)
    (tmp_path / "pid").write_text(f"{os.getpid()}\n")
    ok = process_trees.restore_outcome(tmp_path, True, paths)
    os.close(ok.pidfd)
    assert ok.pid == os.getpid() and ok.starttime > 0
    assert slot_fs.read_owner_record(paths.dir)["init"] == [ok.pid, ok.starttime]
    # criu failed: the pidfile (left from a run that failed later) is not trusted.
    (tmp_path / "restore.log").write_text("ok line\n(00.1) Error (criu/cr-restore.c): boom\n")
    (tmp_path / "criu.out").write_text("a\nb\nc\nd\n")
    failed = process_trees.restore_outcome(tmp_path, False)
    assert failed.pid is None
    assert failed.log_errors == ["(00.1) Error (criu/cr-restore.c): boom"]
    assert list(failed.out_tail) == ["b", "c", "d"]


def test_restore_evidence_is_the_inits_log_since_the_restore_and_criu_errors(
    tmp_path: Path,
) -> None:
    """What a failed restore keeps of the slot before its files go: the lines the restored init
    logged after the offset taken at the restore (not the boot's, copied with the upper)."""
    paths = slot_fs.make_instance_dir(tmp_path, "a", "slot:a", None)
    assert process_trees.init_log_size(paths) == 0  # none yet
    log = process_trees.init_log(paths)
    log.parent.mkdir(parents=True)
    log.write_text('{"msg": "ready"}\n')  # the checkpoint's boot
    since = process_trees.init_log_size(paths)
    said = process_trees.restore_evidence(paths, since)
    assert said == "desktop-init.log since the restore: nothing"  # died without a word
    with open(log, "a") as f:
        f.writelines(f"line {i}\n" for i in range(8))
        f.write("Traceback: OSError boom\n")
    (paths.rw / "criu").mkdir(parents=True)
    noise = "".join(  # what every plain restore logs of its netns's iptables execs
        f'Error (criu/util.c:642): execvp("{b}", ...) failed: Permission denied\n'
        f"1: Error (criu/util.c:1723): {b} -V failed\n"
        for b in ("iptables-restore", "iptables-legacy-restore", "ip6tables-restore")
    )
    (paths.rw / "criu" / "restore.log").write_text(
        f"fine\n{noise}Error: ipv4: Address already assigned.\n"
        "Error: ipv6: address already assigned.\n(00.2) Error (criu/files.c): no fd\n"
    )
    said = process_trees.restore_evidence(paths, since)
    assert said == (
        "desktop-init.log since the restore: line 3 | line 4 | line 5 | line 6 | line 7 | "
        "Traceback: OSError boom; criu restore.log errors: (00.2) Error (criu/files.c): no fd"
    )


def test_a_dead_process_counts_as_kill_pending_and_a_live_one_does_not() -> None:
    assert process_trees.kill_pending(2**22 + 1)  # no such pid
    assert not process_trees.kill_pending(os.getpid())


def test_a_failed_dump_is_removed_with_its_log_errors(tmp_path: Path) -> None:
    dest = tmp_path / "ck"
    script = checkpoint_files.prepare_dump(dest, tmp_path / "upper")
    assert checkpoint_files.holds_checkpoint(dest) and script.stat().st_mode & 0o777 == 0o700
    assert not checkpoint_files.dump_written(dest)
    (dest / "images" / "dump.log").write_text("Error (criu/cr-dump.c): unix socket\n")
    assert checkpoint_files.discard_failed_dump(dest) == ["Error (criu/cr-dump.c): unix socket"]
    assert not dest.exists()


def test_meta_update_keeps_the_dump_fields(tmp_path: Path) -> None:
    checkpoint_files.write_meta(tmp_path, {"id": "ck", "dump_s": 1.5})
    checkpoint_files.update_meta(tmp_path, boot_s=9.25)
    assert json.loads((tmp_path / "meta.json").read_text()) == {
        "id": "ck",
        "dump_s": 1.5,
        "boot_s": 9.25,
    }


def test_exit_text_says_how_a_process_ended() -> None:
    """What a quarantine reason says of a slot's init (wait statuses as os.waitpid gives them)."""
    child = subprocess.Popen(["sh", "-c", "exit 3"])
    _, status = os.waitpid(child.pid, 0)
    assert process_trees.exit_text(status) == "exited with code 3"
    child = subprocess.Popen(["sleep", "30"])
    os.kill(child.pid, 9)
    _, status = os.waitpid(child.pid, 0)
    assert process_trees.exit_text(status) == "killed by SIGKILL"
    assert "not this daemon's child" in process_trees.exit_text(None)
    assert process_trees.reap_nohang(os.getpid()) is None  # not our child
