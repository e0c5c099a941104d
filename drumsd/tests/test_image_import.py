"""`drumsd image unpack` refuses bad input with a message saying what to do (the unpack itself
runs in tests/nix/test_nix_nixos_eval.py, through the NixOS unit's own command, as root)."""

from __future__ import annotations

from pathlib import Path

import pytest
from drumsd.linux.image import ImageBuildError
from drumsd.linux.image_import import unpack_image


@pytest.mark.parametrize(("profile", "name"), [("a/b", "x"), ("base", "../x"), ("", "x")])
def test_names_that_are_not_a_directory_name_are_refused(
    tmp_path: Path, profile: str, name: str
) -> None:
    with pytest.raises(ImageBuildError, match="is not a directory name"):
        unpack_image(tmp_path / "root.tar", tmp_path / "images", profile, name)
    assert not (tmp_path / "images").exists()


def test_a_missing_tarball_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match=r"no image tarball at .*root\.tar; build it"):
        unpack_image(tmp_path / "root.tar", tmp_path / "images", "base", "abc")
    assert not (tmp_path / "images").exists()
