"""The CRIU 4.2.1 hashes in nix/criu.nix, recomputed from Debian's orig tarball that host
preparation caches: its file sha256 (as in sid's .dsc, and the SRI in passthru) and the NAR hash
of its unpacked tree (what fetchzip checks for the GitHub release archive); and drums' patch
applied to that tree as host preparation applies it (/usr/bin/patch)."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from drumsd.linux import hostprep
from nix_support import REPO, nix_env, require_tool

CACHE_ROOT = Path(os.environ.get("DRUMS_CACHE", "/var/cache/drums"))
ORIG = CACHE_ROOT / "criu" / "src" / "criu_4.2.1.orig.tar.xz"
DEBIAN_SHA256 = "29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9"
CRIU_NIX = (REPO / "nix" / "criu.nix").read_text()


def sri(hex_digest: str) -> str:
    return "sha256-" + base64.b64encode(bytes.fromhex(hex_digest)).decode()


@pytest.fixture(scope="module")
def orig() -> Path:
    if not ORIG.exists():
        message = f"{ORIG} is not cached (scripts/prepare-host.sh caches it)"
        if os.environ.get("DRUMS_CI") == "1":
            pytest.fail(f"DRUMS_CI=1 but {message}")
        pytest.skip(message)
    return ORIG


def test_the_debian_tarball_is_the_pinned_one(orig: Path) -> None:
    assert hashlib.sha256(orig.read_bytes()).hexdigest() == DEBIAN_SHA256
    assert f'hash = "{sri(DEBIAN_SHA256)}";' in CRIU_NIX


def test_fetchzip_hash_is_the_nar_hash_of_the_unpacked_tree(orig: Path, tmp_path: Path) -> None:
    with tarfile.open(orig) as tar:
        tar.extractall(tmp_path, filter="tar")
    (top,) = tmp_path.iterdir()
    assert top.name == "criu-4.2.1", "GitHub's archive of v4.2.1 unpacks to criu-4.2.1/ too"
    result = subprocess.run(
        [require_tool("nix"), "hash", "path", "--sri", str(top)],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    pinned = re.search(r'src = fetchzip \{.*?hash = "([^"]+)";', CRIU_NIX, re.S)
    assert pinned, "no fetchzip hash in nix/criu.nix"
    assert result.stdout.strip() == pinned.group(1)


@pytest.fixture
def srcdir(orig: Path, tmp_path: Path) -> Path:
    with tarfile.open(orig) as tar:
        tar.extractall(tmp_path, filter="tar")
    return tmp_path / f"criu-{hostprep.CRIU_VERSION}"


def test_the_packaged_patch_applies_to_the_pinned_tarball(srcdir: Path) -> None:
    messages: list[str] = []
    hostprep._apply_patch(srcdir, hostprep.CRIU_PATCH, messages.append)
    assert messages[0] == f"criu: applying {hostprep.CRIU_PATCH.name}"
    assert "track-mem-uffd-wp" in (srcdir / "criu" / "config.c").read_text()
    assert not list(srcdir.rglob("*.rej")), "no hunk was rejected"


def test_the_packaged_patch_applied_twice_fails_with_the_message(srcdir: Path) -> None:
    """--forward: a tree that already has the patch is refused, not reversed."""
    hostprep._apply_patch(srcdir, hostprep.CRIU_PATCH, lambda m: None)
    with pytest.raises(hostprep.HostPrepError, match=r"does not apply to CRIU 4\.2\.1") as raised:
        hostprep._apply_patch(srcdir, hostprep.CRIU_PATCH, lambda m: None)
    assert "previously applied" in str(raised.value)
