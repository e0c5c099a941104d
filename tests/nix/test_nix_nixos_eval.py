"""services.drumsd inside NixOS's real module system (nixos/lib/eval-config.nix with every NixOS
module) when the nixos-eval recipe's shim tree is given by path: DRUMS_NIXOS_SHIM=<its
nixpkgs-shim> (nixpkgs' lib, a nixos/ tree, stand-in packages; docs/nix.md says how to make it).
Neither nixpkgs nor that tree can be fetched on CI machines, so without it these tests skip;
test_nix_sysctl.py is the CI stand-in for the merge they check."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path
from typing import Any

import pytest
from nix_support import nix_env, require_tool
from test_nix_sysctl import OLD_LINES, with_sysctl_block

EVAL = Path(__file__).with_name("nixos_eval.nix")
SHIM = os.environ.get("DRUMS_NIXOS_SHIM")

pytestmark = pytest.mark.skipif(
    not SHIM,
    reason="set DRUMS_NIXOS_SHIM to the nixos-eval recipe's nixpkgs-shim tree to run "
    "(NixOS's module system is not available on CI machines)",
)


def _limit_memory() -> None:
    # Stand-in packages are infinite: a mistake must fail here, not take the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def evaluate(
    attr: str,
    user: dict[str, Any] | None = None,
    host: dict[str, Any] | None = None,
    module: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            require_tool("nix-instantiate"),
            "--eval",
            str(EVAL),
            "--arg",
            "shim",
            str(SHIM),
            "--argstr",
            "userJson",
            json.dumps(user or {}),
            "--argstr",
            "hostJson",
            json.dumps(host or {}),
            *(["--arg", "modulePath", str(module)] if module else []),
            "-A",
            attr,
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=300,
        preexec_fn=_limit_memory,
    )


def value(attr: str, **kwargs: Any) -> Any:
    result = evaluate(attr, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(json.loads(result.stdout))


def test_the_module_evaluates_in_nixos_with_no_failed_assertion_or_warning() -> None:
    assert value("failedAssertions") == []
    assert value("warnings") == []


def test_sysctls_win_over_nixos_defaults_and_lose_to_the_host() -> None:
    assert value("sysctl") == {
        "fs.inotify.max_user_instances": 524288,
        "fs.inotify.max_user_watches": 1048576,
        "kernel.pid_max": 4194304,
    }
    host = {"boot": {"kernel": {"sysctl": {"kernel.pid_max": 65536}}}}
    assert value("sysctl", host=host)["kernel.pid_max"] == 65536


def test_the_sysctl_lines_before_issue_20_fail_in_nixos(tmp_path: Path) -> None:
    result = evaluate("sysctl", module=with_sysctl_block(tmp_path, OLD_LINES.read_text()))
    assert result.returncode != 0
    assert 'boot.kernel.sysctl."kernel.pid_max"\' is defined multiple times' in result.stderr


def test_nixos_renders_the_units() -> None:
    unit = value("unitText")
    for line in ("Delegate=yes", "DelegateSubgroup=daemon", "KillMode=process", "Type=exec"):
        assert line in unit.splitlines(), unit
    assert "serve --config /nix/store/" in unit
    mount = value("mountUnitText")
    assert "Where=/run/drums" in mount and "Options=mode=0700,size=50%" in mount


def test_nixos_renders_the_ray_unit() -> None:
    assert value("rayUnitText") is None
    unit = value("rayUnitText", user={"ray": {"enable": True, "address": "10.0.0.1:6379"}})
    lines = unit.splitlines()
    assert "After=drumsd.service network-online.target" in lines, unit
    assert "Requires=drumsd.service" in lines and "PartOf=drumsd.service" in lines
    # NixOS's default host name is "nixos".
    assert any(
        line.startswith("ExecStart=")
        and line.endswith("bin/drums pool join --address 10.0.0.1:6379 --node-label nixos --block")
        for line in lines
    ), unit
