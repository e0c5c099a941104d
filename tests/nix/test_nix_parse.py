"""Every .nix file of the repository parses (nix-instantiate --parse), and a broken one does not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from nix_support import REPO, nix_env, require_tool

SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".ruff_cache", "result"}


def nix_files() -> list[Path]:
    found = []
    for path in REPO.rglob("*.nix"):
        if not SKIP_DIRS.intersection(path.relative_to(REPO).parts):
            found.append(path)
    return sorted(found)


def parse(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("nix-instantiate"), "--parse", str(path)],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=60,
    )


def test_the_packaging_files_exist() -> None:
    names = {str(p.relative_to(REPO)) for p in nix_files()}
    expected = {
        "flake.nix",
        "nix/criu.nix",
        "nix/debian-image.nix",
        "nix/debian-lock.nix",
        "nix/checker-venv.nix",
        "nix/osworld-tasks.nix",
        "nix/overlay.nix",
        "nix/python-packages.nix",
        "nixos-modules/drumsd.nix",
        "nixos-modules/drumsd-settings.nix",
        "nixos-modules/drumsd-settings-defaults.nix",
        "vm-tests/default.nix",
    }
    assert expected <= names, f"missing: {sorted(expected - names)}"


@pytest.mark.parametrize("path", nix_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_nix_file_parses(path: Path) -> None:
    result = parse(path)
    assert result.returncode == 0, f"{path.relative_to(REPO)} does not parse:\n{result.stderr}"


@pytest.mark.parametrize(
    "breakage",
    [
        ("drop the last closing brace", lambda text: text.rstrip().removesuffix("}")),
        (
            "an unterminated string",
            lambda text: text.replace('"drumsd-unchecked.json"', '"drumsd-unchecked.json'),
        ),
        (
            "a missing semicolon",
            lambda text: text.replace(
                "cfg = config.services.drumsd;", "cfg = config.services.drumsd"
            ),
        ),
    ],
    ids=lambda b: b[0] if isinstance(b, tuple) else "",
)
def test_a_syntax_error_fails_the_parse_check(tmp_path: Path, breakage) -> None:
    """The check above is not vacuous: each breakage of the module makes it fail."""
    _, breaks = breakage
    original = (REPO / "nixos-modules" / "drumsd.nix").read_text()
    broken_text = breaks(original)
    assert broken_text != original, "the breakage no longer applies to drumsd.nix; update it"
    broken = tmp_path / "drumsd.nix"
    broken.write_text(broken_text)
    result = parse(broken)
    assert result.returncode != 0
    assert "error" in result.stderr


def test_flake_lock_pins_a_nixos_release() -> None:
    import json

    lock = json.loads((REPO / "flake.lock").read_text())
    locked = lock["nodes"]["nixpkgs"]["locked"]
    assert lock["nodes"]["nixpkgs"]["original"]["ref"] == "nixos-25.11"
    assert len(locked["rev"]) == 40 and int(locked["rev"], 16) >= 0
    assert locked["narHash"].startswith("sha256-") and len(locked["narHash"]) == 51
    assert lock["nodes"]["root"]["inputs"] == {"nixpkgs": "nixpkgs"}
