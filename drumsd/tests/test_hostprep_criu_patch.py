"""hostprep builds CRIU with drums' patch (--track-mem-uffd-wp): the install dir is keyed by the
patch's bytes, the patch is applied to the unpacked tree before make, and one that does not apply
stops the build with what to do. tests/nix/test_nix_criu_source.py applies the packaged patch for
real to the cached Debian tarball."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from drumsd.linux import hostprep


def test_the_build_key_changes_with_the_patch_bytes() -> None:
    key = hostprep.criu_build_key(b"--- a/x\n+++ b/x\n")
    assert key.startswith(f"{hostprep.CRIU_VERSION}-{hostprep.CRIU_SHA256[:12]}-")
    assert len(key.rsplit("-", 1)[1]) == 8
    assert hostprep.criu_build_key(b"--- a/x\n+++ b/x\n") == key
    assert hostprep.criu_build_key(b"--- a/x\n+++ b/y\n") != key
    assert hostprep.criu_build_key(b"--- a/x\n+++ b/x\n", ("RUNDIR=/run",)) != key


def test_a_new_patch_is_a_new_install_dir(tmp_path: Path) -> None:
    """A host built with the previous patch (or none) builds again rather than reuse it."""
    first, second = tmp_path / "a.patch", tmp_path / "b.patch"
    first.write_bytes(b"one\n")
    second.write_bytes(b"two\n")
    a = hostprep.CriuPaths.for_patch(tmp_path, first)
    b = hostprep.CriuPaths.for_patch(tmp_path, second)
    assert a.install_dir != b.install_dir
    assert a.install_dir.parent == b.install_dir.parent == tmp_path / "criu"
    assert a.tarball == b.tarball, "the source tarball is shared by every build"


def test_the_patch_is_packaged_beside_hostprep() -> None:
    assert hostprep.CRIU_PATCH.parent == Path(hostprep.__file__).parent
    assert b"track-mem-uffd-wp" in hostprep.CRIU_PATCH.read_bytes()
    assert "patch" in hostprep.CRIU_BUILD_DEPS


def test_a_missing_patch_says_to_reinstall(tmp_path: Path) -> None:
    with pytest.raises(hostprep.HostPrepError, match=r"gone\.patch is missing.*Reinstall drumsd"):
        hostprep.CriuPaths.for_patch(tmp_path, tmp_path / "gone.patch")


class FakeBuild:
    """ensure_criu's edges: apt and the download do nothing, the tarball is a small tree, and
    `_run` records each command (make leaves a binary; `patch` fails when told to)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, patch_fails: bool):
        self.calls: list[tuple[list[str], Path | None]] = []
        self.patch_fails = patch_fails
        tree = tmp_path / "tree" / f"criu-{hostprep.CRIU_VERSION}"
        tree.mkdir(parents=True)
        (tree / "Makefile").write_text("criu:\n")
        self.tarball = tmp_path / "criu.tar"
        with tarfile.open(self.tarball, "w") as tar:
            tar.add(tree, arcname=tree.name)
        monkeypatch.setattr(hostprep, "ensure_apt_packages", lambda packages, progress: None)
        monkeypatch.setattr(hostprep, "_fetch_tarball", lambda paths, progress: self.tarball)
        monkeypatch.setattr(hostprep, "_run", self.run)

    def run(
        self,
        argv: Sequence[str],
        progress: hostprep.Progress,
        *,
        cwd: Path | None = None,
        **_: object,
    ) -> None:
        self.calls.append((list(argv), cwd))
        if argv[0] == "patch" and self.patch_fails:
            raise hostprep.HostPrepError(
                f"command failed (rc=1): {' '.join(argv)}\nHunk #1 FAILED at 164."
            )
        if argv[0] == "make":
            assert cwd is not None
            (cwd / "criu").mkdir()
            (cwd / "criu" / "criu").write_text("#!/bin/sh\n")


def test_the_patch_is_applied_before_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build = FakeBuild(tmp_path, monkeypatch, patch_fails=False)
    link = tmp_path / "sbin" / "criu"
    binary = hostprep.ensure_criu(tmp_path / "cache", progress=lambda m: None, link=link)
    assert binary == hostprep.CriuPaths.for_patch(tmp_path / "cache").binary
    assert os.readlink(link) == str(binary)
    (patch_argv, _), (make_argv, make_cwd) = build.calls
    assert make_argv[0] == "make" and make_cwd is not None
    assert make_cwd.name == f"criu-{hostprep.CRIU_VERSION}"
    srcdir = str(make_cwd)
    assert patch_argv == [
        "patch",
        "-p1",
        "--forward",
        "--batch",
        "-d",
        srcdir,
        "-i",
        str(hostprep.CRIU_PATCH),
    ]


def test_a_patch_that_does_not_apply_stops_the_build_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = FakeBuild(tmp_path, monkeypatch, patch_fails=True)
    link = tmp_path / "sbin" / "criu"
    with pytest.raises(hostprep.HostPrepError) as raised:
        hostprep.ensure_criu(tmp_path / "cache", progress=lambda m: None, link=link)
    message = str(raised.value)
    assert f"{hostprep.CRIU_PATCH} does not apply to CRIU {hostprep.CRIU_VERSION}" in message
    assert "patch -p1 --dry-run" in message and "reinstall drumsd" in message
    assert "Hunk #1 FAILED" in message, "the output of patch is kept"
    assert [argv[0] for argv, _ in build.calls] == ["patch"], "make never ran"
    assert not hostprep.CriuPaths.for_patch(tmp_path / "cache").binary.exists()
    assert not link.is_symlink()
