"""Fixtures: a fake drumsd and a mock policy on loopback."""

from __future__ import annotations

from pathlib import Path

import matrix_results
import pytest
from drums_verifiers.testing.fake_drumsd import FakeDaemon, FakeDrumsd, load_tasks
from drums_verifiers.testing.mock_policy import MockPolicy
from vf_support import SCRIPTS, TASKS, TOKEN, Fake, write_tasks


@pytest.fixture
def fake_host(tmp_path: Path):
    """A fake drumsd knowing every task in TASKS (tests pick theirs with a task_dir)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    all_tasks = tmp_path / "all-tasks"
    write_tasks(all_tasks, list(TASKS))
    daemon = FakeDaemon(load_tasks(all_tasks), TOKEN)
    server = FakeDrumsd(daemon)
    url = server.serve()
    yield Fake(url=url, token_file=token_file, task_dir=all_tasks, daemon=daemon)
    server.close()


@pytest.fixture
def policy(tmp_path: Path):
    mock = MockPolicy(SCRIPTS, tmp_path / "policy-requests.jsonl")
    port = mock.serve()
    mock.base_url = f"http://127.0.0.1:{port}/v1"  # type: ignore[attr-defined]
    yield mock
    mock.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Every test's result goes to the trainer matrix's results (matrix_results.py)."""
    outcome = yield
    matrix_results.record(outcome.get_result(), item.get_closest_marker("live") is not None)
