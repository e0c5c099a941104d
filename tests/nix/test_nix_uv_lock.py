"""The Nix Python environment is uv.lock's: nix/uv-lock.nix and nix/python-packages.nix, evaluated
with nixpkgs' real lib (../shared/nixpkgs-snapshot, or DRUMS_NIXPKGS_LIB) and stand-ins that record
what they are given, fetch every package from a URL uv.lock lists with the lock's sha256, pick the
versions and the closure uv would install on Linux for that Python (markers and extras
evaluated here again by `packaging`), and a wheel that Python can load."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from nix_support import REPO, nix_env, require_tool
from nixos_tree import unpack_tree
from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

EVAL = Path(__file__).with_name("uv_lock_eval.nix")
MEMBERS = {"drumsd", "drums-sdk", "drums-tasks", "drums-verifiers"}
# nixpkgs 25.11's python3, and the version before it (the lock forks quart and numpy at 3.12/3.13).
PYTHONS = ["3.13.9", "3.12.12"]


@pytest.fixture(scope="module")
def nixpkgs_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("DRUMS_NIXPKGS_LIB")
    if given:
        return Path(given)
    return unpack_tree(tmp_path_factory.mktemp("nixpkgs-snapshot"))[0] / "lib"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def nix_side(lib: Path, python: str, lock: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            require_tool("nix-instantiate"),
            "--eval",
            str(EVAL),
            "--arg",
            "libPath",
            str(lib),
            "--argstr",
            "pythonVersion",
            python,
            *(["--arg", "lockFile", str(lock)] if lock else []),
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=120,
        preexec_fn=_limit_memory,
    )


@pytest.fixture(scope="module", params=PYTHONS)
def evaluated(request: pytest.FixtureRequest, nixpkgs_lib: Path) -> tuple[str, dict[str, Any]]:
    result = nix_side(nixpkgs_lib, request.param)
    assert result.returncode == 0, result.stderr[-3000:]
    return request.param, json.loads(json.loads(result.stdout))


def lock_packages() -> dict[str, dict[str, Any]]:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return {f"{p['name']}=={p['version']}": p for p in lock["package"]}


def environment(python: str) -> dict[str, str]:
    return {
        "python_full_version": python,
        "python_version": ".".join(python.split(".")[:2]),
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "extra": "",
    }


def expected_closure(python: str) -> tuple[dict[str, set[str]], set[str]]:
    """What uv would install for each member on Linux x86_64 with this Python, every extra on:
    (member -> its direct locked requirements, every locked package reached)."""
    packages = lock_packages()
    env = environment(python)
    by_name: dict[str, list[str]] = {}
    for key, p in packages.items():
        by_name.setdefault(p["name"], []).append(key)

    def applies(req: dict) -> bool:
        return "marker" not in req or Marker(req["marker"]).evaluate(env)

    def key_of(req: dict) -> str:
        return f"{req['name']}=={req['version']}" if "version" in req else by_name[req["name"]][0]

    def reqs_with_extras(req: dict) -> list[str]:
        key = key_of(req)
        out = [key]
        for extra in req.get("extra", []):
            for sub in packages[key].get("optional-dependencies", {}).get(extra, []):
                if applies(sub):
                    out += reqs_with_extras(sub)
        return out

    direct: dict[str, set[str]] = {}
    for member in MEMBERS:
        (key,) = [k for k in by_name[member] if "registry" not in packages[k]["source"]]
        p = packages[key]
        reqs = [*p.get("dependencies", [])]
        for extra in p.get("optional-dependencies", {}).values():
            reqs += extra
        direct[member] = {
            k
            for r in reqs
            if applies(r)
            for k in reqs_with_extras(r)
            if k.split("==")[0] not in MEMBERS
        }
    reached: set[str] = set()
    todo = [k for keys in direct.values() for k in keys]
    while todo:
        key = todo.pop()
        if key in reached:
            continue
        reached.add(key)
        for req in packages[key].get("dependencies", []):
            if applies(req):
                todo += reqs_with_extras(req)
    return direct, reached


def supported_tags(python: str) -> set[Tag]:
    version = tuple(int(part) for part in python.split(".")[:2])
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(40, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    platforms += ["linux_x86_64"]
    return set(cpython_tags(version, platforms=platforms)) | set(
        compatible_tags(version, platforms=platforms)
    )


def test_every_url_and_hash_is_the_locks(evaluated: tuple[str, dict]) -> None:
    _, nix = evaluated
    packages = lock_packages()
    assert nix["locked"], "the Nix side fetches nothing"
    for key, fetched in nix["locked"].items():
        assert key in packages, f"{key} is not in uv.lock"
        p = packages[key]
        files = {f["url"]: f["hash"] for f in [*p.get("wheels", []), p.get("sdist", {})] if f}
        assert fetched["url"] in files, f"{key}: {fetched['url']} is not one of the lock's files"
        assert f"sha256:{fetched['sha256']}" == files[fetched["url"]], key


def test_the_closure_is_what_uv_would_install(evaluated: tuple[str, dict]) -> None:
    python, nix = evaluated
    direct, reached = expected_closure(python)
    assert set(nix["locked"]) == reached
    for member in MEMBERS:
        got = set(nix["members"][member]["dependencies"])
        for extra in nix["members"][member]["extras"].values():
            got |= set(extra)
        assert {k for k in got if k.split("==")[0] not in MEMBERS} == direct[member], member
    packages = lock_packages()
    env = environment(python)
    for key, fetched in nix["locked"].items():
        want = [
            r
            for r in packages[key].get("dependencies", [])
            if "marker" not in r or Marker(r["marker"]).evaluate(env)
        ]
        assert {r["name"] for r in want} <= {d.split("==")[0] for d in fetched["dependencies"]}, key


def test_the_packages_depend_on_each_other_without_a_cycle(evaluated: tuple[str, dict]) -> None:
    """Each package is a derivation of its dependencies: a cycle could not be built."""
    _, nix = evaluated
    locked = nix["locked"]
    done: set[str] = set()

    def visit(key: str, path: tuple[str, ...]) -> None:
        assert key not in path, f"dependency cycle: {' -> '.join((*path, key))}"
        if key in done:
            return
        for dependency in locked[key]["dependencies"]:
            visit(dependency, (*path, key))
        done.add(key)

    for key in locked:
        visit(key, ())


def test_drums_verifiers_has_verifiers(evaluated: tuple[str, dict]) -> None:
    _, nix = evaluated
    names = {k.split("==")[0] for k in nix["members"]["drums-verifiers"]["dependencies"]}
    assert {"verifiers", "prime-pydantic-config", "mcp", "drums-sdk"} <= names


def test_every_wheel_loads_on_that_python(evaluated: tuple[str, dict]) -> None:
    python, nix = evaluated
    tags = supported_tags(python)
    for key, fetched in nix["locked"].items():
        name = fetched["url"].rsplit("/", 1)[1]
        if fetched["format"] != "wheel":
            assert name.endswith((".tar.gz", ".zip")), key
            # An sdist only where the lock has no wheel this Python can load.
            wheels = lock_packages()[key].get("wheels", [])
            loadable = [
                w for w in wheels if parse_wheel_filename(w["url"].rsplit("/", 1)[1])[3] & tags
            ]
            assert not loadable, f"{key}: an sdist although {loadable[0]['url']} loads"
            continue
        wheel_tags = parse_wheel_filename(name)[3]
        assert wheel_tags & tags, f"{key}: {name} does not load on {python}"
        # Compiled code gets its libraries pointed at the store (autoPatchelfHook).
        compiled = all(t.abi != "none" for t in wheel_tags)
        assert fetched["patchelf"] == compiled, f"{key}: {name}"


def test_a_hash_changed_in_the_lock_reaches_the_nix_side(nixpkgs_lib: Path, tmp_path: Path) -> None:
    """Not a copy: the Nix side reads uv.lock itself."""
    text = (REPO / "uv.lock").read_text()
    old = next(
        p["wheels"][0]["hash"]
        for p in tomllib.loads(text)["package"]
        if p["name"] == "trio" and p.get("wheels")
    )
    changed = tmp_path / "uv.lock"
    changed.write_text(text.replace(old, "sha256:" + "0" * 64))
    result = nix_side(nixpkgs_lib, PYTHONS[0], lock=changed)
    assert result.returncode == 0, result.stderr[-3000:]
    trio = next(
        v
        for k, v in json.loads(json.loads(result.stdout))["locked"].items()
        if k.startswith("trio==")
    )
    assert trio["sha256"] == "0" * 64
