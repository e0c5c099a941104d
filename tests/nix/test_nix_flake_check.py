"""`nix flake check` (Nix >= 2.18, evaluation only) passes on drums' flake with nixpkgs replaced by
tests/nix/stub-nixpkgs (stand-in packages beside nixpkgs' real lib from ../shared/nixpkgs-snapshot):
the flake's outputs have the right shapes and every file they pull in (overlay, Python packages
from uv.lock, CRIU override, image, VM tests) evaluates and is wired to the others. Real nixpkgs
attribute names are not checked here (docs/nix.md). A clone without ../shared skips."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from nix_support import REPO, nix_env, require_tool
from nixos_tree import unpack_tree

STUB = Path(__file__).with_name("stub-nixpkgs")
STUB_TREE = STUB


@pytest.fixture(scope="module", autouse=True)
def _stub_with_nixpkgs_lib(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The stand-in package set with nixpkgs' real lib beside it (the snapshot's)."""
    global STUB_TREE
    snapshot = unpack_tree(tmp_path_factory.mktemp("nixpkgs-snapshot"))[0]
    STUB_TREE = tmp_path_factory.mktemp("stub") / "stub-nixpkgs"
    shutil.copytree(STUB, STUB_TREE)
    shutil.copytree(snapshot / "lib", STUB_TREE / "lib")


def nix(*args: str, flake: Path = REPO) -> subprocess.CompletedProcess[str]:
    require_tool("git")
    return subprocess.run(
        [
            require_tool("nix"),
            *args,
            "--no-write-lock-file",
            "--override-input",
            "nixpkgs",
            f"path:{STUB_TREE}",
            *([] if args[0] == "eval" else [str(flake)]),
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        cwd=flake,
        timeout=300,
    )


def test_flake_check_passes() -> None:
    result = nix("flake", "check", "--no-build")
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def outputs() -> dict:
    result = nix("flake", "show", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_the_flake_has_every_output_the_issue_names(outputs: dict) -> None:
    for system in ("x86_64-linux", "aarch64-linux"):
        assert {
            "drumsd",
            "drums-sdk",
            "drums-verifiers",
            "drums-tasks",
            "criu",
            "desktop-image",
            "image-base",
            "image-office",
            "image-osworld",
            "checker-venv",
            "osworld-tasks",
            "default",
        } <= set(outputs["packages"][system])
        assert set(outputs["apps"][system]) == {"drumsd", "default"}
        assert set(outputs["devShells"][system]) == {"default"}
        assert set(outputs["checks"][system]) == {
            "vm-daemon-token",
            "vm-episode",
            "vm-fork-isolation",
            "vm-gate-quarantine",
            "vm-crash-recovery",
        }
        assert system in outputs["formatter"]
    assert {"drumsd", "default"} <= set(outputs["nixosModules"])
    assert "default" in outputs["overlays"]


@pytest.mark.parametrize(
    ("attr", "expected"),
    [
        ("packages.x86_64-linux.criu.version", "4.2.1"),
        (
            "packages.x86_64-linux.criu.src.url",
            "https://github.com/checkpoint-restore/criu/archive/refs/tags/v4.2.1.tar.gz",
        ),
        ("packages.x86_64-linux.drumsd.pname", "drumsd"),
        ("packages.x86_64-linux.drumsd.meta.mainProgram", "drumsd"),
        # The locked images keep their profile and arch (the module reads `profile`).
        ("packages.x86_64-linux.image-osworld.profile", "osworld"),
        ("packages.aarch64-linux.image-office.arch", "arm64"),
        ("packages.x86_64-linux.checker-venv.version", "1.0.2"),
        ("packages.aarch64-linux.checker-venv.version", "1.0.2"),
        # OSWorld's task files at the pinned commit (tests/nix/test_nix_osworld_pin.py).
        ("packages.x86_64-linux.osworld-tasks.src.rev", "b9f18aa5f67aac00be48b3270935931c05f620e0"),
    ],
)
def test_output_attributes(attr: str, expected: str) -> None:
    result = nix("eval", "--raw", f"{REPO}#{attr}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == expected


def test_the_flake_criu_is_patched_with_the_file_host_preparation_applies() -> None:
    """One patch file for both builds: the flake's criu carries drumsd's packaged patch only."""
    patch = REPO / "drumsd/src/drumsd/linux/criu-track-mem-uffd-wp.patch"
    result = nix(
        "eval",
        "--json",
        f"{REPO}#packages.x86_64-linux.criu.patches",
        "--apply",
        'map (p: [ (baseNameOf p) (builtins.hashFile "sha256" p) ])',
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == [
        [patch.name, hashlib.sha256(patch.read_bytes()).hexdigest()]
    ]


def test_the_flake_criu_keeps_its_kerndat_cache_where_host_preparation_builds_it_to() -> None:
    """Both builds set the same RUNDIR (drumsd makes that dir, criu.KDAT_DIR)."""
    from drumsd.linux import hostprep

    result = nix("eval", "--json", f"{REPO}#packages.x86_64-linux.criu.makeFlags")
    assert result.returncode == 0, result.stderr[-2000:]
    flags = json.loads(result.stdout)
    assert set(hostprep.CRIU_MAKE_VARS) <= set(flags), flags
    assert any(f.startswith("PREFIX=") for f in flags), flags  # nixpkgs' own flags kept


def test_the_app_runs_the_drumsd_binary() -> None:
    result = nix("eval", "--raw", f"{REPO}#apps.x86_64-linux.drumsd.program")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.endswith("-python3-drumsd-0.1.0/bin/drumsd")


@pytest.mark.parametrize(
    ("module", "message"),
    [
        # A module file that does not parse, and one whose evaluation fails: the check forces
        # every nixosModules output (Nix >= 2.18 accepts any value there, even a list or a bare
        # path, so a wrong shape is not what it catches; Nix 2.8 rejected those).
        ("import ./unparsable.nix", "syntax error"),
        ("import ./throws.nix", "the module is broken"),
    ],
)
def test_a_broken_module_output_fails_the_check(tmp_path: Path, module: str, message: str) -> None:
    """The check is not vacuous: a nixosModules output that cannot be evaluated fails it."""
    flake = tmp_path / "flake"
    flake.mkdir()
    (flake / "unparsable.nix").write_text("{ ... }: { config = {\n")
    (flake / "throws.nix").write_text('throw "the module is broken"\n')
    (flake / "flake.nix").write_text(
        '{ inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";\n'
        f"  outputs = {{ self, nixpkgs }}: {{ nixosModules.drumsd = {module}; }}; }}\n"
    )
    subprocess.run(["git", "init", "-q", str(flake)], check=True)
    subprocess.run(["git", "-C", str(flake), "add", "."], check=True)
    result = nix("flake", "check", "--no-build", flake=flake)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(
    "attr",
    [
        "packages.x86_64-linux.image-osworld.buildCommand",
        "packages.aarch64-linux.image-base.buildCommand",
        "packages.x86_64-linux.checker-venv.buildPhase",
        "packages.x86_64-linux.checker-venv.installCheckPhase",
    ],
)
def test_the_locked_builds_scripts_are_valid_shell(attr: str) -> None:
    """The build scripts of the locked images and the checker venv, as Nix renders them (every
    fetch, file and list interpolated), parse as bash: a quoting slip in Nix's '' strings or a
    stray `${` fails here rather than on the first machine that builds them."""
    result = nix("eval", "--raw", f"{REPO}#{attr}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout) > 500
    check = subprocess.run(["bash", "-n"], input=result.stdout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
