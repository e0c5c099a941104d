"""services.drumsd's sysctls meet NixOS's own definitions of the same keys and merge as NixOS
merges them (sysctl_eval.nix, builtins only, so this runs in CI without nixpkgs): the fixed module
wins cleanly, a host's own setting still wins over the module, and the module's sysctl lines as
they were before issue 20 fail with NixOS's uniqueness error (what the real NixOS module system
said of them, recipe in docs/nix.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from nix_support import REPO, nix_env, require_tool

HERE = Path(__file__).parent
EVAL = HERE / "sysctl_eval.nix"
NIXOS_DEFINITIONS = HERE / "fixtures" / "nixos-sysctl-definitions.nix"
OLD_LINES = HERE / "fixtures" / "sysctl-before-issue-20.nix.txt"
MODULE = REPO / "nixos-modules" / "drumsd.nix"
BLOCK = re.compile(r"^    boot\.kernel\.sysctl = \{\n.*?^    \};\n", re.S | re.M)


def merge(module: Path, host: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            require_tool("nix-instantiate"),
            "--eval",
            "--strict",
            "--json",
            str(EVAL),
            "--arg",
            "module",
            str(module),
            "--arg",
            "nixosDefinitions",
            str(NIXOS_DEFINITIONS),
            "--argstr",
            "hostJson",
            json.dumps(host or {}),
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=60,
    )


def merged(module: Path, host: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    result = merge(module, host)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def with_sysctl_block(tmp_path: Path, block: str) -> Path:
    """The current module with its boot.kernel.sysctl block replaced by `block`."""
    text = MODULE.read_text()
    assert len(BLOCK.findall(text)) == 1, "drumsd.nix has not exactly one boot.kernel.sysctl block"
    copy = tmp_path / "nixos-modules"
    shutil.copytree(MODULE.parent, copy)  # the module imports its generated siblings
    path = copy / MODULE.name
    path.write_text(BLOCK.sub(lambda _: block, text))
    return path


def nixos_values() -> dict[str, int]:
    result = subprocess.run(
        [
            require_tool("nix-instantiate"),
            "--eval",
            "--strict",
            "--json",
            str(NIXOS_DEFINITIONS),
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return {d["name"]: d["value"] for d in json.loads(result.stdout)}


def test_the_module_wins_over_nixos_defaults_without_a_conflict() -> None:
    out = merged(MODULE)
    module_keys = {
        "fs.inotify.max_user_instances",
        "fs.inotify.max_user_watches",
        "kernel.pid_max",
    }
    for key in module_keys:
        assert out[key]["file"] == str(MODULE), out[key]
        assert out[key]["priority"] < 1000, "the module must win over NixOS's mkDefault"
        assert out[key]["priority"] > 100, "a host's plain definition must still win"
    assert out["kernel.pid_max"]["value"] == 4194304
    # NixOS's own definitions of keys the module leaves alone are untouched.
    assert out["kernel.kptr_restrict"] == {
        "file": "nixos/modules/config/sysctl.nix",
        "priority": 1000,
        "value": 1,
    }


def test_the_module_never_lowers_a_limit_nixos_would_set() -> None:
    out = merged(MODULE)
    for key, value in nixos_values().items():
        if out[key]["file"] == str(MODULE):
            assert out[key]["value"] >= value, f"{key}: {out[key]['value']} < NixOS's {value}"


def test_a_host_definition_wins_over_the_module() -> None:
    out = merged(MODULE, {"kernel.pid_max": 65536, "fs.inotify.max_user_watches": 2097152})
    assert out["kernel.pid_max"] == {
        "file": "the host's configuration",
        "priority": 100,
        "value": 65536,
    }
    assert out["fs.inotify.max_user_watches"]["value"] == 2097152


def test_the_sysctl_lines_before_issue_20_fail_as_in_nixos(tmp_path: Path) -> None:
    result = merge(with_sysctl_block(tmp_path, OLD_LINES.read_text()))
    assert result.returncode != 0
    assert "is defined multiple times while it's expected to be unique" in result.stderr
    assert "drumsd.nix" in result.stderr, "the error must name the module"


def test_an_equal_value_at_nixos_priority_still_conflicts(tmp_path: Path) -> None:
    """The exact error the real NixOS module set gave: the same value, both at mkDefault."""
    block = '    boot.kernel.sysctl = {\n      "kernel.pid_max" = lib.mkDefault 4194304;\n    };\n'
    result = merge(with_sysctl_block(tmp_path, block))
    assert result.returncode != 0
    assert 'boot.kernel.sysctl."kernel.pid_max"\' is defined multiple times' in result.stderr


@pytest.mark.parametrize("value", ["1.5", "[ 1 ]"])
def test_a_value_nixos_cannot_write_fails(tmp_path: Path, value: str) -> None:
    block = f'    boot.kernel.sysctl = {{\n      "vm.drums_test" = {value};\n    }};\n'
    result = merge(with_sysctl_block(tmp_path, block))
    assert result.returncode != 0
    assert "is not of type `sysctl option value'" in result.stderr
