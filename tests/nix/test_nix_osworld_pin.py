"""OSWorld's task files pinned for Nix (nix/osworld-tasks.pin.json, nix/osworld-tasks-pinned.nix):
a full commit and the NAR hash of its tree, the hash fetchFromGitHub checks. The Nix side fetches
exactly the pin and keeps evaluation_examples/examples; where a git clone holding the commit is
present (DRUMS_OSWORLD_GIT, default the fetch tool's mirror of tmddh-cutup/OSWorld_Environment),
the tree `git archive` gives (what GitHub's tarball of the commit unpacks to) hashes to the pin
with the Nix CI uses, and one changed byte does not. Nothing fetched is kept or committed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from nix_support import REPO, nix_env, require_tool
from nixos_tree import unpack_tree

PIN_FILE = REPO / "nix" / "osworld-tasks.pin.json"
PINNED_NIX = REPO / "nix" / "osworld-tasks-pinned.nix"
CLONE = Path(
    os.environ.get("DRUMS_OSWORLD_GIT", "/work/.mirror/tmddh-cutup+OSWorld_Environment/repo")
)


@pytest.fixture(scope="module")
def pin() -> dict[str, Any]:
    return json.loads(PIN_FILE.read_text())


def test_the_pin_is_a_full_commit_and_an_sri_hash(pin: dict[str, Any]) -> None:
    assert re.fullmatch(r"[0-9a-f]{40}", pin["rev"])
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", pin["hash"])
    assert pin["owner"] and pin["repo"] and "/" not in pin["owner"] + pin["repo"]


def test_the_nix_side_fetches_exactly_the_pin(
    pin: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """nix/osworld-tasks-pinned.nix with nixpkgs' real lib and recording stand-ins: the fetch is
    the pin's, and the build script (as rendered) parses and keeps only the examples."""
    lib = unpack_tree(tmp_path_factory.mktemp("nixpkgs-snapshot"))[0] / "lib"
    expr = f"""
      let
        lib = import {lib};
        drv = import {PINNED_NIX} {{
          inherit lib;
          fetchFromGitHub = args: args // {{ outPath = "/nix/store/src"; }};
          runCommand = name: env: script: env // {{ inherit name script; }};
        }};
      in builtins.toJSON {{ inherit (drv) name script; src = removeAttrs drv.src [ "outPath" ]; }}
    """
    result = subprocess.run(
        [require_tool("nix-instantiate"), "--eval", "--expr", expr],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(json.loads(result.stdout))
    assert got["src"] == {k: pin[k] for k in ("owner", "repo", "rev", "hash")}
    assert got["name"] == f"osworld-tasks-{pin['rev'][:12]}"
    assert (
        "cp -r --no-preserve=mode,ownership $src/evaluation_examples/examples/. " in got["script"]
    )
    script = tmp_path / "build.sh"
    script.write_text(got["script"])
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def _tree_of_commit(rev: str, dest: Path) -> Path:
    """The commit's tree as GitHub's tarball of it unpacks (git archive; fetchFromGitHub strips
    the top directory)."""
    if not (CLONE / "objects").is_dir() and not (CLONE / ".git").is_dir():
        pytest.skip(
            f"no git clone of the pinned repository at {CLONE} (set DRUMS_OSWORLD_GIT to one "
            "holding the commit)"
        )
    have = subprocess.run(
        ["git", "--git-dir", str(CLONE), "cat-file", "-e", f"{rev}^{{commit}}"],
        capture_output=True,
    )
    if have.returncode != 0:
        pytest.skip(f"{CLONE} does not hold commit {rev}")
    tar = dest / "tree.tar"
    subprocess.run(
        [
            "git",
            "--git-dir",
            str(CLONE),
            "archive",
            "--format=tar",
            "--prefix=src/",
            "-o",
            str(tar),
            rev,
        ],
        check=True,
    )
    with tarfile.open(tar) as archive:
        archive.extractall(dest, filter="tar")
    tar.unlink()
    return dest / "src"


def _nar_hash(path: Path) -> str:
    result = subprocess.run(
        [require_tool("nix"), "hash", "path", "--type", "sha256", str(path)],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_the_pinned_commits_tree_has_the_pinned_hash(pin: dict[str, Any], tmp_path: Path) -> None:
    tree = _tree_of_commit(pin["rev"], tmp_path)
    examples = list((tree / "evaluation_examples" / "examples").rglob("*.json"))
    assert len(examples) > 100, "the pinned commit has OSWorld's task files"
    assert _nar_hash(tree) == pin["hash"]
    # The check can fail: one byte more in one task file is another hash.
    with examples[0].open("ab") as f:
        f.write(b" ")
    assert _nar_hash(tree) != pin["hash"]
