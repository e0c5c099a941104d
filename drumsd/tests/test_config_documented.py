"""A config file written from the design's field table (DESIGN.md, "Configuration": its keys, their
documented defaults, the runtime's keys in their `osw` block) is accepted with notices only, and a
file with several problems names them all in one run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from drumsd.core.config import ConfigError, config_with_notices

DOCUMENTED: dict[str, object] = {
    "listen": "127.0.0.1:7070",
    "allow_remote": False,
    "token_file": "/etc/drums/token",
    "state_dir": "/run/drums",
    "journal_dir": "/var/lib/drums/journal",
    "osw": {
        "lower": "/var/lib/drums/images/office/root",
        "image_sha256": "0" * 64,
        "criu": "/usr/local/sbin/criu",
        "vcpus": 1.0,
        "memory_mib": 2048,
        "swap_mib": 0,
        "port_base": None,
        "slot_range": [100, 2000],
        "max_concurrent_restores": 4,
        "natural_exits": [],
        "alive_after_s": 5.0,
        "max_attempts": 3,
        "warm_upper": True,
        "async_kill": True,
        "restore_cpu_boost": True,
    },
    "extra_ports": [],
    "prefork_max_age_s": 120,
    "crash_watch": True,
    "host_usd_per_hour": None,
    "quiesce": {
        "window_s": 1.0,
        "timeout_s": 30,
        "poll_ms": 50,
        "max_attempts": 3,
        "events": True,
        "confirm_s": 0.5,
    },
    "admission": {
        "enabled": True,
        "min_available_pct": 8,
        "min_available_mib": 4096,
        "env_mib": 1024,
        "capture_mib": 2048,
        "max_memory_psi_some_avg10": 10,
        "min_state_free_mib": 8192,
    },
    "lease": {
        "env_idle_timeout_s": 1800,
        "env_ttl_s": None,
        "state_idle_timeout_s": 1800,
        "state_ttl_s": None,
        "reap_interval_s": 15,
    },
    "retention": {"mode": "failures_full", "summary_max_gib": 2, "full_max_gib": None},
    "forgotten_dir": None,
    "state_min_free_mib": 1024,
    "state_warn_free_pct": 15,
    "tasks": {},
}


def test_the_documented_config_passes_with_notices_only() -> None:
    config, notices = config_with_notices(DOCUMENTED)
    assert config.lower == Path("/var/lib/drums/images/office/root")
    assert config.slot_range == (100, 2000) and config.max_concurrent_restores == 4
    assert config.extra_ports == {} and config.quiesce.window_s == 1.0
    assert any(n.startswith("osw.lower: read as top-level `lower`") for n in notices)
    assert any(n.startswith("quiesce.confirm_s: accepted and unused") for n in notices)
    assert any(n.startswith("extra_ports: [] read as {}") for n in notices)
    assert any(n.startswith("forgotten_dir: null read as the default") for n in notices)
    assert len(notices) == 15 + 3


def test_every_problem_of_a_file_is_named_in_one_run() -> None:
    raw = json.loads(json.dumps(DOCUMENTED))
    raw["osw"]["vcpu"] = 2  # a typo in the block
    raw["memory_mib"] = 4096  # contradicts osw.memory_mib
    raw["extra_ports"] = [5900]  # a list with ports has no bases
    raw["quiesce"]["window_s"] = -1  # out of range
    raw["colour"] = "blue"  # unknown
    with pytest.raises(ConfigError) as err:
        config_with_notices(raw, "drumsd.json")
    problems = err.value.problems
    for start in (
        "osw.vcpu: unknown key",
        "osw.memory_mib: set to 2048 while top-level",
        "extra_ports: a list of ports has no host bases",
        "quiesce.window_s:",
        "colour: unknown key",
    ):
        assert any(p.startswith(start) for p in problems), (start, problems)


def test_check_config_prints_notices_and_explains(tmp_path: Path) -> None:
    path = tmp_path / "drumsd.json"
    path.write_text(json.dumps(DOCUMENTED))
    run = subprocess.run(
        [sys.executable, "-m", "drumsd.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert f"{path}: notice: osw.criu: read as top-level `criu`" in run.stderr
    assert json.loads(run.stdout)["criu"] == "/usr/local/sbin/criu"
    explain = subprocess.run(
        [sys.executable, "-m", "drumsd.cli", "check-config", "--explain"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert explain.returncode == 0 and "osw.alive_after_s" in explain.stdout
    assert "quiesce.confirm_s" in explain.stdout
