"""The snapshot of nixpkgs' lib/ (25.11) and nixos/ trees in ../shared/nixpkgs-snapshot/, unpacked
for an evaluation, with the names its modules reach after `pkgs.` (what tests/nix/nixos/
standin-pkgs.nix must define). Nothing of it is committed; a clone without ../shared skips."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest
from nix_support import REPO

SNAPSHOT = REPO.parent / "shared" / "nixpkgs-snapshot" / "lib-and-nixos.tar.gz"

# `pkgs.a.b.c` as written in a module; `.withFoo` feature flags read off packages.
_CHAIN = re.compile(r"\bpkgs\.([A-Za-z_][A-Za-z0-9_'-]*(?:\.[A-Za-z_][A-Za-z0-9_'-]*)*)")
_FLAG = re.compile(r"\.(with[A-Z][A-Za-z0-9]+)\b")
# What the stand-ins define themselves, or must not have: nixpkgs' buildPythonApplication sets
# no pythonModule, and no generic stand-in may hide a module reading one.
_RESERVED = {
    "lib",
    "type",
    "outPath",
    "drvPath",
    "name",
    "version",
    "pname",
    "meta",
    "override",
    "overrideAttrs",
    "overrideDerivation",
    "extend",
    "passthru",
    "outputs",
    "outputName",
    "out",
    "system",
    "pythonModule",
}


# Attributes the modules read off packages through a variable (`kernelPackages.kernel.features`,
# `cfg.package.bin`), which the scan cannot see; found one evaluation error at a time.
_THROUGH_VARIABLES = ["kernel", "features", "modDirVersion", "bin", "dev", "man", "doc"]
_FLAGS_THROUGH_VARIABLES = ["enablePrivSep"]
# Packages named by a variable (`pkgs.${shell}` for each shell users-groups.nix knows).
_PACKAGES_THROUGH_VARIABLES = ["bash", "fish", "xonsh", "zsh"]


def require_snapshot() -> Path:
    if not SNAPSHOT.is_file():
        pytest.skip(f"no nixpkgs snapshot at {SNAPSHOT} (a clone without ../shared)")
    return SNAPSHOT


def module_names(files: list[Path]) -> dict[str, list[str]]:
    top: set[str] = set()
    nested: set[str] = set()
    flags: set[str] = set()
    for path in files:
        text = path.read_text(errors="replace")
        for match in _CHAIN.finditer(text):
            parts = match.group(1).split(".")
            top.update(parts)
            nested.update(parts[1:])
        nested.update(_THROUGH_VARIABLES)
        flags.update(_FLAG.findall(text))

    def keep(names: set[str]) -> list[str]:
        return sorted(n for n in names if n not in _RESERVED and not n.startswith("with"))

    flags.update(_FLAGS_THROUGH_VARIABLES)
    top.update(_PACKAGES_THROUGH_VARIABLES)
    return {"names": keep(top), "nested": keep(nested), "flags": sorted(flags)}


def unpack_tree(dest: Path) -> tuple[Path, Path]:
    """(tree, names.json): the snapshot unpacked into `dest` (~0.2 s) and the names it needs."""
    with tarfile.open(require_snapshot()) as tar:
        tar.extractall(dest, filter="data")
    files = [
        *(dest / "nixos" / "modules").rglob("*.nix"),
        *(dest / "nixos" / "lib").rglob("*.nix"),
        *(REPO / "nixos-modules").glob("*.nix"),
        *(REPO / "vm-tests").glob("*.nix"),
    ]
    names = dest / "names.json"
    names.write_text(json.dumps(module_names(files)))
    return dest, names
