"""OSWorld's own metric functions, run by drums' checker runner in the real checker venv.

Each proven metric scores 1 on matching and 0 on mismatching real files; the runner's containment
(unprivileged uid, deadline, stdout kept apart, missing libraries) is checked on real processes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from drumsd.tasks.checker import metric_call, run_checker, verifier_call
from drumsd.tasks.getters import FileArg, XlsxLastRow
from drumsd.tasks.model import TaskContext
from drumsd.tasks.testing import checker_context

# Every test here runs the checker program in the real checker venv: real processes.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def ctx() -> TaskContext:
    return checker_context()


def make_files(ctx: TaskContext, script: str, out: Path) -> None:
    """Write office files with the checker venv's own libraries (openpyxl, python-docx, ...)."""
    assert ctx.checker is not None
    subprocess.run([str(ctx.checker.python), "-c", script, str(out)], check=True, timeout=120)


XLSX = """
import sys, openpyxl
out = sys.argv[1]
for name, rows in {
    "gold": [["a", 1], ["a", 1], ["b", 2]],
    "same": [["a", 1], ["a", 1], ["b", 2]],
    "other": [["a", 1], [None, None], ["b", 2]],
}.items():
    wb = openpyxl.Workbook()
    for row in rows:
        wb.active.append(row)
    wb.save(f"{out}/{name}.xlsx")
"""

DOCX = """
import sys, docx
out = sys.argv[1]
for name, text in {"gold": "Magical Realism In Geography", "same": "Magical Realism In Geography",
                   "other": "magical realism in geography"}.items():
    d = docx.Document()
    d.add_paragraph(text)
    d.save(f"{out}/{name}.docx")
"""

PPTX = """
import sys, pptx
out = sys.argv[1]
for name, title in {"gold": "Quarterly plan", "same": "Quarterly plan", "other": "Other"}.items():
    p = pptx.Presentation()
    s = p.slides.add_slide(p.slide_layouts[0])
    s.shapes.title.text = title
    p.save(f"{out}/{name}.pptx")
"""


async def score(ctx: TaskContext, func: str, args: list, options: dict | None = None):
    assert ctx.checker is not None
    return await run_checker(metric_call(func, args, options), ctx.checker, 60)


def file_arg(path: Path, name: str | None = None) -> FileArg:
    return FileArg(name or f"in/{path.name}", path.read_bytes())


async def test_compare_table_sheet_data(ctx: TaskContext, tmp_path: Path) -> None:
    make_files(ctx, XLSX, tmp_path)
    rules = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}
    gold = file_arg(tmp_path / "gold.xlsx", "e/gold.xlsx")
    good = await score(ctx, "compare_table", [file_arg(tmp_path / "same.xlsx"), gold], rules)
    bad = await score(ctx, "compare_table", [file_arg(tmp_path / "other.xlsx"), gold], rules)
    assert (good.score, bad.score) == (1.0, 0.0), (good, bad)


async def test_compare_table_check_cell(ctx: TaskContext, tmp_path: Path) -> None:
    make_files(ctx, XLSX, tmp_path)
    rule = {
        "rules": [
            {
                "type": "check_cell",
                "sheet_idx": 0,
                "coordinate": "B3",
                "props": {"value": {"method": "eq", "ref": 2}},
            }
        ]
    }
    good = await score(ctx, "compare_table", [file_arg(tmp_path / "same.xlsx")], rule)
    rule["rules"][0]["props"]["value"]["ref"] = 3
    bad = await score(ctx, "compare_table", [file_arg(tmp_path / "same.xlsx")], rule)
    assert (good.score, bad.score) == (1.0, 0.0), (good, bad)


async def test_compare_docx_and_pptx(ctx: TaskContext, tmp_path: Path) -> None:
    make_files(ctx, DOCX, tmp_path)
    make_files(ctx, PPTX, tmp_path)
    for ext, func in (("docx", "compare_docx_files"), ("pptx", "compare_pptx_files")):
        gold = file_arg(tmp_path / f"gold.{ext}", f"e/gold.{ext}")
        good = await score(ctx, func, [file_arg(tmp_path / f"same.{ext}"), gold])
        bad = await score(ctx, func, [file_arg(tmp_path / f"other.{ext}"), gold])
        assert (good.score, bad.score) == (1.0, 0.0), (func, good, bad)


TIMEDATECTL = (
    "Local time: Thu 2024-01-25 12:56:06 UTC\nUniversal time: Thu 2024-01-25 12:56:06 UTC\n"
    "RTC time: Thu 2024-01-25 12:56:05\nTime zone: {}\nSystem clock synchronized: yes\n"
)


@pytest.mark.parametrize(
    ("func", "good", "bad", "expected"),
    [
        ("exact_match", "Directory exists.\n", "Directory does not exist.\n",
         {"expected": "Directory exists.\n"}),
        ("check_include_exclude", "Large text enabled (factor: 1.25)", "No text scaling enabled",
         {"include": ["Large text enabled"], "exclude": ["No text scaling enabled", "error"]}),
        ("literal_match", [1, 2], [2, 1], [1, 2]),
        ("is_utc_0", TIMEDATECTL.format("Etc/UTC (UTC, +0000)"),
         TIMEDATECTL.format("Europe/Paris (CET, +0100)"), None),
        ("check_gnome_favorite_apps", "['thunderbird.desktop', 'vim.desktop']",
         "['thunderbird.desktop']", {"expected": ["thunderbird.desktop", "vim.desktop"]}),
    ],
)  # fmt: skip
async def test_value_metrics(ctx: TaskContext, func, good, bad, expected) -> None:
    extra = [] if expected is None else [expected]
    ok = await score(ctx, func, [good, *extra])
    ko = await score(ctx, func, [bad, *extra])
    assert (ok.score, ko.score) == (1.0, 0.0), (ok, ko)


async def test_file_and_rule_metrics(ctx: TaskContext, tmp_path: Path) -> None:
    (tmp_path / "settings.json").write_text(json.dumps({"editor.wordWrapColumn": 50}))
    (tmp_path / "wrong.json").write_text(json.dumps({"editor.wordWrapColumn": 80}))
    (tmp_path / "gimprc").write_text('# gimprc\n(undo-levels 100)\n(theme "Light")\n')
    (tmp_path / "gimprc-old").write_text("(undo-levels 5)\n")
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv").write_text("x,y\n1,3\n")
    cases = [
        ("check_json_settings", "settings.json", "wrong.json",
         {"expected": {"editor.wordWrapColumn": 50}}),
        ("check_config_status", "gimprc", "gimprc-old",
         {"type:": "key-value", "key": "undo-levels", "value": "100"}),
        ("compare_csv", "a.csv", "b.csv", file_arg(tmp_path / "a.csv", "e/a.csv")),
        ("compare_text_file", "a.csv", "b.csv", file_arg(tmp_path / "a.csv", "e/a.csv")),
    ]  # fmt: skip
    for func, good, bad, expected in cases:
        ok = await score(ctx, func, [file_arg(tmp_path / good), expected])
        ko = await score(ctx, func, [file_arg(tmp_path / bad), expected])
        assert (ok.score, ko.score) == (1.0, 0.0), (func, ok, ko)


async def test_drums_supplied_metric_runs_in_the_venv(ctx: TaskContext, tmp_path: Path) -> None:
    # check_play_and_exit (OSWorld's 5ac2891a) is not in desktop-env 1.0.2: drums' runner has it,
    # and the venv's probe lists it, so support() no longer refuses the task.
    assert ctx.metrics.why_unsupported("check_play_and_exit") is None
    (tmp_path / "on").write_text("[core]\nplay-and-exit=1\n")
    (tmp_path / "off").write_text("[core]\n#play-and-exit=0\n")
    rule = {"expected_play_and_exit": 0}
    ok = await score(ctx, "check_play_and_exit", [file_arg(tmp_path / "off", "r/vlcrc"), rule])
    ko = await score(ctx, "check_play_and_exit", [file_arg(tmp_path / "on", "r/vlcrc"), rule])
    assert (ok.score, ko.score) == (1.0, 0.0), (ok, ko)


async def test_missing_file_is_none_for_the_metric(ctx: TaskContext) -> None:
    # OSWorld's getters hand None to the metric for a missing file; check_config_status says 0.
    out = await score(ctx, "check_config_status", [FileArg("r/gimprc", None), {"key": "k"}])
    assert out.score == 0.0, out


async def test_content_from_vm_file_last_row(ctx: TaskContext, tmp_path: Path) -> None:
    make_files(ctx, XLSX, tmp_path)
    last = XlsxLastRow(file_arg(tmp_path / "gold.xlsx"))
    ok = await score(ctx, "literal_match", [last, ["b", "2"]])
    ko = await score(ctx, "literal_match", [last, ["a", "1"]])
    assert (ok.score, ko.score) == (1.0, 0.0), (ok, ko)


async def test_unsupported_metric_names_the_library(ctx: TaskContext) -> None:
    out = await score(ctx, "compare_image_text", ["x", {"type": "text", "text": "y"}])
    assert out.score is None and out.error_class == "unsupported"
    assert "easyocr" in (out.error or "")


async def test_unknown_metric_is_a_bad_request(ctx: TaskContext) -> None:
    out = await score(ctx, "no_such_metric", ["x"])
    assert out.error_class == "bad_request" and "no_such_metric" in (out.error or "")


def write_verifier(directory: Path, body: str, name: str = "drums_verifier_test") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(body)
    return directory


async def test_checker_runs_unprivileged_in_scratch_with_stdout_apart(
    ctx: TaskContext, tmp_path: Path
) -> None:
    assert ctx.checker is not None
    module_dir = write_verifier(
        tmp_path / "verifiers",
        "import os\n"
        "def who(paths, options):\n"
        "    print('noise on stdout {')\n"
        "    here = os.getcwd()\n"
        "    ok = os.getuid() == options['uid'] and paths['f'].startswith(here)\n"
        "    return 1.0 if ok and open(paths['f']).read() == 'hi' else 0.0\n",
    )
    args = [{"f": FileArg("r/f.txt", b"hi")}, {"uid": ctx.checker.uid}]
    call = verifier_call(module_dir, "drums_verifier_test", "who", args, None)
    out = await run_checker(call, ctx.checker, 60)
    assert out.score == 1.0, out
    assert "noise on stdout" in out.stderr_tail


async def test_checker_gets_the_verifier_sources_not_the_task_set_beside_them(
    ctx: TaskContext, tmp_path: Path
) -> None:
    # A built task set is its own verifier directory: the module, tasks.jsonl, and assets/.
    assert ctx.checker is not None
    module_dir = write_verifier(
        tmp_path / "set",
        "import os, helper, helpers_pkg\n"
        "def where(paths, options):\n"
        "    here = os.path.dirname(__file__)\n"
        "    seen = sorted(os.listdir(here))\n"
        "    ok = seen == ['drums_verifier_test.py', 'helper.py', 'helpers_pkg']\n"
        "    return 1.0 if ok and helper.ONE + helpers_pkg.TWO == 3 else 0.0\n",
    )
    (module_dir / "helper.py").write_text("ONE = 1\n")
    (module_dir / "helpers_pkg").mkdir()
    (module_dir / "helpers_pkg" / "__init__.py").write_text("TWO = 2\n")
    (module_dir / "tasks.jsonl").write_text("{}\n")
    (module_dir / "assets").mkdir()
    (module_dir / "assets" / "big.bin").write_bytes(b"x" * 1024)
    call = verifier_call(module_dir, "drums_verifier_test", "where", [{}, {}], None)
    out = await run_checker(call, ctx.checker, 60)
    assert out.score == 1.0, out


async def test_checker_deadline_kills_a_hung_checker(ctx: TaskContext, tmp_path: Path) -> None:
    assert ctx.checker is not None
    module_dir = write_verifier(
        tmp_path / "v", "import time\ndef hang(paths, options):\n    time.sleep(600)\n"
    )
    call = verifier_call(module_dir, "drums_verifier_test", "hang", [{}, {}], None)
    out = await run_checker(call, ctx.checker, 2.0)
    assert out.error_class == "timeout" and out.score is None
    assert out.duration_s < 10
