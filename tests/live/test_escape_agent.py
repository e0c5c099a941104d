"""The guest agent is out of the desktop user's reach (issue 14, finding 1).

The checker's commands, screenshots and trusted provisioning go through the guest agent. If the
desktop user (every `execute` action) can write into the agent's memory, take its descriptors,
signal it, or answer on its socket, it can forge the checker's inputs: a free reward. Here the
desktop user tries every one of those ways on a slot holding an unsolved OSWorld task, each attempt
must fail with the errno named, and the task must still score 0.

DRUMS_LIVE=1, root, the base image.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from drumsd.runtime import agent_client
from gate_daemons import create, destroy, settled_gates, shared_daemon, verify
from harness import poll
from live_daemon import http_client
from test_escape_hardened import execute, host_view, python_in_slot

pytestmark = pytest.mark.live

RENAME = "e0df059f-28a6-4169-924f-b9623e7184cc"  # unsolved it scores 0

# Run as the desktop user: every way we know to reach the agent, each answered by its errno name
# ("ok" if it worked).
_ATTACKS = r"""
import ctypes, errno, json, os, signal, socket

agent = AGENT_PID  # its in-slot pid, from its ping on the host side
res = {"agent": agent, "me": os.getuid()}
status = open(f"/proc/{agent}/status").read()
res["agent_uid"] = [ln.split()[1:] for ln in status.splitlines() if ln.startswith("Uid:")][0]

def attempt(name, fn):
    try:
        fn()
        res[name] = "ok"
    except OSError as exc:
        res[name] = errno.errorcode.get(exc.errno, str(exc.errno))

def write_mem():
    # What the probe did: code written into the agent where it blocks.
    fd = os.open(f"/proc/{agent}/mem", os.O_RDWR)
    os.close(fd)

libc = ctypes.CDLL(None, use_errno=True)

def getfd():
    pidfd = os.pidfd_open(agent)
    try:
        errs = set()
        for target in range(16):
            fd = libc.syscall(438, pidfd, target, 0)  # pidfd_getfd
            if fd >= 0:
                os.close(fd)
                return
            errs.add(ctypes.get_errno())
        raise OSError(errno.EPERM if errno.EPERM in errs else errs.pop(), "pidfd_getfd")
    finally:
        os.close(pidfd)

def connect():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/run/drums/agent.sock")
    finally:
        s.close()

def listen_beside():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind("/run/drums/impostor.sock")
    finally:
        s.close()

def append(path):
    def run():
        with open(path, "ab"):
            pass
    return run

attempt("mem_write", write_mem)
attempt("syscall_read", lambda: open(f"/proc/{agent}/syscall").read())
attempt("environ_read", lambda: open(f"/proc/{agent}/environ", "rb").read())
attempt("pidfd_getfd", getfd)
attempt("signal_0", lambda: os.kill(agent, 0))
attempt("socket_connect", connect)
attempt("socket_rename", lambda: os.rename("/run/drums/agent.sock", "/run/drums/real.sock"))
attempt("socket_unlink", lambda: os.unlink("/run/drums/agent.sock"))
attempt("socket_bind_beside", listen_beside)
attempt("log_write", append("/run/drums/log/agent.log"))
attempt("code_write", append("/opt/drums/guest/drums_guest/agent.py"))
print(json.dumps(res))
"""

# Signals that would stop or kill the agent are sent from the background, after the step that
# started them has had its answer (the agent carries that answer).
_SIGNALS = r"""
import errno, json, os, signal, time
agent = int(os.environ["AGENT"])
time.sleep(1)
res = {}
for name, sig in (("sigstop", signal.SIGSTOP), ("sigcont", signal.SIGCONT),
                  ("sigterm", signal.SIGTERM), ("sigkill", signal.SIGKILL)):
    try:
        os.kill(agent, sig)
        res[name] = "ok"
    except OSError as exc:
        res[name] = errno.errorcode.get(exc.errno, str(exc.errno))
json.dump(res, open("/tmp/signals.json.tmp", "w"))
os.rename("/tmp/signals.json.tmp", "/tmp/signals.json")
"""

# What each attempt must answer (a set: either errno is a refusal for that way in).
REFUSED = {
    "mem_write": {"EACCES", "EPERM"},
    "syscall_read": {"EACCES", "EPERM"},
    "environ_read": {"EACCES", "EPERM"},
    "pidfd_getfd": {"EPERM"},
    "signal_0": {"EPERM"},
    "socket_connect": {"EACCES"},
    "socket_rename": {"EACCES"},
    "socket_unlink": {"EACCES"},
    "socket_bind_beside": {"EACCES"},
    "log_write": {"EACCES"},
    "code_write": {"EACCES", "EROFS"},
}


def _ping_from_host(init_pid: int) -> dict:
    return trio.run(agent_client.ping, agent_client.agent_socket(init_pid))


@pytest.fixture(scope="module")
def daemon():
    return shared_daemon("agent-reach")


def test_desktop_user_cannot_reach_the_agent_and_an_unsolved_task_scores_0(daemon) -> None:
    with http_client(daemon) as http:
        sid = create(http, task=RENAME)["id"]
        try:
            agent_pid_before = _ping_from_host(host_view(http, sid).init)["pid"]
            found = python_in_slot(http, sid, _ATTACKS.replace("AGENT_PID", str(agent_pid_before)))
            print("attempts:", found)
            assert found["me"] == 1000, found
            reached = {k: found[k] for k, ok in REFUSED.items() if found[k] not in ok}
            b64 = base64.b64encode(_SIGNALS.encode()).decode()
            execute(
                http,
                sid,
                f'AGENT={found["agent"]} setsid python3 -c "import base64; '
                f"exec(base64.b64decode('{b64}'))\" >/dev/null 2>&1 &",
            )
            signals = json.loads(
                poll(
                    "the signal attempts' results",
                    lambda: execute(http, sid, "cat /tmp/signals.json 2>/dev/null").stdout,
                    limit_s=30,
                )
            )
            print("signals:", signals)
            reached.update({k: v for k, v in signals.items() if v != "EPERM"})
            assert not reached, f"the desktop user reached the agent: {reached} (all: {found})"
            assert found["agent_uid"] != ["1000"] * 4, (
                f"the agent runs as the desktop user: {found}"
            )
            view = host_view(http, sid)
            ping = _ping_from_host(view.init)
            assert ping["pid"] == agent_pid_before, "the agent was restarted: a signal reached it"
            assert ping["dumpable"] == 0, ping

            settled_gates(http, sid)
            r = verify(http, sid)
            assert r.status_code == 200, r.text
            result = r.json()
            assert result["score"] == 0.0 and result["valid"] is True, result

            # After a reset (a CRIU restore of the template) the agent is still not dumpable.
            r = http.post(f"/v1/slots/{sid}/reset", json={})
            assert r.status_code == 200, r.text
            ping = _ping_from_host(host_view(http, sid).init)
            print("after reset:", ping)
            assert ping["dumpable"] == 0 and ping["uid"] != 1000, ping
        finally:
            destroy(http, sid)
