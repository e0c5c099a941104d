"""The local stand-in for a NixOS test machine: it manages its unit as the module's systemd unit
would, and refuses what it cannot do instead of pretending. Plus: a scenario whose expectation is
broken fails against the real daemon (the scenario checks are not vacuous)."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest
from nix_support import (
    CommandFailed,
    LocalMachine,
    LocalUnit,
    UnsupportedByStandIn,
    open_local_daemon,
)

# A tiny long-running "daemon": sleeps until signalled.
SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]


def machine_with_sleeper(tmp_path: Path, restart_sec: float = 0.2) -> LocalMachine:
    unit = LocalUnit(
        name="drumsd",
        argv=SLEEPER,
        token_file=tmp_path / "secrets" / "token",
        restart_sec=restart_sec,
        timeout_stop_s=5,
    )
    return LocalMachine([unit])


def main_pid(machine: LocalMachine) -> int:
    status, out = machine.systemctl("show -p MainPID --value drumsd")
    assert status == 0
    return int(out)


def wait_for_new_pid(machine: LocalMachine, old: int, timeout_s: float = 10) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = main_pid(machine)
        if pid not in (0, old):
            return pid
        time.sleep(0.05)
    raise AssertionError(f"no restart of pid {old} within {timeout_s}s")


def test_start_makes_a_0600_token_and_a_running_unit(tmp_path: Path) -> None:
    machine = machine_with_sleeper(tmp_path)
    machine.start()
    try:
        machine.wait_for_unit("drumsd", timeout=10)
        token = tmp_path / "secrets" / "token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert len(token.read_text()) >= 32
        assert machine.systemctl("is-active drumsd")[0] == 0
    finally:
        machine.shutdown()
    assert machine.systemctl("is-active drumsd") == (3, "inactive\n")


def test_kill_9_of_the_main_process_restarts_it_like_restart_on_failure(tmp_path: Path) -> None:
    machine = machine_with_sleeper(tmp_path)
    machine.start()
    try:
        machine.wait_for_unit("drumsd", timeout=10)
        first = main_pid(machine)
        assert machine.systemctl("kill --signal=KILL --kill-whom=main drumsd")[0] == 0
        second = wait_for_new_pid(machine, first)
        machine.wait_for_unit("drumsd", timeout=10)
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)
        machine.systemctl("restart drumsd")
        assert wait_for_new_pid(machine, second) > 0
    finally:
        machine.shutdown()


def test_stop_is_not_followed_by_a_restart(tmp_path: Path) -> None:
    machine = machine_with_sleeper(tmp_path, restart_sec=0.05)
    machine.start()
    machine.wait_for_unit("drumsd", timeout=10)
    machine.systemctl("stop drumsd")
    time.sleep(0.3)  # longer than restart_sec: a wrong restart would have happened by now
    assert main_pid(machine) == 0
    with pytest.raises(CommandFailed, match="inactive"):
        machine.wait_for_unit("drumsd", timeout=2)


def test_commands_run_locally_and_failures_raise(tmp_path: Path) -> None:
    machine = machine_with_sleeper(tmp_path)
    assert machine.succeed("echo hi", "echo there") == "hi\nthere\n"
    assert machine.execute("exit 3") == (3, "")
    with pytest.raises(CommandFailed):
        machine.succeed("false")
    with pytest.raises(CommandFailed):
        machine.fail("true")
    with pytest.raises(TimeoutError):
        machine.wait_until_succeeds("false", timeout=1)


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.screenshot("x"),
        lambda m: m.crash(),
        lambda m: m.send_key("ctrl-alt-delete"),
        lambda m: m.wait_for_unit("sshd"),
        lambda m: m.wait_for_unit("drumsd", user="alice"),
        lambda m: m.systemctl("kill drumsd"),  # every process of the cgroup: not emulated
        lambda m: m.systemctl("reload drumsd"),
        lambda m: m.succeed("systemctl daemon-reload"),
    ],
)
def test_what_the_stand_in_cannot_do_raises(tmp_path: Path, call) -> None:
    with pytest.raises(UnsupportedByStandIn):
        call(machine_with_sleeper(tmp_path))


def test_a_broken_scenario_expectation_fails_against_the_real_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Break one assertion of daemon_token (expect the token to be mode 0644): it must fail."""
    import daemon_token
    from drums_http import ScenarioFailure, plain_subtest

    real_check = daemon_token.check

    def broken_check(condition: bool, message: str) -> None:
        if message.startswith("token file mode is"):
            condition = not condition  # the scenario now demands a mode other than 600
        real_check(condition, message)

    monkeypatch.setattr(daemon_token, "check", broken_check)
    with open_local_daemon(tmp_path, live=False) as daemon:
        with pytest.raises(AssertionError, match="token file mode is 600") as caught:
            daemon_token.run(daemon.machine, daemon.target, plain_subtest)
    assert isinstance(caught.value.__cause__, ScenarioFailure)


def test_a_killed_test_run_leaves_no_daemon_behind(tmp_path: Path) -> None:
    """The unit's process dies with its launcher (PR_SET_PDEATHSIG), even on SIGKILL."""
    import signal
    import subprocess

    vm_tests = Path(__file__).resolve().parents[2] / "vm-tests"
    runner = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(vm_tests)!r})\n"
        "from local_machine import LocalMachine, LocalUnit\n"
        f"unit = LocalUnit(name='drumsd', argv={SLEEPER!r})\n"
        "LocalMachine([unit]).start()\n"
        "print(unit.main_pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.PIPE, text=True)
    daemon_pid = int(proc.stdout.readline())
    os.kill(daemon_pid, 0)  # running
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(daemon_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(daemon_pid, signal.SIGKILL)
    raise AssertionError(f"daemon {daemon_pid} outlived its killed launcher")


def test_commands_run_under_the_drivers_shell_options(tmp_path: Path) -> None:
    """Like the NixOS driver: set -euo pipefail, so a failing pipeline stage fails the command."""
    machine = machine_with_sleeper(tmp_path)
    assert machine.execute("false | cat")[0] != 0
    assert machine.execute("echo $UNSET_VARIABLE_FOR_TEST")[0] != 0


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
def test_a_delegated_unit_runs_in_its_own_cgroup_and_power_off_empties_it(tmp_path: Path) -> None:
    """Delegate=yes: the daemon and everything it leaves (like slots) live in the unit's cgroup;
    a power-off kills what is left there and removes the cgroup."""
    import uuid

    name = f"nixtest-{uuid.uuid4().hex[:8]}"
    # The "daemon" starts a child that outlives it, as a slot outlives a KillMode=process stop.
    leaver = [
        sys.executable,
        "-c",
        "import subprocess, time\nsubprocess.Popen(['sleep', '600'])\nwhile True: time.sleep(1)",
    ]
    unit = LocalUnit(name=name, argv=leaver, delegate=True, timeout_stop_s=5)
    machine = LocalMachine([unit])
    machine.start()
    machine.wait_for_unit(name, timeout=10)
    pid = unit.main_pid
    cgroup_line = Path(f"/proc/{pid}/cgroup").read_text()
    assert f"/{name}.service" in cgroup_line
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        procs = {p for d in unit.cgroup.dirs for p in (d / "cgroup.procs").read_text().split()}
        if len(procs) >= 2:
            break
        time.sleep(0.05)
    assert len(procs) >= 2, "the daemon's child is not in the unit's cgroup"
    machine.shutdown()
    assert not any(d.exists() for d in unit.cgroup.dirs)
