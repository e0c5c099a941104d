"""nix/python-packages.nix lists the same dependencies as each pyproject.toml (evaluated with a
stub lib and python3Packages, so it runs offline without nixpkgs)."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from nix_support import REPO, nix_env, require_tool

EVAL = Path(__file__).with_name("python_packages_eval.nix")
DIRS = {
    "drumsd": "drumsd",
    "drums-sdk": "sdk",
    "drums-tasks": "taskfactory",
    "drums-verifiers": "verifiers_env",
}
# The workspace's own distributions are Nix packages of the same name, not python3Packages.
OWN = set(DIRS)
# Not in nixpkgs: built without, see the comment in nix/python-packages.nix.
NOT_IN_NIXPKGS = {"verifiers", "mcp-types", "prime-pydantic-config", "verl", "skyrl-gym"}


def nixpkgs_name(requirement: str) -> tuple[str, list[str]]:
    """`hypercorn[trio]>=0.17` -> ("hypercorn", ["trio"]), as nixpkgs spells Python names."""
    match = re.match(r"^([A-Za-z0-9_.-]+)(?:\[([^\]]+)\])?", requirement)
    assert match, requirement
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    extras = [e.strip() for e in (match.group(2) or "").split(",") if e.strip()]
    return name, extras


def expected(requirements: list[str]) -> set[str]:
    names: set[str] = set()
    for requirement in requirements:
        name, extras = nixpkgs_name(requirement)
        if name in NOT_IN_NIXPKGS:
            continue
        names.add(name)
        names.update(extras)  # hypercorn[trio]: the extra's packages, named like the extra here
    return names


def pyprojects() -> dict[str, dict]:
    return {
        pkg: tomllib.loads((REPO / d / "pyproject.toml").read_text())["project"]
        for pkg, d in DIRS.items()
    }


@pytest.fixture(scope="module")
def evaluated() -> dict:
    names = {"hatchling"}
    for project in pyprojects().values():
        names |= expected(project.get("dependencies", []))
        for reqs in project.get("optional-dependencies", {}).values():
            names |= expected(reqs)
    result = subprocess.run(
        [
            require_tool("nix-instantiate"),
            "--eval",
            "--strict",
            "--json",
            str(EVAL),
            "--argstr",
            "namesJson",
            json.dumps(sorted(names - OWN)),
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=60,
    )
    assert result.returncode == 0, (
        "nix/python-packages.nix uses a Python package no pyproject.toml asks for:\n"
        + result.stderr
    )
    return json.loads(result.stdout)


@pytest.mark.parametrize("package", sorted(DIRS))
def test_dependencies_match_pyproject(package: str, evaluated: dict) -> None:
    project = pyprojects()[package]
    nix = evaluated[package]
    assert nix["pname"] == project["name"]
    assert nix["pyproject"] is True
    assert set(nix["dependencies"]) == expected(project["dependencies"]), (
        f"{DIRS[package]}/pyproject.toml and nix/python-packages.nix ({package}) disagree: "
        "add or remove the python3Packages there (and in tests/nix/stub-nixpkgs if new)"
    )
    declared = {
        k: names
        for k, v in project.get("optional-dependencies", {}).items()
        if (names := expected(v))
    }
    assert {k: set(v) for k, v in nix["optional"].items()} == declared


def test_verifiers_is_removed_not_silently_dropped(evaluated: dict) -> None:
    assert evaluated["drums-verifiers"]["removed"] == [
        "verifiers",
        "mcp-types",
        "prime-pydantic-config",
    ]
