"""Issue 39 on a real restored desktop, through verify as a trainer calls it: a planted module
does not forge the writer example's reward (D2), the scope audit and the file getters stay in the
slot when the agent links its files to the host (D4), and a checker parsing a huge agent-made
file fails at its memory limit (D5). DRUMS_LIVE=1 (root, CRIU, the base image, the checker venv).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import (
    OSWORLD,
    VERIFIER_MODULE,
    VERIFIERS,
    put_file,
    shared_daemon,
    state_of,
    timed_verify,
)
from live_daemon import http_client

WRITER = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "writer.json"
MEMORY_MIB = 256


@pytest.fixture(scope="module")
def daemon():
    return shared_daemon(
        "checker-limits",
        tasks={
            "osworld": {"dir": str(OSWORLD)},
            "verifier_dirs": [str(VERIFIERS)],
            "eval_timeout_s": 60.0,
            "checker_memory_mib": MEMORY_MIB,
            "checker_cpu_s": 20.0,
        },
    )


def _verify_after(daemon, task: dict, commands: list[str]) -> tuple[dict, int, float]:
    """Create on `task`, run the agent's `commands`, verify: (result, answer bytes, seconds)."""
    r, took = timed_verify(daemon, task, commands)
    result = r.json()
    assert result["valid"] is True, result
    return result, len(r.content), took


# ---- D2: a planted module forges no reward -----------------------------------------------------

FORGED_ZIPFILE = (
    "class ZipFile:\n"
    "    def __init__(self, *a, **k): pass\n"
    "    def read(self, name): return b'Drums restore desktops.'\n"
)
FORGING_PTH = (
    "import sys; sys.modules['zipfile'] = __import__('types').SimpleNamespace(ZipFile=lambda *a: "
    "__import__('types').SimpleNamespace(read=lambda n: b'Drums restore desktops.'))\n"
)
PLANT = [
    put_file("/home/user/zipfile.py", FORGED_ZIPFILE.encode()),
    put_file("/home/user/.local/lib/python3.11/site-packages/forge.pth", FORGING_PTH.encode()),
    # The plant works for the desktop user's own python3 (so this test can fail).
    "cd ~ && python3 -c \"import zipfile; print(zipfile.ZipFile('none').read('x'))\" "
    "| grep -q 'Drums restore'",
]
SOLVE_WRITER = (
    'mkdir -p ~/Documents && python3 -I -c "import zipfile; z = zipfile.ZipFile('
    "'/home/user/Documents/note.odt', 'w'); z.writestr('content.xml', "
    "'<p>Drums restore desktops.</p>'); z.close()\""
)


def _writer_task() -> dict[str, Any]:
    task = json.loads(WRITER.read_text())
    # The writer's own checker, on the base image: the agent writes the document itself.
    return {
        "id": f"writer-planted-{uuid.uuid4().hex[:8]}",
        "instruction": task["instruction"],
        "config": [],
        "evaluator": task["evaluator"],
    }


def test_a_planted_module_does_not_forge_the_writer_reward(daemon):
    unsolved, _, _ = _verify_after(daemon, _writer_task(), PLANT)
    assert unsolved["score"] == 0.0 and unsolved["checker_error"] is None, unsolved
    solved, _, _ = _verify_after(daemon, _writer_task(), [SOLVE_WRITER, *PLANT])
    assert solved["score"] == 1.0 and solved["checker_error"] is None, solved


def test_a_getter_command_runs_as_another_uid_from_the_root(daemon):
    task = {
        "id": f"checker-uid-{uuid.uuid4().hex[:8]}",
        "instruction": "nothing",
        "config": [],
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "id -u; pwd; env | grep -c ^XAUTH",
                       "shell": True},
            "expected": {"type": "rule", "rules": {"expected": "65534\n/\n0\n"}},
        },
    }  # fmt: skip
    result, _, _ = _verify_after(daemon, task, [])
    assert result["score"] == 1.0, result


# ---- D4: the audit and the getters stay in the slot --------------------------------------------


def _answer_task(scope_roots: list[str]) -> dict[str, Any]:
    return {
        "id": f"confined-{uuid.uuid4().hex[:8]}",
        "instruction": "Write yes into ~/Desktop/answer.txt.",
        "config": [],
        "evaluator": {
            "func": "drums_verifier",
            "module": VERIFIER_MODULE,
            "check": "answer_is_yes",
            "result": [
                {"type": "vm_file", "path": "/home/user/Desktop/answer.txt", "dest": "answer.txt"}
            ],
            "scope": {"roots": scope_roots, "allow": ["/home/user/.cache/*"]},
        },
    }


def test_the_scope_audit_lists_no_host_path_behind_a_link(daemon):
    host_dir = state_of(daemon)  # the daemon's own state dir, as in the finding
    link = f"rm -rf ~/Documents && ln -s {host_dir} ~/Documents && ln -s / ~/Desktop/root"
    result, size, took = _verify_after(
        daemon, _answer_task(["/home/user/Documents", "/home/user/Desktop"]), [link]
    )
    scope = result["audit"]["scope"]
    assert scope["checked"] is True, scope
    assert scope["changed"] == ["/home/user/Desktop/root", "/home/user/Documents"], scope
    assert "scope_violation" in result["audit"]["flags"]
    assert size < 16 * 1024 and took < 30, (size, took)


def test_a_file_getter_reads_no_host_file_through_a_link(daemon, tmp_path):
    host_file = Path(f"/run/drums-host-answer-{uuid.uuid4().hex}")
    host_file.write_text("yes\n")  # a host file a followed link would score 1 with
    try:
        link = f"mkdir -p ~/Desktop && ln -sf {host_file} ~/Desktop/answer.txt"
        result, _, _ = _verify_after(daemon, _answer_task(["/home/user/.cache"]), [link])
    finally:
        host_file.unlink()
    assert result["score"] == 0.0 and result["checker_error"] is None, result


# ---- D5: a checker parsing a huge agent-made file ----------------------------------------------

WRITE_BIG_XML = (
    'python3 -I -c "import sys; row = b\\"<r a=\'1\'>x</r>\\"; '
    "f = open('/home/user/Desktop/big.xml', 'wb'); f.write(b'<d>' + row * (60 * 2**20 // len(row))"
    " + b'</d>'); f.close()\""
)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_checker_parsing_a_huge_file_fails_at_its_memory_limit(daemon):
    task = {
        "id": f"huge-xml-{uuid.uuid4().hex[:8]}",
        "instruction": "nothing",
        "config": [],
        "evaluator": {
            "func": "drums_verifier",
            "module": VERIFIER_MODULE,
            "check": "parses_xml",
            "result": [
                {"type": "vm_file", "path": "/home/user/Desktop/big.xml", "dest": "big.xml"}
            ],
        },
    }
    rss_before = _rss_mib(daemon.proc.pid)
    result, _, took = _verify_after(daemon, task, [WRITE_BIG_XML])
    grown = _rss_mib(daemon.proc.pid) - rss_before
    assert result["score"] is None, result
    assert (result["checker_error"] or "").startswith("memory_limit"), result
    assert f"checker_memory_mib={MEMORY_MIB}" in result["checker_error"]
    assert "checker_memory_limit" in result["audit"]["flags"], result["audit"]
    assert result["trusted"] is False
    assert took < 60, took  # the limit ended it, not the eval timeout
    assert grown < 400, f"the daemon grew {grown:.0f} MiB"
    with http_client(daemon) as http:
        checkers = http.get("/v1/health").json()["pools"]["checkers"]
    assert isinstance(checkers["calls"], int), checkers  # the worker's count, as before
    bound = checkers["concurrency"]
    assert bound["max_concurrent"] == 2 and bound["running"] == 0, bound
    assert bound["memory_mib_each"] == MEMORY_MIB and bound["reserved_mib"] == 0.0, bound
