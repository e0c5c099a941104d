"""A task's trusted (`sudo`) setup step runs with a clean environment, not the daemon's (issue 39,
D9): a step that wrote `env` to a file in the slot handed the agent DRUMS_TOKEN and
DRUMS_TOKEN_FILE. Here the step writes its environment where the desktop user reads it, and
nothing of the daemon's may be in it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from drumsd.core.slot_env import ROOT_PATH
from live_daemon import Daemon, http_client

ENV_FILE = "/tmp/drums-trusted-env.txt"
TASK = {
    "id": "drums-trusted-env",
    "instruction": "Nothing to do: the setup step records its environment.",
    "config": [
        {
            "type": "execute",
            "parameters": {
                "command": ["sudo", "sh", "-c", f"env > {ENV_FILE}; chmod 644 {ENV_FILE}"]
            },
        }
    ],
    "evaluator": {"func": "infeasible"},
}
# What sudo would give, plus what sh itself sets.
ALLOWED = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "DISPLAY", "XAUTHORITY"}
SHELL_SET = {"PWD", "SHLVL", "_", "OLDPWD"}


@pytest.fixture
def http(live_daemon: Daemon) -> Iterator[httpx.Client]:
    with http_client(live_daemon) as client:
        yield client


def test_a_sudo_step_sees_none_of_the_daemons_environment(
    live_daemon: Daemon, http: httpx.Client
) -> None:
    assert live_daemon.proc is not None
    with open(f"/proc/{live_daemon.proc.pid}/environ", "rb") as f:
        daemon_env = dict(
            item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item
        )
    r = http.post("/v1/slots", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    try:
        r = http.post(f"/v1/slots/{sid}/task", json={"task": TASK})
        assert r.status_code == 200, r.text
        r = http.post(
            f"/v1/slots/{sid}/step",
            json={"action": {"type": "execute", "command": f"cat {ENV_FILE}"}},
        )
        assert r.status_code == 200, r.text
        output = r.json()["output"]
        assert output["returncode"] == 0, output
        seen = dict(line.split("=", 1) for line in output["stdout"].splitlines() if "=" in line)
    finally:
        http.delete(f"/v1/slots/{sid}")
    assert seen, output
    leaked = sorted(k for k in seen if k.startswith("DRUMS_"))
    assert not leaked, f"the trusted step saw the daemon's {leaked}"
    assert set(seen) <= ALLOWED | SHELL_SET, sorted(set(seen) - ALLOWED - SHELL_SET)
    assert seen["PATH"] == ROOT_PATH and seen["HOME"] == "/root" and seen["USER"] == "root"
    # Nothing of the daemon's own that is not in the allowlist with the same value.
    from_daemon = {k for k, v in daemon_env.items() if seen.get(k) == v and k not in ALLOWED}
    assert not from_daemon, sorted(from_daemon)
