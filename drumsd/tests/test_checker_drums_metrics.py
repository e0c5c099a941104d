"""Metrics drums supplies where the pinned desktop-env lacks them (checker_runner.DRUMS_METRICS).

The runner file is stdlib-only and is imported here as a module: these are the functions the
checker venv runs (the integration tests in test_tasks_checker.py run them there).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from drumsd.tasks import checker_runner
from drumsd.tasks.checker_runner import check_play_and_exit

pytestmark = pytest.mark.unit

RULE = {"expected_play_and_exit": 0}  # OSWorld's 5ac2891a


def vlcrc(tmp_path: Path, text: str) -> str:
    path = tmp_path / "vlcrc"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "score"),
    [
        # 5ac2891a's setup leaves the key set: the untouched desktop scores 0.
        ("[core]\nplay-and-exit=1\n", 0.0),
        # VLC writes a setting back at its default commented out; the agent's fix.
        ("[core]\n#play-and-exit=0\n", 1.0),
        ("[core]\nplay-and-exit=0\n", 1.0),
        # A commented-out 1 is not read by VLC: the default (0) holds.
        ("[core]\n#play-and-exit=1\n", 1.0),
        # The last uncommented line wins, as VLC reads it.
        ("play-and-exit=0\n[core]\nplay-and-exit=1\n", 0.0),
        ("play-and-exit = 0 \n", 1.0),
        # A key that merely ends in the name is another setting.
        ("[core]\nno-play-and-exit=1\n", 1.0),
        ("", 1.0),
    ],
)
def test_play_and_exit_read_as_vlc_reads_it(tmp_path: Path, text: str, score: float) -> None:
    assert check_play_and_exit(vlcrc(tmp_path, text), RULE) == score


def test_play_and_exit_expected_value_as_string_or_int(tmp_path: Path) -> None:
    on = vlcrc(tmp_path, "play-and-exit=1\n")
    assert check_play_and_exit(on, {"expected_play_and_exit": 1}) == 1.0
    assert check_play_and_exit(on, {"expected_play_and_exit": "1"}) == 1.0
    assert check_play_and_exit(on, {"expected_play_and_exit": "0"}) == 0.0


def test_play_and_exit_without_the_file_scores_zero() -> None:
    assert check_play_and_exit(None, RULE) == 0.0


@pytest.fixture
def no_desktop_env_modules() -> Iterator[None]:
    """The runner registers desktop_env's packages in sys.modules: none before, none left after."""

    def drop() -> None:
        for name in [n for n in sys.modules if n.split(".")[0] == "desktop_env"]:
            del sys.modules[name]

    drop()
    yield
    drop()


@pytest.mark.usefixtures("no_desktop_env_modules")
def test_runner_serves_drums_metrics_only_where_desktop_env_has_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A stand-in desktop_env whose metrics package exports one name: the runner answers a
    # drums metric it lacks, and leaves desktop-env's own function of a name to desktop-env.
    metrics = tmp_path / "desktop_env" / "evaluators" / "metrics"
    metrics.mkdir(parents=True)
    (metrics / "__init__.py").write_text("from .vlc import check_play_and_exit\n")
    (metrics / "vlc.py").write_text("def check_play_and_exit(path, rule):\n    return 0.25\n")
    monkeypatch.setattr(checker_runner, "_desktop_env_root", lambda: tmp_path / "desktop_env")
    path = vlcrc(tmp_path, "#play-and-exit=0\n")
    request = {"kind": "metric", "func": "check_play_and_exit", "args": [path, RULE]}
    assert checker_runner.handle(request, tmp_path) == {"ok": True, "score": 0.25}
    (metrics / "__init__.py").write_text("from .vlc import other_metric\n")
    (metrics / "vlc.py").write_text("def other_metric():\n    return 0\n")
    assert checker_runner.handle(request, tmp_path) == {"ok": True, "score": 1.0}
    probe = checker_runner.handle({"kind": "probe"}, tmp_path)
    assert probe["exported"]["check_play_and_exit"] == checker_runner.DRUMS_MODULE
    assert "check_play_and_exit" not in probe["unsupported"]
