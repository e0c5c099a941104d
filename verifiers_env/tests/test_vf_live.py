"""vf-eval against a real drumsd with the Linux runtime, one daemon for the whole file.

- a scripted solve scores 1 and a probe 0 (`hybrid` tools, inline tasks);
- a fork group of 4 on a task id the daemon serves (`task_ids`), played by the chat harness with
  its visual window (`drums` tools), and a `scalecua` rollout on the same task id;
each listing the daemon's slots and checkpoints before and after: nothing may be left.

The task is the shared OSWorld task e0df059f on the base image (its setup makes the directory
~/Desktop/todo_list_Jan_1; its checker asks for ~/Desktop/todo_list_Jan_2): the cheapest real task,
solved by one shell command. Both rollouts run in one vf-eval, each on its own restored desktop:
the solve's policy renames the directory through the `hybrid` tool `computer_shell` and calls
`computer_done`; the probe's gives up at once (`computer_fail`). The mock policy picks the script
from a `[policy:...]` marker put in each copy's instruction, so the tasks go inline (the task's own
setup and checker, a copy per script).

With DRUMS_LIVE=1 (CI: root, CRIU, the base image) this module starts its own `drumsd serve`
(tests/live/live_daemon.py); a host that cannot run it fails rather than skips. With
DRUMS_LIVE_URL (and DRUMS_LIVE_TOKEN_FILE, default /etc/drums/token) it uses that daemon instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from drums_verifiers.testing.mock_policy import MockPolicy
from vf_support import Fake, by_task, error_text, vf_eval

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parents[2]
# CI checks out the shared brief beside the repo: <repo>/../shared/osworld.
OSWORLD = REPO.parent / "shared" / "osworld"
RENAME = "e0df059f-28a6-4169-924f-b9623e7184cc"
PROBE = f"{RENAME}-probe"
SOLUTION = "mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"
SCRIPTS = {
    "live-solve": [
        {"tool": "computer_shell", "arguments": {"command": SOLUTION}},
        {"tool": "computer_done", "arguments": {}},
    ],
    "live-probe": [{"tool": "computer_fail", "arguments": {}}],
}


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root)
    targets = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return [t for t in targets if t == prefix or t.startswith(prefix + "/")]


def _slots(url: str, token: str) -> list[dict]:
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
        return http.get("/v1/slots").json().get("slots", [])


def _held(url: str, token: str) -> tuple[set[str], set[str]]:
    """The daemon's live slots and its checkpoints other than its own (templates, task
    checkpoints): a fork's prefork state is one, by id."""
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
        slots = {s["id"] for s in http.get("/v1/slots").json().get("slots", [])}
        cps = http.get("/v1/checkpoints").json().get("checkpoints", [])
    return slots, {c["id"] for c in cps if c.get("kind") not in ("template", "task")}


def _policy(tmp_path: Path, script: list[dict]) -> MockPolicy:
    """A scripted policy whose `default` script is `script` (task ids carry no marker)."""
    policy = MockPolicy({"default": script}, tmp_path / "policy-requests.jsonl")
    policy.base_url = f"http://127.0.0.1:{policy.serve()}/v1"  # type: ignore[attr-defined]
    return policy


def _eval_rename(
    daemon: tuple[str, Path], tmp_path: Path, label: str, script: list[dict], *args: str, **kw: Any
) -> tuple[list[dict], tuple[set[str], set[str]]]:
    """vf-eval on the real daemon's task RENAME (by id) with the scripted policy `script` and
    vf-eval's `args`: (its episodes, what the daemon held before, for the after check)."""
    url, token_file = daemon
    policy = _policy(tmp_path, script)
    real = Fake(url=url, token_file=token_file, task_dir=tmp_path, daemon=None)  # type: ignore[arg-type]
    before = _held(url, token_file.read_text().strip())
    started = time.monotonic()
    try:
        episodes = vf_eval(
            real,
            policy,
            tmp_path / "out",
            None,
            "--env.taskset.task-ids",
            json.dumps([RENAME]),
            *args,
            timeout=600,
            **kw,
        )
    finally:
        policy.close()
    print(f"vf live {label}: vf-eval took {time.monotonic() - started:.1f}s")
    return episodes, before


def _no_refusals(trace: dict) -> None:
    refused = [
        n["message"]["content"]
        for n in trace["nodes"]
        if n["message"].get("role") == "tool"
        and str(n["message"].get("content", "")).startswith("error:")
    ]
    assert not refused, f"the real daemon refused a tool call: {refused}"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(url, token file) of a real drumsd: DRUMS_LIVE_URL's, or one started here (DRUMS_LIVE=1)."""
    if os.environ.get("DRUMS_LIVE_URL"):
        yield (
            os.environ["DRUMS_LIVE_URL"],
            Path(os.environ.get("DRUMS_LIVE_TOKEN_FILE", "/etc/drums/token")),
        )
        return
    if os.environ.get("DRUMS_LIVE") != "1":
        pytest.skip("needs a real drumsd: DRUMS_LIVE=1 (CI) starts one, or DRUMS_LIVE_URL")
    sys.path[:0] = [str(REPO / "tests" / "live"), str(REPO / "tests" / "integration")]
    from live_daemon import require_live, start_live_daemon

    require_live("base")
    assert OSWORLD.is_dir(), f"no shared OSWorld tasks at {OSWORLD}: check out the brief there"
    tmp = Path(tmp_path_factory.mktemp("vf-live-drumsd"))
    started = time.monotonic()
    live = start_live_daemon(tmp, image="base", tasks={"dirs": [str(OSWORLD)]})
    print(f"vf live daemon {live.url}: base template ready in {time.monotonic() - started:.1f}s")
    try:
        yield live.url, live.dir / "token"
    finally:
        # Slots outlive a stopped daemon: destroy whatever a failed run left, then stop it.
        try:
            auth = {"Authorization": f"Bearer {live.token}"}
            with httpx.Client(base_url=live.url, headers=auth, timeout=60) as http:
                for slot in http.get("/v1/slots").json().get("slots", []):
                    http.delete(f"/v1/slots/{slot['id']}")
        except httpx.HTTPError:
            pass
        live.stop(limit_s=60)
        # The runtime leaves its image-cache tmpfs mounted under state_dir after a stop.
        for target in sorted(_mounts_under(tmp / "state"), reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def test_real_daemon_scripted_solve_scores_1_and_probe_0(
    daemon: tuple[str, Path], tmp_path: Path
) -> None:
    url, token_file = daemon
    task = json.loads(next(OSWORLD.rglob(f"{RENAME}.json")).read_text())
    task_dir = tmp_path / "tasks"
    task_dir.mkdir()
    for task_id, marker in ((RENAME, "live-solve"), (PROBE, "live-probe")):
        (task_dir / f"{task_id}.json").write_text(
            json.dumps(
                {**task, "id": task_id, "instruction": f"[policy:{marker}] {task['instruction']}"}
            )
        )
    policy = MockPolicy(SCRIPTS, tmp_path / "policy-requests.jsonl")
    policy.base_url = f"http://127.0.0.1:{policy.serve()}/v1"  # type: ignore[attr-defined]
    real = Fake(url=url, token_file=token_file, task_dir=task_dir, daemon=None)  # type: ignore[arg-type]
    token = token_file.read_text().strip()
    slots_before = {s["id"] for s in _slots(url, token)}
    started = time.monotonic()
    try:
        episodes = vf_eval(
            real,
            policy,
            tmp_path / "out",
            task_dir,
            "--env.taskset.task.tool-style",
            "hybrid",
            "--env.taskset.task.max-turns",
            "10",
            records=tmp_path / "records.jsonl",
            timeout=600,
        )
    finally:
        policy.close()
    elapsed = time.monotonic() - started
    traces = by_task(episodes)
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    for line in (tmp_path / "out" / "vf-eval.log").read_text().splitlines():
        if "rollout done" in line:
            print(f"vf live vf-eval: {line.strip()}")
    for task_id, expected in ((RENAME, 1.0), (PROBE, 0.0)):
        trace = traces[task_id][0]
        assert trace["ok"], error_text(trace)
        # A refused tool call still ends in a valid episode (scoring 0): name it, not the score.
        refused = [
            n["message"]["content"]
            for n in trace["nodes"]
            if n["message"].get("role") == "tool"
            and str(n["message"].get("content", "")).startswith("error:")
        ]
        assert not refused, f"{task_id}: the real daemon refused a tool call: {refused}"
        assert trace["rewards"]["task_success"]["score"] == expected, trace["rewards"]
        assert trace["info"]["drums"]["verdict"] == "valid", trace["info"]
        print(
            f"vf live {task_id}: score {trace['rewards']['task_success']['score']} "
            f"info {json.dumps(trace['info']['drums'], default=str)}"
        )
    for record in records:
        print(f"vf live record: {json.dumps(record, default=str)}")
    print(f"vf live: vf-eval took {elapsed:.1f}s")
    assert {r["task"] for r in records} >= {RENAME, PROBE}, records
    # vf-eval destroyed both desktops it made.
    assert {s["id"] for s in _slots(url, token)} <= slots_before


def test_fork_group_of_4_by_task_id_with_the_chat_harness(
    daemon: tuple[str, Path], tmp_path: Path
) -> None:
    """One episode: the daemon's task e0df059f (by id), a prefix of pyautogui code and an action
    dict, a fork into 4 children played at once by the windowed chat harness (2 images)."""
    url, token_file = daemon
    token = token_file.read_text().strip()
    script = [
        {"tool": "computer_click", "arguments": {"x": 200, "y": 200}},
        {"tool": "computer_move", "arguments": {"x": 300, "y": 300}},
        {"tool": "computer_done", "arguments": {}},
    ]
    episodes, before = _eval_rename(
        daemon,
        tmp_path,
        "fork group of 4",
        script,
        "--env.fork-n",
        "4",
        "--env.prefix",
        json.dumps(["pyautogui.moveTo(100, 100)", {"type": "click", "x": 120, "y": 120}]),
        "--env.settle-s",
        "0.2",
        "--env.max-concurrent-agents",
        "4",
        "--env.taskset.visual-window",
        "2",
        "--env.taskset.task.max-turns",
        "6",
        harness="drums-verifiers",
        records=tmp_path / "records.jsonl",
    )
    assert len(episodes) == 1, "a fork group is one episode"
    children = sorted(episodes[0]["traces"], key=lambda t: t["info"]["drums"]["fork_index"])
    infos = [c["info"]["drums"] for c in children]
    assert [i["fork_index"] for i in infos] == [0, 1, 2, 3], infos
    assert len({i["fork_parent"] for i in infos}) == 1 and infos[0]["fork_parent"]
    assert len({i["env"] for i in infos}) == 4
    for child in children:
        assert child["ok"], error_text(child)
        _no_refusals(child)
        # the task asks for a renamed directory: clicks do not solve it, a valid real 0
        assert child["rewards"]["task_success"]["score"] == 0.0, child["rewards"]
        assert child["info"]["drums"]["verdict"] == "valid"
        assert child["info"]["drums"]["actions"] == {"click": 1, "move": 1, "done": 1}
        print(f"vf live fork child: {json.dumps(child['info']['drums'], default=str)}")
    # The window: every request the policy saw had at most 2 images, though the last ones
    # followed the opening screenshot and 2 or more screenshots from tool calls.
    requests = [json.loads(line) for line in (tmp_path / "policy-requests.jsonl").open()]
    assert len(requests) == 4 * len(script), len(requests)
    assert max(sum(r["images"]) for r in requests) == 2, [r["images"] for r in requests]
    assert max(r["roles"].count("tool") for r in requests) == 2
    assert _held(url, token) == before, "the fork group left slots or its prefork state"


def test_scalecua_tools_on_a_task_id(daemon: tuple[str, Path], tmp_path: Path) -> None:
    url, token_file = daemon
    token = token_file.read_text().strip()
    script = [
        {"tool": "computer", "arguments": {"action": "click", "x": 200, "y": 200}},
        {"tool": "computer", "arguments": {"action": "terminate", "status": "failure"}},
    ]
    episodes, before = _eval_rename(
        daemon,
        tmp_path,
        "scalecua",
        script,
        "--env.taskset.task.tool-style",
        "scalecua",
        "--env.taskset.task.max-turns",
        "4",
    )
    (trace,) = by_task(episodes)[RENAME]
    assert trace["ok"], error_text(trace)
    _no_refusals(trace)
    assert trace["rewards"]["task_success"]["score"] == 0.0
    assert trace["info"]["drums"]["actions"] == {"click": 1, "fail": 1}, trace["info"]
    assert trace["info"]["drums"]["turns"] == 2
    assert _held(url, token) == before


def test_documented_command_in_prime_rl_env_on_a_real_task(
    daemon: tuple[str, Path], tmp_path: Path, record_property: Any
) -> None:
    """prime-rl's own environment (its pinned verifiers, whose v1 CLI is `eval`): the README's
    command as written, default harness (drums-verifiers) and runtime, on task e0df059f on a real
    desktop; a valid trace (clicks do not solve it: 0.0), nothing left on the daemon. A slow
    matrix row: CI runs it on the days it samples it (test_vf_verl.slow_rows)."""
    from test_vf_verl import slow_rows

    if os.environ.get("DRUMS_PRIMERL_LIVE") != "1" and "primerl-live" not in slow_rows():
        pytest.skip(
            "slow row, not CI's sample today (a real-desktop eval in prime-rl's env, ~45 s): "
            "DRUMS_PRIMERL_LIVE=1 or DRUMS_TRAINER_MATRIX=1 runs it; CI runs the same command "
            "in prime-rl's env on the fake drumsd every day (test_vf_primerl.py)"
        )
    from test_vf_documented_command import run_documented
    from test_vf_primerl import primerl_env, primerl_venv

    venv = primerl_venv()
    url, token_file = daemon
    token = token_file.read_text().strip()
    task = json.loads(next(OSWORLD.rglob(f"{RENAME}.json")).read_text())
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / f"{RENAME}.json").write_text(json.dumps(task))
    script = [
        {"tool": "computer_click", "arguments": {"x": 200, "y": 200}},
        {"tool": "computer_done", "arguments": {}},
    ]
    policy = _policy(tmp_path, script)
    before = _held(url, token)
    started = time.monotonic()
    try:
        proc, episodes = run_documented(
            str(venv / "bin" / "eval"), tmp_path, policy.base_url, url, token_file,  # type: ignore[attr-defined]
            tmp_path / "tasks", extra_env=primerl_env(venv),
        )  # fmt: skip
    finally:
        policy.close()
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    (trace,) = by_task(episodes)[RENAME]
    assert trace["ok"], error_text(trace)
    _no_refusals(trace)
    assert trace["info"]["drums"]["verdict"] == "valid", trace["info"]
    assert trace["rewards"]["task_success"]["score"] == 0.0, trace["rewards"]
    assert trace["info"]["drums"]["actions"] == {"click": 1, "done": 1}, trace["info"]
    requests = [json.loads(line) for line in (tmp_path / "policy-requests.jsonl").open()]
    assert all(sum(r["images"]) >= 1 for r in requests), [r["images"] for r in requests]
    assert _held(url, token) == before
    drums_info = trace["info"]["drums"]
    print(f"vf live prime-rl env: eval took {elapsed:.1f}s, {json.dumps(drums_info)}")
    record_property(
        "result",
        {key: drums_info[key] for key in ("verdict", "score", "actions", "turns")}
        | {"images_per_request": [sum(r["images"]) for r in requests], "eval_s": round(elapsed, 1)},
    )
