"""services.drumsd inside NixOS's real module system, in CI: nixos/lib/eval-config.nix with every
NixOS module (../shared/nixpkgs-snapshot: nixpkgs 25.11's lib and a nixos/ tree), stand-in
packages shaped like nixpkgs' outputs (tests/nix/nixos/), a host with typical settings and each VM
test's node. One evaluation (~6 s) forces every unit text and script the module renders; any
evaluation error or failed assertion fails these tests. A clone without ../shared skips them."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from drumsd.core.admission import HostSample, decide
from drumsd.core.config import AdmissionConfig
from nix_support import REPO, nix_env, require_tool
from nixos_tree import unpack_tree
from test_nix_module_eval import build_root_tar
from test_nix_sysctl import OLD_LINES, with_sysctl_block

EVAL = Path(__file__).with_name("nixos") / "eval.nix"

# What a host's admin typically sets (docs/nix.md's example, remote access, the pool unit).
TYPICAL_HOST: dict[str, Any] = {
    "enable": True,
    "stateTmpfsSize": "16G",
    "openFirewall": True,
    "settings": {
        "listen": "0.0.0.0:7443",
        "allow_remote": True,
        "memory_mib": 3072,
        "admission": {"min_available_mib": 8192},
    },
    "ray": {"enable": True, "address": "10.0.0.1:6379"},
}
VM_TESTS = {"vm-daemon-token", "vm-episode", "vm-fork-isolation"}
VM_TESTS |= {"vm-gate-quarantine", "vm-crash-recovery"}


def _limit_memory() -> None:
    # Stand-ins are self-similar: a mistake must fail here, not take the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return unpack_tree(tmp_path_factory.mktemp("nixpkgs-snapshot"))


def evaluate(
    tree: tuple[Path, Path],
    host: dict[str, Any],
    module: Path | None = None,
    nodes: bool = True,
    pinned: bool = False,
) -> subprocess.CompletedProcess[str]:
    path, names = tree
    return subprocess.run(
        [
            require_tool("nix-instantiate"),
            "--eval",
            str(EVAL),
            "--arg",
            "tree",
            str(path),
            "--arg",
            "namesFile",
            str(names),
            "--argstr",
            "hostJson",
            json.dumps(host),
            *(["--arg", "modulePath", str(module)] if module else []),
            *([] if nodes else ["--arg", "withNodes", "false"]),
            *(["--arg", "pinned", "true"] if pinned else []),
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=300,
        preexec_fn=_limit_memory,
    )


@pytest.fixture(scope="module")
def system(tree: tuple[Path, Path]) -> dict[str, Any]:
    result = evaluate(tree, TYPICAL_HOST)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(json.loads(result.stdout))


def test_the_host_and_every_vm_node_evaluate_without_failed_assertions(system: dict) -> None:
    assert set(system["nodes"]) == VM_TESTS
    for name, config in [("host", system["host"]), *system["nodes"].items()]:
        assert config["failedAssertions"] == [], name
        assert config["warnings"] == [], name


def test_nixos_renders_every_unit_and_script(system: dict) -> None:
    host = system["host"]
    units = host["units"]
    assert set(units) == {"drumsd.service", "drumsd-image.service", "drumsd-ray.service"} | {
        "run-drums.mount"
    }
    service = units["drumsd.service"].splitlines()
    for line in ("Delegate=yes", "DelegateSubgroup=daemon", "KillMode=process", "Type=exec"):
        assert line in service, units["drumsd.service"]
    assert "Options=mode=0700,size=16G" in units["run-drums.mount"].splitlines()
    (token_script,) = host["scripts"]["drumsd"]
    assert "umask 077" in token_script and "/var/lib/drums/token" in token_script
    assert "drumsd check-config" in host["configCheck"]
    assert host["firewall"] == [7443]
    assert host["sysctl"]["kernel.pid_max"] == 4194304
    for name, node in system["nodes"].items():
        assert "drumsd.service" in node["units"] and "run-drums.mount" in node["units"], name
        module = name.removeprefix("vm-").replace("-", "_")
        assert f"{module}.run(machine, target, subtest)" in node["testScript"]


def test_the_image_unit_registers_the_image_through_drumsd(system: dict, tmp_path: Path) -> None:
    """drumsd-image.service's command, run with the stand-ins replaced by real files (the package
    by a bin/drumsd like nixpkgs' wrapper, the image by a root.tar): it makes an image the daemon
    finds by profile. The command before the fix read pythonModule (absent from nixpkgs'
    applications) and ran `python3 -I` with the package on PYTHONPATH, which -I ignores."""
    if os.geteuid() != 0:
        pytest.skip("unpacking a root with its owners needs root")
    line = next(
        line
        for line in system["host"]["units"]["drumsd-image.service"].splitlines()
        if line.startswith("ExecStart=")
    )
    package = tmp_path / "drumsd-package"
    (package / "bin").mkdir(parents=True)
    wrapper = package / "bin" / "drumsd"
    src = f"{REPO / 'drumsd' / 'src'}:{REPO / 'sdk' / 'src'}"
    wrapper.write_text(
        f"#!/bin/sh\nPYTHONPATH={src} exec {sys.executable} -c "
        "'import sys; from drumsd.cli import main; sys.exit(main())' \"$@\"\n"
    )
    wrapper.chmod(0o755)
    images = tmp_path / "nix-images"
    command = (
        line.removeprefix("ExecStart=")
        .replace(system["packages"]["drumsd"], str(package))
        .replace(system["packages"]["image"], str(build_root_tar(tmp_path)))
        .replace("/var/lib/drums/nix-images", str(images))
    )
    assert "/nix/store" not in command, command
    for _attempt in range(2):  # the second run finds image.json and changes nothing
        result = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    from drumsd.linux.image_manifest import write_manifest
    from drumsd.linux.state_files import find_image

    found = find_image(images, "base")
    assert found is not None
    root, sha = found
    assert root.parent.parent == images and root.parent.name.startswith("base-")
    assert (root / "home" / "user" / "Desktop").stat().st_uid == 1000
    assert oct((root / "tmp").stat().st_mode & 0o7777) == "0o1777"
    assert sha == write_manifest(root, tmp_path / "manifest")
    assert (root.parent / "apps.json").exists()


# A fresh VM test node, as admission samples it: the OS and the idle daemon take this much RAM;
# each slot writes an upper layer of about this much to the state tmpfs, whose pages are RAM too.
NODE_BOOT_MIB = 1536
SLOT_UPPER_MIB = 64
# The most any scenario holds: four slots (crash_recovery), a template checkpoint and a fork's.
SLOTS_HELD = 4


def tmpfs_mib(size: str, memory_mib: int) -> int:
    number, unit = re.fullmatch(r"([0-9]+)([kKmMgG%]?)", size).groups()  # type: ignore[union-attr]
    scale = {"g": 1024.0, "m": 1.0, "k": 1 / 1024, "%": memory_mib / 100, "": 1 / 1048576}
    return int(int(number) * scale[unit.lower()])


def test_admission_admits_the_work_of_every_vm_node(system: dict) -> None:
    """Each node's last create and its fork, decided by drumsd's own admission code on what the
    node has: before the fix, a 3 GiB tmpfs against min_state_free_mib=8192 refused every one."""
    for name, node in system["nodes"].items():
        config = AdmissionConfig.model_validate(node["settings"]["admission"])
        memory = node["memorySize"]
        state_total = tmpfs_mib(node["stateTmpfsSize"], memory)
        held_state = config.capture_mib + (SLOTS_HELD - 1) * SLOT_UPPER_MIB
        sample = HostSample(
            taken_at=0.0,
            mem_available_mib=memory
            - NODE_BOOT_MIB
            - held_state
            - (SLOTS_HELD - 1) * config.env_mib,
            mem_total_mib=memory,
            psi_memory_some_avg10=0.0,
            state_free_mib=state_total - held_state,
            state_total_mib=state_total,
        )
        create = decide(sample, config, config.env_mib)
        fork = decide(sample, config, config.capture_mib, state_mib=config.capture_mib)
        assert create.admit, f"{name}: {create.reason}"
        assert fork.admit, f"{name}: {fork.reason}"


def test_a_module_whose_config_throws_fails_the_evaluation(
    tree: tuple[Path, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "drumsd.nix"
    broken.write_text(
        "{ config, lib, pkgs, ... }@args:\n"
        f"import {REPO / 'nixos-modules' / 'drumsd.nix'} args // {{\n"
        '  config = throw "drums test: this module\'s config is broken";\n}\n'
    )
    result = evaluate(tree, TYPICAL_HOST, module=broken, nodes=False)
    assert result.returncode != 0
    assert "this module's config is broken" in result.stderr, result.stderr[-3000:]


def test_a_failed_assertion_fails_the_check(tree: tuple[Path, Path]) -> None:
    """An assertion the module makes reaches the result (a tmpfs too small for admission)."""
    result = evaluate(tree, {"enable": True, "stateTmpfsSize": "3G"}, nodes=False)
    assert result.returncode == 0, result.stderr[-3000:]
    (message,) = json.loads(json.loads(result.stdout))["host"]["failedAssertions"]
    assert "stateTmpfsSize (3G) leaves no room" in message


def test_the_sysctl_lines_before_issue_20_fail_in_nixos(
    tree: tuple[Path, Path], tmp_path: Path
) -> None:
    module = with_sysctl_block(tmp_path, OLD_LINES.read_text())
    result = evaluate(tree, {"enable": True}, module=module, nodes=False)
    assert result.returncode != 0
    assert 'boot.kernel.sysctl."kernel.pid_max"\' is defined multiple times' in result.stderr


# OSWorld pinned by commit + tarball sha256 (tasks.osworld), the locked osworld image and the
# Nix-built checker venv (nix/osworld-tasks.nix, nix/debian-image.nix, nix/checker-venv.nix).
OSWORLD_PIN = {
    "commit": "0123456789abcdef0123456789abcdef01234567",
    "sha256": "89abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567",
}


def test_a_host_with_the_pinned_image_tasks_and_checker_venv(tree: tuple[Path, Path]) -> None:
    """In NixOS's module system: the image unit unpacks the locked osworld image under its
    profile, the daemon serves OSWorld's tasks from the Nix fetch of the pin, and checkers run
    in the Nix-built venv; all three reach the checked config."""
    host = {
        **TYPICAL_HOST,
        "settings": {**TYPICAL_HOST["settings"], "tasks": {"osworld": OSWORLD_PIN}},
    }
    result = evaluate(tree, host, nodes=False, pinned=True)
    assert result.returncode == 0, result.stderr[-4000:]
    evaluated = json.loads(json.loads(result.stdout))
    rendered, packages = evaluated["host"], evaluated["packages"]
    assert rendered["failedAssertions"] == [] and rendered["warnings"] == []
    settings = rendered["settings"]
    osworld_dir = settings["tasks"]["osworld"]["dir"]
    assert f"-osworld-tasks-{OSWORLD_PIN['commit'][:12]}" in osworld_dir, osworld_dir
    assert osworld_dir.endswith("/examples")
    assert settings["tasks"]["checker_venv"] == packages["checkerVenv"]
    assert settings["default_image"] == "osworld"
    unit = rendered["units"]["drumsd-image.service"]
    assert f"{packages['imageOsworld']}/root.tar --profile osworld" in unit.replace("'", "")
    # Without a pin nothing is fetched and the daemon's own settings stay.
    plain = json.loads(json.loads(evaluate(tree, TYPICAL_HOST, nodes=False).stdout))
    assert plain["host"]["settings"]["tasks"]["osworld"]["dir"] is None
    assert plain["host"]["settings"]["tasks"]["checker_venv"] is None


def test_a_malformed_osworld_pin_fails_with_its_reason(tree: tuple[Path, Path]) -> None:
    pin = {**OSWORLD_PIN, "sha256": "sha256-notahexdigest="}
    host = {**TYPICAL_HOST, "settings": {**TYPICAL_HOST["settings"], "tasks": {"osworld": pin}}}
    result = evaluate(tree, host, nodes=False, pinned=True)
    assert result.returncode != 0
    assert "sha256 must be 64 lowercase hex digits" in result.stderr, result.stderr[-2000:]
