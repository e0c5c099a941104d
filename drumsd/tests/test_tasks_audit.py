"""The reward audit: each flag fires on a checker or episode made to earn it, with real checker
processes in the checker venv and a directory-backed fake slot and upper layer."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from drumsd.tasks.audit import (
    EpisodeFacts,
    full_disk_reason,
    scan_scope,
    trusted_verdict,
    verify,
)
from drumsd.tasks.model import ScopeManifest, Task, TaskContext, find_task, resolve_task
from drumsd.tasks.testing import DirSlot, checker_context

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "osworld"

VERIFIER = """
import os, time

def _read(paths):
    p = paths.get("out.txt")
    return open(p).read() if p and os.path.exists(p) else None

def main(paths, options):
    return 1.0 if _read(paths) == "done" else 0.0

def main_raw(paths, options):
    p = paths.get("out.txt")
    return 1.0 if p and open(p, "rb").read() == b"done" else 0.0

def disagree(paths, options):
    return 1.0 - main(paths, options)

def flips(paths, options):
    # Answers 1, then 0, then 1 ...: a counter kept where the unprivileged uid can write.
    counter = os.path.join(options["state"], "n")
    n = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(n + 1))
    return float(n % 2 == 0)

def hangs(paths, options):
    time.sleep(600)

def raises(paths, options):
    raise RuntimeError("checker bug")

CHECKS = {f.__name__: f for f in (main, main_raw, disagree, flips, hangs, raises)}
"""


@pytest.fixture(scope="session")
def venv_ctx() -> TaskContext:
    return checker_context()


@pytest.fixture
def shared_state() -> Iterator[Path]:
    # tmp_path's parents are 0700: the checker's uid could not reach a file there.
    state = Path(tempfile.mkdtemp(prefix="drums-audit-test-"))
    state.chmod(0o777)
    yield state
    shutil.rmtree(state, ignore_errors=True)


def setup_case(
    venv_ctx: TaskContext, tmp_path: Path, check: str = "main", check_alt: str | None = "main_raw",
    scope: dict | None = None, options: dict | None = None,
) -> tuple[Task, DirSlot, TaskContext]:  # fmt: skip
    slot = DirSlot(tmp_path / "slot")
    verifiers = tmp_path / "verifiers"
    verifiers.mkdir()
    (verifiers / "drums_verifier_audit.py").write_text(VERIFIER)
    ctx = venv_ctx.model_copy(
        update={"user_home": str(slot.home), "verifier_dirs": [verifiers], "eval_timeout_s": 3.0}
    )
    evaluator = {
        "func": "drums_verifier",
        "module": "drums_verifier_audit",
        "check": check,
        "check_alt": check_alt,
        "options": options or {},
        "result": {"type": "vm_file", "path": f"{slot.home}/Desktop/out.txt", "dest": "out.txt"},
    }
    if scope is not None:
        evaluator["scope"] = scope
    task = resolve_task({"id": "audit-1", "evaluator": evaluator}, [])
    return task, slot, ctx


def upper_with(tmp_path: Path, files: dict[str, bytes]) -> Path:
    upper = tmp_path / "upper"
    for path, data in files.items():
        target = upper / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    upper.mkdir(exist_ok=True)
    return upper


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_a_clean_valid_episode_is_trusted(venv_ctx: TaskContext, tmp_path: Path) -> None:
    scope = {"roots": ["/home/user"], "allow": ["/home/user/Desktop/out.txt"]}
    task, slot, ctx = setup_case(venv_ctx, tmp_path, scope=scope)
    (slot.home / "Desktop" / "out.txt").write_text("done")
    upper = upper_with(tmp_path, {"/home/user/Desktop/out.txt": b"done"})
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True, upper_dir=upper))
    assert result.score == 1.0 and result.audit.flags == [] and result.trusted is True
    assert result.audit.second_score == 1.0 and result.audit.redundant_score == 1.0
    assert result.audit.checker_s is not None and result.audit.checker_s > 0
    assert result.audit.scope.changed == ["/home/user/Desktop/out.txt"]
    # Not solved: still trusted, with score 0.
    (slot.home / "Desktop" / "out.txt").write_text("no")
    zero = await verify(task, slot, ctx, EpisodeFacts(valid=True, upper_dir=upper))
    assert zero.score == 0.0 and zero.trusted is True


async def test_nondeterministic(venv_ctx: TaskContext, tmp_path: Path, shared_state: Path) -> None:
    task, slot, ctx = setup_case(
        venv_ctx, tmp_path, check="flips", check_alt=None, options={"state": str(shared_state)}
    )
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True))
    assert result.score == 1.0 and result.audit.second_score == 0.0
    assert "nondeterministic" in result.audit.flags and result.trusted is False


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_checker_timeout(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task, slot, ctx = setup_case(venv_ctx, tmp_path, check="hangs", check_alt=None)
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True))
    assert result.score is None and "checker_timeout" in result.audit.flags
    assert result.audit.error_class == "timeout" and result.trusted is False
    assert result.checker_error and "3.0 s" in result.checker_error
    assert result.valid is True and result.invalid_reasons == []


async def test_checker_crash(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task, slot, ctx = setup_case(venv_ctx, tmp_path, check="raises", check_alt=None)
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True))
    assert result.score is None and "checker_crash" in result.audit.flags
    assert "checker bug" in (result.checker_error or "") and result.trusted is False
    # The verifier contract's error row, not an invalid episode: validity stays the gates'.
    assert result.valid is True and result.invalid_reasons == []


async def test_redundant_disagree(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task, slot, ctx = setup_case(venv_ctx, tmp_path, check="main", check_alt="disagree")
    (slot.home / "Desktop" / "out.txt").write_text("done")
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True))
    assert result.score == 1.0 and result.audit.redundant_score == 0.0
    assert "redundant_disagree" in result.audit.flags and result.trusted is False


async def test_scope_violation(venv_ctx: TaskContext, tmp_path: Path) -> None:
    scope = {"roots": ["/home/user"], "allow": ["/home/user/Desktop/*"]}
    task, slot, ctx = setup_case(venv_ctx, tmp_path, scope=scope)
    (slot.home / "Desktop" / "out.txt").write_text("done")
    upper = upper_with(
        tmp_path, {"/home/user/Desktop/out.txt": b"done", "/home/user/.bashrc": b"rm -rf ~"}
    )
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True, upper_dir=upper))
    assert result.score == 1.0  # the audit never changes the score
    assert result.audit.flags == ["scope_violation"] and result.trusted is False
    assert result.audit.scope.violations == ["/home/user/.bashrc"]


async def test_a_failing_getter_makes_the_episode_invalid(
    venv_ctx: TaskContext, tmp_path: Path
) -> None:
    """Issue 36: the result file made unreadable (a directory in its place, as the exploit
    suite's `break` does with a FIFO) is no score and an invalid episode whose reason names the
    getter, the path and the error; before, the read's error escaped verify (a 502)."""
    task, slot, ctx = setup_case(venv_ctx, tmp_path, check="main", check_alt=None)
    (slot.home / "Desktop" / "out.txt").mkdir()
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True))
    assert result.score is None and result.valid is False and result.trusted is False
    assert result.audit.error_class == "getter"
    [reason] = result.invalid_reasons
    assert "getter 'vm_file'" in reason and "Desktop/out.txt" in reason, reason
    assert "directory" in reason.lower(), reason


async def test_a_getter_error_names_the_getter(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task, slot, ctx = setup_case(venv_ctx, tmp_path, check="main", check_alt=None)
    task.evaluator.result = {"type": "cache_file", "path": "out.txt", "dest": "out.txt"}
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True, run_dir=None))
    assert result.valid is False and result.score is None
    assert result.invalid_reasons == [
        "verify failed: getter 'cache_file' (result0, out.txt): cache_file needs the episode's "
        "run dir, which verify was not given"
    ], result.invalid_reasons


class RacedSlot(DirSlot):
    """A slot with a freezer, and an agent process that removes an out-of-scope write from the
    upper layer as soon as the result file is read (it cannot run while the slot is frozen)."""

    def __init__(self, root: Path, stray: Path) -> None:
        super().__init__(root)
        self.stray = stray
        self.is_frozen = False
        self.pending = False
        self.reads: list[tuple[str, bool]] = []

    @contextlib.asynccontextmanager
    async def frozen(self):
        self.is_frozen = True
        try:
            yield True
        finally:
            self.is_frozen = False
            if self.pending:
                self.stray.unlink(missing_ok=True)

    async def read_file(self, path: str) -> bytes:
        self.reads.append((path, self.is_frozen))
        if self.is_frozen:
            self.pending = True
        else:
            self.stray.unlink(missing_ok=True)
        return await super().read_file(path)


async def test_the_scope_scan_sees_the_state_the_getters_read(
    venv_ctx: TaskContext, tmp_path: Path
) -> None:
    """Issue 36, `race`: the getters' files are read and the scope scanned in one frozen
    window; an agent process that undoes its out-of-scope write on the first read of the result
    file is seen. Before, the scan ran after the checkers and found a clean scope."""
    scope = {"roots": ["/home/user"], "allow": ["/home/user/Desktop/out.txt"]}
    task, _, ctx = setup_case(venv_ctx, tmp_path, scope=scope)
    upper = upper_with(tmp_path, {"/home/user/Desktop/out.txt": b"done", "/home/user/x": b"x"})
    slot = RacedSlot(tmp_path / "slot", upper / "home" / "user" / "x")
    (slot.home / "Desktop" / "out.txt").write_text("done")
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True, upper_dir=upper))
    assert result.score == 1.0 and result.audit.scope.violations == ["/home/user/x"], result
    assert result.trusted is False
    assert slot.reads and all(frozen for _, frozen in slot.reads), slot.reads


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_osworld_task_scope_unchecked(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = find_task("e0df059f-28a6-4169-924f-b9623e7184cc", [SHARED])
    slot = DirSlot(tmp_path)
    (slot.home / "Desktop" / "todo_list_Jan_2").mkdir()
    ctx = venv_ctx.model_copy(update={"user_home": str(slot.home)})
    result = await verify(task, slot, ctx, EpisodeFacts(valid=True, last_action="DONE"))
    assert result.score == 1.0 and result.audit.flags == ["scope_unchecked"]
    assert result.trusted is None  # not checked is unknown, never true by default
    invalid = await verify(task, slot, ctx, EpisodeFacts(valid=False, last_action="DONE"))
    assert invalid.score == 1.0 and invalid.valid is False and invalid.trusted is False


def test_trusted_verdict() -> None:
    assert trusted_verdict(True, 1.0, []) is True
    assert trusted_verdict(True, 0.0, []) is True
    assert trusted_verdict(None, 1.0, []) is None
    assert trusted_verdict(True, 1.0, ["scope_unchecked"]) is None
    assert trusted_verdict(True, None, []) is False
    assert trusted_verdict(False, 1.0, []) is False
    assert trusted_verdict(True, 1.0, ["scope_unchecked", "nondeterministic"]) is False


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_scan_scope_seeds_deletions_and_new_dirs(tmp_path: Path) -> None:
    upper = upper_with(
        tmp_path,
        {
            "/home/user/Desktop/seed.csv": b"seed",  # unchanged seed: not a change
            "/home/user/Desktop/edited.csv": b"new",  # seed with other content
            "/home/user/Desktop/report.txt": b"x",  # allowed
            "/home/user/.cache/junk": b"x",  # outside allow
            "/etc/passwd": b"x",  # outside the roots: not watched
        },
    )
    (upper / "home/user/Desktop/newdir").mkdir()
    lower = tmp_path / "lower"
    (lower / "home/user/Desktop").mkdir(parents=True)
    (lower / "home/user/.cache").mkdir()  # in the image: only its new file is a change
    manifest = ScopeManifest(
        roots=["/home/user"],
        seeded={
            "/home/user/Desktop/seed.csv": sha(b"seed"),
            "/home/user/Desktop/edited.csv": sha(b"old"),
            "/home/user/Desktop/gone.csv": sha(b"gone"),  # deleted by the agent
        },
        allow=["/home/user/Desktop/report.txt", "/home/user/Desktop/newdir/**"],
    )
    report = scan_scope(upper, manifest, lower)
    assert report.seeds_intact == ["/home/user/Desktop/seed.csv"]
    assert report.changed == [
        "/home/user/.cache/junk",
        "/home/user/Desktop/edited.csv",
        "/home/user/Desktop/gone.csv",
        "/home/user/Desktop/newdir/",
        "/home/user/Desktop/report.txt",
    ]
    assert report.violations == [
        "/home/user/.cache/junk",
        "/home/user/Desktop/edited.csv",
        "/home/user/Desktop/gone.csv",
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="a whiteout is a 0/0 character device: needs root")
def test_scan_scope_sees_whiteouts(tmp_path: Path) -> None:
    upper = upper_with(tmp_path, {})
    (upper / "home/user").mkdir(parents=True)
    os.mknod(upper / "home/user/notes.txt", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    report = scan_scope(upper, ScopeManifest(roots=["/home/user"], allow=[]))
    assert report.violations == ["/home/user/notes.txt"]


def test_scan_scope_never_follows_a_root_swapped_for_a_link(tmp_path: Path) -> None:
    """Issue 39, D4: ~/Documents replaced by a link to a host directory listed the host (the
    daemon's state dir, /usr: 123,783 paths). The link is the change; nothing behind it is."""
    host = tmp_path / "host-secrets"
    (host / "deep").mkdir(parents=True)
    (host / "deep" / "token").write_text("x")
    upper = upper_with(tmp_path, {"/home/user/Desktop/a.txt": b"a"})
    (upper / "home/user/Documents").symlink_to(host)  # the root itself
    (upper / "home/user/Desktop/sub").symlink_to(host)  # a link inside a root
    (upper / "home/user/Desktop/fifo").symlink_to("/dev/null")  # never opened
    manifest = ScopeManifest(roots=["/home/user/Documents", "/home/user/Desktop"], allow=[])
    report = scan_scope(upper, manifest)
    assert report.checked
    assert report.changed == [
        "/home/user/Desktop/a.txt",
        "/home/user/Desktop/fifo",
        "/home/user/Desktop/sub",
        "/home/user/Documents",
    ]
    assert not any("token" in p or "deep" in p for p in report.changed)


def test_scan_scope_sees_a_link_above_a_root(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "Documents").mkdir(parents=True)
    (host / "Documents" / "x").write_text("x")
    upper = tmp_path / "upper"
    (upper / "home").mkdir(parents=True)
    (upper / "home/user").symlink_to(host)
    report = scan_scope(upper, ScopeManifest(roots=["/home/user/Documents"], allow=[]))
    assert report.changed == ["/home/user"] and report.violations == ["/home/user"]


def test_scan_scope_lists_a_bounded_number_of_paths(tmp_path: Path) -> None:
    from drumsd.tasks import audit

    upper = upper_with(tmp_path, {})
    many = upper / "home/user/Documents"
    many.mkdir(parents=True)
    for i in range(audit.MAX_LISTED + 50):
        (many / f"f{i:04d}").write_bytes(b"")
    report = scan_scope(upper, ScopeManifest(roots=["/home/user"], allow=[]))
    assert len(report.changed) == len(report.violations) == audit.MAX_LISTED
    assert report.changed_total == report.violations_total == audit.MAX_LISTED + 50
    assert len(report.model_dump_json()) < 64 * 1024


async def test_second_run_and_redundant_checker_run_at_once(
    venv_ctx: TaskContext, tmp_path: Path
) -> None:
    # Each call waits until the other audit call has started: one after the other, the first
    # would wait alone until its deadline and the audit would show a checker timeout.
    from drumsd.tasks.checker import CheckerOutcome

    task, slot, ctx = setup_case(venv_ctx, tmp_path)
    (slot.home / "Desktop" / "out.txt").write_text("done")
    calls: list[str] = []
    both_started = trio.Event()

    async def run(call: Any) -> CheckerOutcome:
        calls.append(repr(call)[:40])
        if len(calls) == 3:
            both_started.set()
        if len(calls) > 1:
            with trio.move_on_after(5) as waited:
                await both_started.wait()
            if waited.cancelled_caught:
                return CheckerOutcome(score=None, error_class="timeout", error="waited alone")
        return CheckerOutcome(score=1.0)

    result = await verify(task, slot, ctx, EpisodeFacts(valid=True), run=run)
    assert len(calls) == 3
    assert result.audit.second_score == 1.0 and result.audit.redundant_score == 1.0, result
    assert "checker_timeout" not in result.audit.flags


def test_a_full_slot_disk_is_a_reason_to_drop_the_episode() -> None:
    assert "disk was full (1.0 MiB free of 1024 MiB)" in (full_disk_reason(1.0, 1024.0) or "")
    assert full_disk_reason(11.0, 1024.0) is None  # over 1% of the disk free
    assert full_disk_reason(3.0, 100.0) is not None  # under the 4 MiB floor
    assert full_disk_reason(None, None) is None  # no upper layer to look at
