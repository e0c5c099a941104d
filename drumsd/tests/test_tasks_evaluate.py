"""OSWorld's evaluator semantics: combination, FAIL/infeasible, missing results, getters.

The combination is tested with a recording fake checker; whole shared tasks are scored with the
real checker venv on a directory-backed fake slot (solved: 1, untouched: 0).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from drumsd.tasks.checker import CheckerCall, CheckerOutcome
from drumsd.tasks.evaluate import (
    PreparedMetric,
    combine,
    default_runner,
    evaluate,
    metric_specs,
    score_prepared,
)
from drumsd.tasks.getters import GetterEnv, get_value, resolve_relative_rules
from drumsd.tasks.model import Evaluator, Task, TaskContext, find_task, resolve_task
from drumsd.tasks.setup import run_setup
from drumsd.tasks.testing import DirSlot, checker_context

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "osworld"


# ---- combination (pure, fake checker) --------------------------------------------------------


class Recorder:
    def __init__(self, scores: list[float | None]) -> None:
        self.scores = list(scores)
        self.calls: list[str] = []

    async def __call__(self, call: CheckerCall) -> CheckerOutcome:
        self.calls.append(call.request["func"])
        score = self.scores.pop(0)
        if score is None:
            return CheckerOutcome(score=None, error_class="crash", error="boom")
        return CheckerOutcome(score=score, duration_s=0.01)


def prepared(*funcs: str, missing: set[int] = frozenset()) -> list[PreparedMetric]:
    out = []
    for i, func in enumerate(funcs):
        call = None if i in missing else CheckerCall(request={"func": func})
        out.append(PreparedMetric(func, call, missing="gone" if i in missing else None))
    return out


def test_combine() -> None:
    assert combine([1.0, 0.5], "and") == 0.75
    assert combine([1.0, 0.0], "and") == 0.0
    assert combine([0.2, 0.5], "or") == 0.5
    assert combine([0.2, 1.0], "or") == 1.0


@pytest.mark.parametrize(
    ("conj", "scores", "expected", "ran"),
    [
        ("and", [0.0, 1.0], 0.0, ["a"]),  # first 0 returns 0, b never runs
        ("and", [1.0, 0.5], 0.75, ["a", "b"]),  # else the mean
        ("or", [1.0, 0.0], 1.0, ["a"]),  # first 1 returns 1
        ("or", [0.25, 0.5], 0.5, ["a", "b"]),  # else the max
    ],
)
async def test_score_prepared_early_exits(conj, scores, expected, ran) -> None:
    run = Recorder(scores)
    scoring = await score_prepared(prepared("a", "b"), conj, run)
    assert scoring.score == expected and run.calls == ran


async def test_missing_result_scores_zero() -> None:
    run = Recorder([1.0, 1.0])
    assert (await score_prepared(prepared("a", "b", missing={0}), "and", run)).score == 0.0
    assert run.calls == []
    run = Recorder([0.5])
    scoring = await score_prepared(prepared("a", "b", missing={0}), "or", run)
    assert scoring.score == 0.5 and scoring.metrics[0].missing == "gone"


async def test_a_crash_gives_no_score() -> None:
    scoring = await score_prepared(prepared("a", "b"), "and", Recorder([1.0, None]))
    assert scoring.score is None and scoring.error_class == "crash" and "b: boom" in scoring.error


def test_metric_specs_pair_lists() -> None:
    ev = Evaluator.model_validate(
        {
            "func": ["f", "g"],
            "result": [{"type": "rule", "rules": 1}, {"type": "rule", "rules": 2}],
            "expected": [None, {"type": "rule", "rules": 3}],
            "options": [{}, {"k": 1}],
        }
    )
    specs = metric_specs(ev)
    assert [s.func for s in specs] == ["f", "g"]
    assert specs[0].expected is None and specs[1].expected == {"type": "rule", "rules": 3}
    assert specs[1].options == {"k": 1}


# ---- whole tasks on a fake slot with the real checker venv ----------------------------------


@pytest.fixture(scope="session")
def venv_ctx() -> TaskContext:
    return checker_context()


def slot_ctx(venv_ctx: TaskContext, slot: DirSlot, **kw: Any) -> TaskContext:
    return venv_ctx.model_copy(update={"user_home": str(slot.home), **kw})


def shared(task_id: str) -> Task:
    return find_task(task_id, [SHARED])


async def score_of(task: Task, slot: DirSlot, ctx: TaskContext, last: str | None = "DONE"):
    return await evaluate(task, slot, ctx, default_runner(ctx), last_action=last)


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_e0df059f_solved_and_untouched(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = shared("e0df059f-28a6-4169-924f-b9623e7184cc")
    for solve, expected in ((False, 0.0), (True, 1.0)):
        slot = DirSlot(tmp_path / f"slot-{solve}")
        ctx = slot_ctx(venv_ctx, slot)
        await run_setup(task, slot, ctx)
        if solve:
            desktop = slot.home / "Desktop"
            (desktop / "todo_list_Jan_1").rename(desktop / "todo_list_Jan_2")
        result = await score_of(task, slot, ctx)
        assert result.score == expected, result


async def test_infeasible_scores_only_a_final_fail(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = shared("c288e301-e626-4b98-a1ab-159dcb162af5")
    slot = DirSlot(tmp_path)
    ctx = slot_ctx(venv_ctx, slot)
    assert (await score_of(task, slot, ctx, "FAIL")).score == 1.0
    assert (await score_of(task, slot, ctx, "DONE")).score == 0.0
    assert (await score_of(task, slot, ctx, None)).score == 0.0


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_fail_on_a_feasible_task_scores_zero(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = shared("e0df059f-28a6-4169-924f-b9623e7184cc")
    slot = DirSlot(tmp_path)
    (slot.home / "Desktop" / "todo_list_Jan_2").mkdir()
    ctx = slot_ctx(venv_ctx, slot)
    assert (await score_of(task, slot, ctx, "DONE")).score == 1.0
    assert (await score_of(task, slot, ctx, "fail")).score == 0.0


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_vscode_settings_and_missing_result(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = shared("276cc624-87ea-4f08-ab93-f770e3790175")
    slot = DirSlot(tmp_path)
    ctx = slot_ctx(venv_ctx, slot)
    # The task names /home/user/...: point it at the fake slot's home.
    task.evaluator.result["path"] = f"{slot.home}/.config/Code/User/settings.json"  # type: ignore[index]
    missing = await score_of(task, slot, ctx)
    assert missing.score == 0.0 and missing.scoring.metrics[0].missing
    settings = slot.home / ".config" / "Code" / "User" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"editor.wordWrapColumn": 80}))
    assert (await score_of(task, slot, ctx)).score == 0.0
    settings.write_text(json.dumps({"editor.wordWrapColumn": 50}))
    assert (await score_of(task, slot, ctx)).score == 1.0


GSETTINGS = """
store="$HOME/.gsettings"; touch "$store"
if [ "$1" = set ]; then grep -v "^$2 $3 " "$store" > "$store.new"; echo "$2 $3 $4" >> "$store.new"
  mv "$store.new" "$store"; exit 0; fi
line=$(grep "^$2 $3 " "$store" | tail -1)
if [ -z "$line" ]; then echo "${DEFAULT:-uint32 300}"; else echo "${line#* * }"; fi
"""


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_bedcedc4_or_of_two_gsettings(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = shared("bedcedc4-4d72-425e-ad62-21960b11fe0d")
    slot = DirSlot(tmp_path)
    slot.add_fake_command("gsettings", GSETTINGS)
    ctx = slot_ctx(venv_ctx, slot)
    await run_setup(task, slot, ctx)
    assert (await score_of(task, slot, ctx)).score == 0.0  # idle-delay 300, idle-dim unset
    await slot.exec_user("gsettings set org.gnome.settings-daemon.plugins.power idle-dim false", 5)
    assert (await score_of(task, slot, ctx)).score == 1.0  # second metric: or -> 1
    await slot.exec_user("gsettings set org.gnome.settings-daemon.plugins.power idle-dim true", 5)
    await slot.exec_user("gsettings set org.gnome.desktop.session idle-delay 'uint32 0'", 5)
    assert (await score_of(task, slot, ctx)).score == 1.0  # first metric


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_gimp_config_file(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = shared("7b7617bd-57cc-468e-9c91-40c4ec2bcb3d")
    slot = DirSlot(tmp_path)
    ctx = slot_ctx(venv_ctx, slot)
    assert (await score_of(task, slot, ctx)).score == 0.0  # no gimprc: missing result
    gimprc = slot.home / ".config" / "GIMP" / "2.10" / "gimprc"
    gimprc.parent.mkdir(parents=True)
    gimprc.write_text("# GIMP gimprc\n\n(undo-levels 5)\n")
    assert (await score_of(task, slot, ctx)).score == 0.0
    gimprc.write_text("# GIMP gimprc\n\n(undo-levels 100)\n")
    assert (await score_of(task, slot, ctx)).score == 1.0


@pytest.mark.integration  # runs the real Chromium
async def test_chrome_profile_read_from_chromium(venv_ctx: TaskContext, tmp_path: Path) -> None:
    name_task = shared("2ae9ba84-3a0d-4d4c-8338-3a1478dc5fe3")
    dnt_task = shared("030eeff7-b492-4218-b312-701ec99ee0cc")
    slot = DirSlot(tmp_path)
    ctx = slot_ctx(venv_ctx, slot)
    prefs = slot.home / ".config" / "chromium" / "Default" / "Preferences"
    prefs.parent.mkdir(parents=True)
    prefs.write_text(json.dumps({"profile": {"name": "Person 1"}}))
    assert (await score_of(name_task, slot, ctx)).score == 0.0
    assert (await score_of(dnt_task, slot, ctx)).score == 0.0
    prefs.write_text(json.dumps({"profile": {"name": "Thomas"}, "enable_do_not_track": True}))
    assert (await score_of(name_task, slot, ctx)).score == 1.0
    assert (await score_of(dnt_task, slot, ctx)).score == 1.0
    # The postconfig restarts the browser: only recorded on this fake slot.
    assert any("pkill chromium" in c for c in slot.launched)


class TerminalSlot(DirSlot):
    terminal = ""

    async def terminal_output(self) -> str:
        return self.terminal


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_terminal_output_when_the_slot_has_it(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = shared("13584542-872b-42d8-b299-866967b5c3ef")
    slot = TerminalSlot(tmp_path)
    no_reader = await score_of(task, slot, slot_ctx(venv_ctx, slot))
    assert no_reader.score is None and no_reader.error_class == "unsupported"
    ctx = slot_ctx(venv_ctx, slot, capabilities=frozenset({"terminal_output"}))
    slot.terminal = "user@host:~$ stty size\n24 80\n"
    assert (await score_of(task, slot, ctx)).score == 0.0
    slot.terminal = "user@host:~$ stty size\n43 132\n"
    assert (await score_of(task, slot, ctx)).score == 1.0


async def test_a_failing_postconfig_is_an_error_not_a_score(
    venv_ctx: TaskContext, tmp_path: Path
) -> None:
    # A step that cannot be done (a failing command is recorded and postconfig goes on, as
    # OSWorld's does): the file to open is not there.
    post = [{"type": "open", "parameters": {"path": "/nonexistent/report.docx"}}]
    task = resolve_task(
        {"id": "p", "evaluator": {"func": "exact_match", "postconfig": post,
                                  "result": {"type": "rule", "rules": "a"},
                                  "expected": {"type": "rule", "rules": {"expected": "a"}}}},
        [],
    )  # fmt: skip
    slot = DirSlot(tmp_path)
    ctx = slot_ctx(venv_ctx, slot).model_copy(update={"open_timeout_s": 1.0})
    result = await score_of(task, slot, ctx)
    assert result.score is None and result.error_class == "postconfig", result
    assert "report.docx" in (result.error or ""), result


# ---- getters ---------------------------------------------------------------------------------


def genv(slot: DirSlot, ctx: TaskContext, role: str = "result") -> GetterEnv:
    task = resolve_task({"id": "g", "evaluator": {"func": "infeasible"}}, [])
    return GetterEnv(slot, ctx, task, "r0", None, role)


async def test_list_directory_and_command_getters(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path)
    ctx = TaskContext(user_home=str(slot.home))
    (slot.home / "Desktop" / "a.txt").write_text("a")
    (slot.home / "Desktop" / "sub").mkdir()
    tree = await get_value({"type": "list_directory", "path": "~/Desktop"}, genv(slot, ctx))
    assert tree == {
        "name": "Desktop",
        "type": "directory",
        "children": [
            {"name": "a.txt", "type": "file"},
            {"name": "sub", "type": "directory", "children": []},
        ],
    }
    config = {"type": "vm_command_error", "command": "echo out; echo err >&2", "shell": True}
    assert await get_value(config, genv(slot, ctx)) == "err\n"
    config["type"] = "vm_command_line"
    assert await get_value(config, genv(slot, ctx)) == "out\n"


async def test_history_getter_reads_sqlite(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path)
    ctx = TaskContext(user_home=str(slot.home))
    db = slot.home / ".config" / "chromium" / "Default" / "History"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE urls (url TEXT, title TEXT, last_visit_time INTEGER)")
    conn.execute("INSERT INTO urls VALUES ('https://a.example', 'A', 7)")
    conn.commit()
    conn.close()
    rows = await get_value({"type": "history", "dest": "h.sqlite"}, genv(slot, ctx))
    assert rows == [["https://a.example", "A", 7]]


def test_rule_relative_time() -> None:
    now = datetime(2024, 1, 25, 10, 0)  # a Thursday
    single = resolve_relative_rules(
        {"relativeTime": {"from": "next Monday"}, "expected": {"time": "{DoW}, {Month} {DayD}"}},
        now,
    )
    assert single["expected"]["time"] == "Mon, Jan 29"
    span = resolve_relative_rules(
        {
            "relativeTime": {"from": "next Saturday", "to": "next Sunday"},
            "expected": {"from": "{Year}-{Month0D}-{Day0D}", "to": "{MonthFull} {DayD}"},
        },
        now,
    )
    assert span["expected"] == {"from": "2024-01-27", "to": "January 28"}
    month = resolve_relative_rules(
        {"relativeTime": {"from": "first monday four months later"},
         "expected": {"time": "{Year}/{MonthD}/{DayD}"}},
        datetime(2024, 10, 3),
    )  # fmt: skip
    assert month["expected"]["time"] == "2025/2/3"


def test_frozen_paths_are_the_file_getters_paths() -> None:
    """What verify reads while the slot is frozen: every vm_file / content_from_vm_file path of
    the result, the expected and the redundant evaluator, `~` expanded; live getters are not."""
    from drumsd.tasks.evaluate import frozen_paths

    task = resolve_task(
        {
            "id": "frozen-1",
            "evaluator": {
                "func": ["compare_text_file", "exact_match"],
                "result": [
                    {"type": "vm_file", "path": "~/a.txt", "dest": "a"},
                    {"type": "vm_command_line", "command": "cat ~/b.txt"},
                ],
                "expected": [
                    {
                        "type": "vm_file",
                        "multi": True,
                        "path": ["/x/1", "/x/2"],
                        "dest": ["1", "2"],
                    },
                    {"type": "rule", "rules": {"expected": "b"}},
                ],
                "redundant": {
                    "func": "compare_table",
                    "result": {"type": "content_from_vm_file", "path": "/x/t.xlsx"},
                },
            },
        },
        [],
    )
    ctx = TaskContext(user_home="/home/user")
    assert frozen_paths(task, ctx) == ["/home/user/a.txt", "/x/1", "/x/2", "/x/t.xlsx"]


async def test_frozen_reads_answer_from_the_frozen_read(tmp_path: Path) -> None:
    """A getter gets the bytes (or the error) read while the slot was frozen, not the file as
    an agent process changed it since; other paths go to the slot."""
    from drumsd.tasks.evaluate import FrozenReads

    slot = DirSlot(tmp_path)
    later = slot.home / "later.txt"
    later.write_text("now")
    reads = FrozenReads(slot, {"/a": b"then", "/gone": None, "/bad": OSError("not regular")})
    assert await reads.read_file("/a") == b"then"
    with pytest.raises(FileNotFoundError):
        await reads.read_file("/gone")
    with pytest.raises(OSError, match="not regular"):
        await reads.read_file("/bad")
    assert await reads.read_file(str(later)) == b"now"
    assert reads.home == slot.home  # everything else is the slot's
