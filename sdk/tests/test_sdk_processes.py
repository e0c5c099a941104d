"""The examples as real processes over a real socket: the quickstart runs end to end, and a
SIGINT to the RL loop mid-episode leaves no env or saved state behind.

The daemon here is the fake app served by hypercorn. With DRUMS_LIVE=1 (CI: root, CRIU, the base
image) the same tests run against a real `drumsd serve` with the Linux runtime that this module
starts (tests/live/live_daemon.py), knowing the shared OSWorld tasks, so the examples' default task
e0df059f resolves; a host that cannot run it fails rather than skips. With DRUMS_SDK_LIVE_URL set
(and DRUMS_TOKEN or DRUMS_TOKEN_FILE) they run against that already running daemon instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import httpx
import pytest
from sdk_harness import TOKEN

import drums

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"
TASK = {"id": "e0df059f", "instruction": "Rename todo_list_Jan_1 to todo_list_Jan_2.", "config": []}
LIVE_URL = os.environ.get("DRUMS_SDK_LIVE_URL")
OWN_LIVE_DAEMON = not LIVE_URL and os.environ.get("DRUMS_LIVE") == "1"
LIVE = bool(LIVE_URL) or OWN_LIVE_DAEMON
REPO = HERE.parents[1]
# CI checks out the shared brief beside the repo: <repo>/../shared/osworld.
OSWORLD = REPO.parent / "shared" / "osworld"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mounts_under(root: Path) -> List[str]:
    prefix = str(root)
    return [
        target
        for target in (
            line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
        )
        if target == prefix or target.startswith(prefix + "/")
    ]


@pytest.fixture(scope="module")
def live_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, str]]:
    """A real `drumsd serve` (Linux runtime, base image) for this module's tests, DRUMS_LIVE=1."""
    sys.path[:0] = [str(REPO / "tests" / "live"), str(REPO / "tests" / "integration")]
    from live_daemon import require_live, start_live_daemon

    require_live("base")
    assert OSWORLD.is_dir(), f"no shared OSWorld tasks at {OSWORLD}: check out the brief there"
    tmp = Path(tmp_path_factory.mktemp("sdk-live-drumsd"))
    started = time.monotonic()
    # examples/tasks holds first_episode.py's default task (0f2c5a61); OSWorld's, the rl loop's
    task_dirs = [str(REPO / "examples" / "tasks"), str(OSWORLD)]
    daemon = start_live_daemon(tmp, image="base", tasks={"dirs": task_dirs})
    print(f"sdk live daemon {daemon.url}: base template ready in {time.monotonic() - started:.1f}s")
    try:
        yield {"DRUMS_URL": daemon.url, "DRUMS_TOKEN_FILE": str(daemon.dir / "token")}
    finally:
        # Slots outlive a stopped daemon: destroy whatever a failed test left, then stop it.
        try:
            auth = {"Authorization": f"Bearer {daemon.token}"}
            with httpx.Client(base_url=daemon.url, headers=auth, timeout=60) as http:
                for slot in http.get("/v1/slots").json().get("slots", []):
                    http.delete(f"/v1/slots/{slot['id']}")
        except httpx.HTTPError:
            pass
        daemon.stop(limit_s=60)
        # The runtime leaves its image-cache tmpfs mounted under state_dir after a stop.
        for target in sorted(_mounts_under(tmp / "state"), reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Dict[str, str]]:
    """Environment variables pointing the examples at a daemon."""
    if LIVE_URL:
        tokens = {k: os.environ[k] for k in ("DRUMS_TOKEN", "DRUMS_TOKEN_FILE") if k in os.environ}
        yield {"DRUMS_URL": LIVE_URL, **tokens}
        return
    if OWN_LIVE_DAEMON:
        yield request.getfixturevalue("live_daemon")
        return
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "sdk_serve_fake.py"), str(port), str(token_file)],
        cwd=HERE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the fake daemon did not start"
            time.sleep(0.05)
        yield {"DRUMS_URL": url, "DRUMS_TOKEN_FILE": str(token_file)}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def snapshot(env: Dict[str, str]) -> Tuple[Set[str], Set[str]]:
    with drums.connect(env["DRUMS_URL"], token_file=env.get("DRUMS_TOKEN_FILE"),
                       token=env.get("DRUMS_TOKEN")) as client:  # fmt: skip
        envs = {s.id for s in client.list_envs()}
        # Templates and task checkpoints are the daemon's own (kept and reaped by it); a
        # client's leak would be a slot, a saved state or a prefork.
        states = {c.id for c in client.list_states() if c.kind not in ("template", "task")}
    return envs, states


def run_example(name: str, args: List[str], env: Dict[str, str]) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def task_args(tmp_path: Path) -> List[str]:
    if LIVE:
        return []  # the example's default: examples/tasks' 0f2c5a61 (and e0df059f) on the daemon
    path = tmp_path / "task.json"
    path.write_text(json.dumps(TASK))
    return ["--task", str(path)]


def test_quickstart_runs_end_to_end(server: Dict[str, str], tmp_path: Path) -> None:
    before = snapshot(server)
    out = tmp_path / "shots"
    proc = run_example("first_episode", [*task_args(tmp_path), "--out", str(out)], server)
    output, _ = proc.communicate(timeout=600)
    print(output)  # under -s: the quickstart's real output, for the README
    assert proc.returncode == 0, output
    assert output.count("score") == 4 and f"screenshots in {out}" in output
    if LIVE:  # a real checker: the two copies that typed the rename solve it
        assert output.count("score 1.0") == 2 and output.count("score 0.0") == 2, output
    assert len(list(out.glob("*.png"))) == 6  # start, parent, 4 children
    assert snapshot(server) == before


def test_sigint_mid_episode_leaves_nothing(server: Dict[str, str], tmp_path: Path) -> None:
    before_envs, before_states = snapshot(server)
    args = [*task_args(tmp_path), "--episodes", "100000", "--max-steps", "50"]
    proc = run_example("rl_loop", args, server)
    try:
        # Wait until the loop is inside an episode: its env exists and has taken actions.
        deadline = time.monotonic() + 120
        with drums.connect(server["DRUMS_URL"], token=server.get("DRUMS_TOKEN"),
                           token_file=server.get("DRUMS_TOKEN_FILE")) as client:  # fmt: skip
            while True:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                new = [s for s in client.list_envs() if s.id not in before_envs]
                if new and client.attach(new[0].id).metrics().actions > 0:
                    break
                assert time.monotonic() < deadline, "the RL loop never started an episode"
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(output)
    assert proc.returncode == 130, output
    assert "interrupted" in output
    assert snapshot(server) == (before_envs, before_states)


def test_exception_inside_a_fork_block_leaves_nothing(
    server: Dict[str, str], tmp_path: Path
) -> None:
    before = snapshot(server)
    task = str(tmp_path / "task.json") if not LIVE else "e0df059f-28a6-4169-924f-b9623e7184cc"
    if not LIVE:
        Path(task).write_text(json.dumps(TASK))
    with pytest.raises(ZeroDivisionError):
        with drums.connect(server["DRUMS_URL"], token=server.get("DRUMS_TOKEN"),
                           token_file=server.get("DRUMS_TOKEN_FILE")) as client:  # fmt: skip
            env = client.create(task=task)
            env.wait_valid()
            with env.fork(2) as children:
                children[0].step({"type": "key", "key": "enter"})
                1 / 0  # noqa: B018
    assert snapshot(server) == before


# --- a client without `with`: cleanup at exit and on SIGTERM (issue 14, finding 8) -----------

NO_WITH = """
import os, signal, sys, time
import drums
if sys.argv[1] == "own-handler":
    signal.signal(signal.SIGTERM, lambda *a: (print("user handler", flush=True), sys.exit(3)))
client = drums.connect()  # never closed, no with block
env = client.create(task=sys.argv[2] if len(sys.argv) > 2 else None)
env.wait_valid()
state = env.save(keep=False)  # tied to this client: its exit cleanup deletes it
print("made", env.id, state.id, flush=True)
if sys.argv[1] == "return":
    sys.exit(0)
time.sleep(600)
"""


def run_no_with(mode: str, server: Dict[str, str], tmp_path: Path) -> "subprocess.Popen[str]":
    args = [a for a in task_args(tmp_path) if a != "--task"]
    return subprocess.Popen(
        [sys.executable, "-c", NO_WITH, mode, *args],
        env={**os.environ, **server},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize(
    ("mode", "sig", "returncode"),
    [
        ("return", None, 0),
        ("sleep", signal.SIGTERM, -signal.SIGTERM),
        ("sleep", signal.SIGINT, -signal.SIGINT),
    ],
)
def test_a_client_without_with_cleans_up_when_its_process_ends(
    server: Dict[str, str], tmp_path: Path, mode: str, sig: Optional[int], returncode: int
) -> None:
    before = snapshot(server)
    proc = run_no_with(mode, server, tmp_path)
    try:
        assert proc.stdout is not None
        made = proc.stdout.readline()
        assert made.startswith("made "), made + proc.stdout.read()
        env_id, state_id = made.split()[1:]
        if sig is not None:
            time.sleep(0.2)  # inside the sleep
            proc.send_signal(sig)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(output)
    # Still dies of the signal (a parent sees -15 / -2), after destroying what it made.
    assert proc.returncode == returncode, output
    assert "TypeError" not in output and "Exception ignored" not in output, output
    envs, states = snapshot(server)
    assert env_id not in envs and state_id not in states, output
    assert (envs, states) == before


def test_a_programs_own_sigterm_handler_is_left_alone(
    server: Dict[str, str], tmp_path: Path
) -> None:
    proc = run_no_with("own-handler", server, tmp_path)
    try:
        assert proc.stdout is not None
        made = proc.stdout.readline()
        assert made.startswith("made "), made + proc.stdout.read()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "user handler" in output and proc.returncode == 3, output
    envs, states = snapshot(server)  # its sys.exit ran atexit: cleaned up all the same
    assert made.split()[1] not in envs and made.split()[2] not in states
