"""Task loading, placeholders and support() over the shared OSWorld tasks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from drumsd.tasks.coverage import stand_in_cache
from drumsd.tasks.host_support import support, task_support_table
from drumsd.tasks.model import (
    MetricCatalog,
    Task,
    TaskContext,
    TaskError,
    fill_placeholders,
    find_task,
    list_tasks,
    parse_task,
    resolve_task,
)
from drumsd.tasks.testing import checker_context

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "osworld"

# What this host says about every shared task with an empty download cache, a real checker venv
# and a desktop without a terminal reader, apps unchecked (no image manifest in this context).
EXPECTED_UNSUPPORTED = {
    "01b269ae-2111-4a07-81fd-3fcd711993b0": "Student_Level_Fill_Blank.xlsx",
    "e528b65e-1107-4b8c-8988-490e4fece599": "Geography_And_Magical_Realism.docx",
    "13584542-872b-42d8-b299-866967b5c3ef": "terminal_output",
}


@pytest.fixture(scope="session")
def venv_ctx() -> TaskContext:
    return checker_context()


def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared OSWorld tasks not found at {SHARED}")
    return SHARED


def test_every_shared_task_loads() -> None:
    tasks, broken = list_tasks([shared_dir()])
    assert broken == {}
    assert len(tasks) == 15
    assert {t.id for t in tasks} >= set(EXPECTED_UNSUPPORTED)


def test_support_of_every_shared_task(venv_ctx: TaskContext, tmp_path: Path) -> None:
    ctx = venv_ctx.model_copy(update={"task_dirs": [shared_dir()], "cache_dir": tmp_path})
    rows = {row.id: row for row in task_support_table(ctx)}
    assert len(rows) == 15
    for task_id, row in rows.items():
        if task_id in EXPECTED_UNSUPPORTED:
            assert not row.supported, row
            assert EXPECTED_UNSUPPORTED[task_id] in (row.reason or ""), row
        else:
            assert row.supported, row
    # The missing download is named with its full cache path.
    calc = rows["01b269ae-2111-4a07-81fd-3fcd711993b0"].reason or ""
    assert str(tmp_path / "01b269ae-2111-4a07-81fd-3fcd711993b0") in calc


def test_cached_downloads_make_calc_supported(venv_ctx: TaskContext, tmp_path: Path) -> None:
    task = find_task("01b269ae-2111-4a07-81fd-3fcd711993b0", [shared_dir()])
    ctx = venv_ctx.model_copy(update={"cache_dir": tmp_path})
    folder = tmp_path / task.id
    folder.mkdir()
    (folder / "Student_Level_Fill_Blank.xlsx").write_bytes(b"x")
    ok, reason = support(task, ctx)
    assert not ok and "Student_Level_Fill_Blank_gold.xlsx" in (reason or "")  # expected file
    (folder / "Student_Level_Fill_Blank_gold.xlsx").write_bytes(b"x")
    assert support(task, ctx) == (True, None)


def test_terminal_reader_supports_the_getter_but_not_a_ctrl_alt_t_check(
    venv_ctx: TaskContext,
) -> None:
    """13584542's checker presses ctrl+alt+t and reads the terminal that opens: no drums desktop
    opens one, so `stty size` lands in whatever window has focus and the check does not test the
    task (issue 32). Without that postconfig the terminal reader makes its getter supported."""
    task = find_task("13584542-872b-42d8-b299-866967b5c3ef", [shared_dir()])
    ctx = venv_ctx.model_copy(update={"capabilities": frozenset({"terminal_output"})})
    ok, reason = support(task, ctx)
    assert not ok and "ctrl+alt+t" in (reason or ""), reason
    plain = task.model_copy(
        update={"evaluator": task.evaluator.model_copy(update={"postconfig": []})}
    )
    assert support(plain, ctx) == (True, None)


def base_task(**overrides: object) -> dict:
    data = {
        "id": "t1",
        "instruction": "x",
        "config": [],
        "evaluator": {"func": "exact_match", "result": {"type": "rule", "rules": {}}},
    }
    data.update(overrides)
    return data


CATALOG = MetricCatalog(
    exported={"exact_match": "general", "compare_image_text": "docs"},
    unsupported={"compare_image_text": "needs 'easyocr', not installed in the checker venv"},
)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"proxy": True, "config": [{"type": "chrome_open_tabs", "parameters": {
            "urls_to_open": ["https://www.example.org/x"]}}]}, "proxy task: its setup names"),
        ({"proxy": True, "evaluator": {"func": "exact_match", "result": {"type": "rule", "rules": {
            "expected": "https://www.example.org/"}}}}, "proxy task: its checker names"),
        ({"config": [{"type": "googledrive", "parameters": {}}]}, "googledrive"),
        ({"config": [{"type": "login", "parameters": {}}]}, "login"),
        ({"config": [{"type": "tidy_desktop", "parameters": {}}]}, "tidy_desktop"),
        ({"evaluator": {"func": "compare_image_text", "result": {"type": "rule", "rules": {}}}},
         "easyocr"),
        ({"evaluator": {"func": "nope", "result": {"type": "rule", "rules": {}}}}, "'nope'"),
        ({"evaluator": {"func": "exact_match", "result": {"type": "page_info"}}},
         "page_info"),
        ({"evaluator": {"func": "exact_match", "result": {"type": "googledrive_file"}}},
         "googledrive"),
        ({"config": [{"type": "upload_file", "parameters": {
            "files": [{"local_path": "/etc/passwd", "path": "/home/user/p"}]}}]}, "outside"),
        ({"evaluator": {"func": ["exact_match", "exact_match"],
                        "result": [{"type": "rule", "rules": {}}]}}, "list of 2"),
    ],
)  # fmt: skip
def test_unsupported_reasons(overrides: dict, reason: str, tmp_path: Path) -> None:
    ctx = TaskContext(metrics=CATALOG, assets_dir=tmp_path)
    ok, why = support(resolve_task(base_task(**overrides), []), ctx)
    assert not ok and reason in (why or ""), why


def test_upload_from_assets_dir_is_supported(tmp_path: Path) -> None:
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "a.txt").write_text("a")
    step = {
        "type": "upload_file",
        "parameters": {"files": [{"local_path": "t1/a.txt", "path": "p"}]},
    }
    ctx = TaskContext(metrics=CATALOG, assets_dir=tmp_path)
    assert support(resolve_task(base_task(config=[step]), []), ctx) == (True, None)


def test_without_checker_venv_metric_tasks_are_unsupported() -> None:
    ok, why = support(resolve_task(base_task(), []), TaskContext())
    assert not ok and "checker venv" in (why or "")
    infeasible = base_task(evaluator={"func": "infeasible"})
    assert support(resolve_task(infeasible, []), TaskContext()) == (True, None)


def test_load_by_id_path_and_inline(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    (nested / "whatever.json").write_text(json.dumps(base_task(id="deep-id")))
    (tmp_path / "broken.json").write_text("{")
    assert find_task("deep-id", [tmp_path]).id == "deep-id"
    assert resolve_task(str(nested / "whatever.json"), []).id == "deep-id"
    assert resolve_task(base_task(id="inline"), []).id == "inline"
    with pytest.raises(TaskError, match="no task with id 'missing'"):
        find_task("missing", [tmp_path])
    with pytest.raises(TaskError, match="not JSON"):
        resolve_task(str(tmp_path / "broken.json"), [])
    with pytest.raises(TaskError, match="not a valid OSWorld task"):
        resolve_task({"id": "x"}, [])
    _tasks, broken = list_tasks([tmp_path])
    assert list(broken) == [tmp_path / "broken.json"]


def test_placeholders() -> None:
    ctx = TaskContext(client_password="pw", screen_width=1920, screen_height=1080)
    cmd = ["x", "{SCREEN_WIDTH_HALF},{SCREEN_HEIGHT_HALF} {SCREEN_WIDTH}x{SCREEN_HEIGHT}"]
    assert fill_placeholders(cmd, ctx) == ["x", "960,540 1920x1080"]
    assert fill_placeholders("echo {CLIENT_PASSWORD}", ctx) == "echo pw"


def test_conj_must_be_and_or() -> None:
    with pytest.raises(TaskError, match="conj"):
        resolve_task(base_task(evaluator={"func": "exact_match", "conj": "xor"}), [])


def test_task_model_keeps_osworld_fields() -> None:
    task = Task.model_validate(base_task(snapshot="os", possibility_of_env_change="low"))
    assert task.snapshot == "os" and task.model_extra == {"possibility_of_env_change": "low"}


# ---- finding 2 of issue 14: a task names no path outside its own directories -----------------


@pytest.mark.parametrize("bad_id", ["../../..", "..", ".", "a/b", "/etc", "x\0y", ""])
def test_a_task_id_that_is_a_path_is_refused_at_load(bad_id: str) -> None:
    with pytest.raises(TaskError, match="task id is one file name"):
        resolve_task(base_task(id=bad_id), [])


def test_task_asset_and_cache_stay_beneath_their_roots(tmp_path: Path) -> None:
    from drumsd.tasks.model import cached_download, task_asset

    secret = tmp_path / "secret.txt"  # stands for a root-only host file
    secret.write_text("host secret")
    assets, cache = tmp_path / "assets", tmp_path / "cache"
    (assets / "t1").mkdir(parents=True)
    (assets / "t1" / "ok.txt").write_text("asset")
    (cache / "t1").mkdir(parents=True)
    (cache / "t1" / "f.xlsx").write_text("cached")
    ctx = TaskContext(assets_dir=assets, cache_dir=cache)
    task = resolve_task(base_task(), [])
    assert task_asset(task, "ok.txt", ctx) == (assets / "t1" / "ok.txt").resolve()
    assert task_asset(task, "../../secret.txt", ctx) is None
    # A task whose id got past the model (constructed directly) still cannot climb out.
    evil = task.model_copy(update={"id": "../.."})
    assert task_asset(evil, "secret.txt", ctx) is None
    assert task_asset(evil, str(secret.relative_to(tmp_path)), ctx) is None
    assert cached_download(task, "https://x/f.xlsx", None, ctx) == (cache / "t1" / "f.xlsx")
    assert cached_download(evil, "https://x/secret.txt", None, ctx) is None
    # The URL-decoded basename: %2e%2e is "..", %2F a slash inside one name.
    assert cached_download(task, "https://x/%2e%2e", None, ctx) is None
    assert cached_download(task, "https://x/..%2F..%2Fsecret.txt", None, ctx) is None
    # A symlink in the cache pointing out is refused too (real path outside the cache).
    (cache / "t1" / "link.txt").symlink_to(secret)
    assert cached_download(task, "https://x/link.txt", None, ctx) is None


# ---- finding 6 of issue 14: task files are regular files of bounded size ----------------------


def test_a_fifo_device_or_huge_file_is_refused_as_a_task(tmp_path: Path) -> None:
    import os

    from drumsd.tasks.model import MAX_TASK_FILE_BYTES, load_task_file

    fifo = tmp_path / "task.json"
    os.mkfifo(fifo)
    with pytest.raises(TaskError, match="not a regular file"):
        load_task_file(fifo)  # opening it without a writer must not block
    with pytest.raises(TaskError, match="not a regular file"):
        load_task_file(Path("/dev/zero"))
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(MAX_TASK_FILE_BYTES + 1)
    with pytest.raises(TaskError, match="over 16 MiB"):
        load_task_file(huge)


def test_a_second_file_with_the_same_id_is_listed_as_shadowed(tmp_path: Path) -> None:
    """OSWorld's checkout has one id under Windows/ and multi_apps/: a create by id takes the
    Linux file, whatever the order, and the table lists the other unsupported, naming the one
    that wins; of two Linux files, the first wins."""

    def write(domain: str, task_id: str, apps: list[str]) -> None:
        (tmp_path / domain).mkdir(exist_ok=True)
        body = {"id": task_id, "instruction": domain, "related_apps": apps}
        body["evaluator"] = {"func": "infeasible"}
        (tmp_path / domain / f"{task_id}.json").write_text(json.dumps(body))

    write("Windows", "dup", ["excel"])  # sorts before multi_apps
    write("multi_apps", "dup", ["os"])
    write("a_first", "twice", ["os"])
    write("b_second", "twice", ["os"])
    ctx = TaskContext(task_dirs=[tmp_path], cache_dir=tmp_path / "cache")
    rows = {r.path: r for r in task_support_table(ctx)}
    for task_id, winner_dir, loser_dir in (
        ("dup", "multi_apps", "Windows"),
        ("twice", "a_first", "b_second"),
    ):
        winner = find_task(task_id, [tmp_path])
        assert winner.instruction == winner_dir
        assert rows[str(winner.source_path)].supported
        shadowed = rows[str(tmp_path / loser_dir / f"{task_id}.json")]
        assert not shadowed.supported
        assert (
            shadowed.reason == f"its id is taken by {winner.source_path}, which a create by id runs"
        )


def test_table_rows_give_domain_and_source(tmp_path: Path) -> None:
    """GET /v1/tasks rows (issue 32: domain and source were null): the domain is the directory
    OSWorld files the task under (examples/vlc/ for a task whose snapshot is base_setup), else
    the snapshot; the source is the file's."""
    examples = tmp_path / "examples"
    (examples / "vlc").mkdir(parents=True)
    body = {"id": "t1", "snapshot": "base_setup", "source": "https://superuser.com/q/1"}
    body["evaluator"] = {"func": "infeasible"}
    (examples / "vlc" / "t1.json").write_text(json.dumps(body))
    top = {"id": "t2", "snapshot": "os", "source": ["not", "a string"]}
    (examples / "t2.json").write_text(json.dumps({**top, "evaluator": {"func": "infeasible"}}))
    ctx = TaskContext(task_dirs=[examples], cache_dir=tmp_path / "cache")
    rows = {r.id: r for r in task_support_table(ctx)}
    assert (rows["t1"].domain, rows["t1"].source) == ("vlc", "https://superuser.com/q/1")
    assert (rows["t2"].domain, rows["t2"].source) == ("os", None)


def test_a_windows_task_is_refused_naming_what_gives_it_away(tmp_path: Path) -> None:
    """OSWorld's Windows tasks: drive paths in getters, .exe programs in steps, Office apps."""
    ctx = TaskContext(task_dirs=[tmp_path], cache_dir=tmp_path / "cache")
    getter = {"type": "vm_file", "path": "C:\\Users\\chenj\\Desktop\\a.xlsx", "dest": "a.xlsx"}
    cases = [
        (
            {"evaluator": {"func": "compare_table", "result": getter}},
            "C:\\Users\\chenj\\Desktop\\a.xlsx",
        ),
        (
            {
                "config": [{"type": "launch", "parameters": {"command": ["ncat.exe", "-l"]}}],
                "evaluator": {"func": "infeasible"},
            },
            "ncat.exe",
        ),
        ({"related_apps": ["Excel"], "evaluator": {"func": "infeasible"}}, "Excel"),
    ]
    for body, hint in cases:
        task = parse_task({"id": "w", **body})
        assert task.windows_hint == hint
        assert support(task, ctx) == (False, f"a Windows task (it names {hint!r}); slots run Linux")
    linux = parse_task({"id": "l", "related_apps": ["os"], "evaluator": {"func": "infeasible"}})
    assert linux.windows_hint is None and support(linux, ctx) == (True, None)


# From OSWorld's current 44ee5668 (proxy: true): its setup writes browsing history, it visits no
# site; and e8172110's setup, Python embedded in a shell string (`as e:` then an escaped newline).
HISTORY_ONLY = {
    "proxy": True,
    "config": [
        {
            "type": "update_browse_history",
            "parameters": {
                "history": [
                    {
                        "url": "https://www.youtube.com/watch?v=dQw4w9WgXcQ",
                        "title": "Rick Astley",
                        "visit_time_from_now_in_seconds": 3600,
                    }
                ]
            },
        },
        {
            "type": "launch",
            "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]},
        },
    ],
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "history", "dest": "history.sqlite"},
        "expected": {"type": "rule", "rules": {"type": "keywords", "keywords": ["youtube"]}},
    },
}
EMBEDDED_PYTHON = {
    "config": [
        {
            "type": "execute",
            "parameters": {
                "shell": True,
                "command": (
                    'python3 -c "try:\\n    check()\\nexcept Exception as e:\\n    print(e)"'
                ),
            },
        }
    ],
}


@pytest.mark.parametrize("task", [HISTORY_ONLY, EMBEDDED_PYTHON], ids=["proxy", "else-colon"])
def test_offline_linux_tasks_are_supported(task: dict) -> None:
    ctx = TaskContext(metrics=CATALOG)
    assert support(resolve_task(base_task(**task), []), ctx) == (True, None)


def test_windows_paths_are_still_windows() -> None:
    for path in ("C:\\Users\\user\\Desktop\\a.docx", "c:\\temp", "D:\\new"):
        task = resolve_task(base_task(config=[{"type": "open", "parameters": {"path": path}}]), [])
        assert task.windows_hint is not None, path


def current_osworld() -> Path:
    """OSWorld's current task files (its checkout, never committed here): DRUMS_OSWORLD_DIR."""
    raw = os.environ.get("DRUMS_OSWORLD_DIR")
    if not raw:
        pytest.skip("OSWorld's current task files: set DRUMS_OSWORLD_DIR to an OSWorld checkout")
    root = Path(raw)
    return (
        root / "evaluation_examples" / "examples"
        if (root / "evaluation_examples").is_dir()
        else root
    )


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("chrome/44ee5668-ecd5-4366-a6ce-c1c9b8d4e938.json", None),
        ("multi_apps/e8172110-ec08-421b-a6f5-842e6451911f.json", None),
        ("chrome/93eabf48-6a27-4cb6-b963-7d5fe1e0d3a9.json", None),
        ("chrome/7a5a7856-f1b6-42a4-ade9-1ca81ca0f263.json", "proxy task: "),
    ],
)
def test_current_task_files_read_as_osworld_reads_them(
    path: str, why: str | None, tmp_path: Path
) -> None:
    """Refusals come from what the task needs, not from its proxy key or an embedded `e:\\n`
    (with its downloads in the cache)."""
    task = resolve_task(json.loads((current_osworld() / path).read_text()), [])
    stand_in_cache([task], tmp_path)
    ctx = TaskContext(metrics=None, cache_dir=tmp_path)
    ok, reason = support(task, ctx)
    assert task.windows_hint is None
    if why is None:
        # Only the checker venv (not built in this unit test) is left to check.
        assert reason == "the checker venv is not built yet (drumsd builds it at start)", reason
    else:
        assert not ok and reason is not None and reason.startswith(why), reason
