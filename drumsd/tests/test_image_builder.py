"""The image builder's pure parts: cache keys, the guest hash and the tree manifest."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from drumsd.linux import image, image_manifest, image_profiles


def test_layer_key_ignores_package_order_and_duplicates() -> None:
    base = image_profiles.PROFILES["base"]
    shuffled = dataclasses.replace(base, packages=(*reversed(base.packages), "xterm"))
    assert image.layer_key(shuffled) == image.layer_key(base)
    more = dataclasses.replace(base, packages=(*base.packages, "gedit"))
    assert image.layer_key(more) != image.layer_key(base)


def test_profiles() -> None:
    base, office = image_profiles.PROFILES["base"], image_profiles.PROFILES["office"]
    assert {"xvfb", "openbox", "python-is-python3", "python3-tk"} <= set(base.packages)
    assert set(base.packages) < set(office.packages)
    assert "chromium" in office.packages
    wrapper = office.files["usr/local/bin/google-chrome"][1]
    assert "--no-sandbox" in wrapper and "--remote-debugging-port=1337" in wrapper
    assert image.layer_key(base) != image.layer_key(office)


def test_guest_hash_follows_guest_sources_only(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("print(1)\n")
    first = image.guest_sources_hash(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"junk")
    assert image.guest_sources_hash(tmp_path) == first
    (tmp_path / "agent.py").write_text("print(2)\n")
    second = image.guest_sources_hash(tmp_path)
    assert second != first
    assert image.image_key("layer", first) != image.image_key("layer", second)


def make_tree(root: Path) -> None:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("drums\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "bin" / "alias").symlink_to("tool")
    os.link(root / "bin" / "tool", root / "bin" / "hardlink")


def test_manifest_is_deterministic_and_sees_content_mode_and_links(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_tree(a)
    make_tree(b)
    sha_a = image_manifest.write_manifest(a, tmp_path / "a.tsv")
    # mtimes differ, the hash does not
    assert image_manifest.write_manifest(b, tmp_path / "b.tsv") == sha_a
    lines = (tmp_path / "a.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == [
        "bin",
        "bin/alias",
        "bin/hardlink",
        "bin/tool",
        "etc",
        "etc/hostname",
    ]
    assert lines[1].split("\t")[-1] == "tool"

    (b / "etc" / "hostname").write_text("other\n")
    assert image_manifest.write_manifest(b, tmp_path / "b.tsv") != sha_a
    make_tree(c := tmp_path / "c")
    (c / "bin" / "tool").chmod(0o700)
    assert image_manifest.write_manifest(c, tmp_path / "c.tsv") != sha_a
    make_tree(d := tmp_path / "d")
    (d / "bin" / "alias").unlink()
    (d / "bin" / "alias").symlink_to("hardlink")
    assert image_manifest.write_manifest(d, tmp_path / "d.tsv") != sha_a


def fake_build(images: Path, name: str, layer: str) -> Path:
    final = images / name
    (final / "root").mkdir(parents=True)
    (final / "image.json").write_text(f'{{"layer_key": "{layer}"}}')
    (images / "layers" / layer).mkdir(parents=True, exist_ok=True)
    (images / "layers" / layer / "layer.json").write_text("{}")
    return final


def test_prune_keeps_what_profiles_point_to(tmp_path: Path) -> None:
    images = tmp_path / "images"
    old = fake_build(images, "base-old", "L1")
    new = fake_build(images, "base-new", "L2")
    (images / "base").symlink_to("base-new")
    assert image.prune_images(tmp_path, progress=lambda m: None, dry_run=True) == [
        old,
        images / "layers" / "L1",
    ]
    assert old.exists()
    image.prune_images(tmp_path, progress=lambda m: None)
    assert not old.exists() and not (images / "layers" / "L1").exists()
    assert new.exists() and (images / "layers" / "L2").exists()


def test_writes_follow_symlinks_inside_the_image_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc" / "libreoffice" / "registry").mkdir(parents=True)
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "registry").symlink_to("/etc/libreoffice/registry")
    (root / "usr" / "lib" / "rel").symlink_to("../../etc")
    assert image.resolve_in_root(root, "usr/lib/registry/x.xcd") == (
        root / "etc" / "libreoffice" / "registry" / "x.xcd"
    )
    assert image.resolve_in_root(root, "usr/lib/rel/hostname") == root / "etc" / "hostname"
    assert image.resolve_in_root(root, "../../../etc/passwd") == root / "etc" / "passwd"


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_minimal_dev_keeps_only_the_slot_nodes(tmp_path: Path) -> None:
    import stat

    from drumsd.linux.image import minimal_dev

    dev = tmp_path / "dev"
    (dev / "pts").mkdir(parents=True)
    for name, major, minor, kind in (
        ("null", 1, 3, stat.S_IFCHR),
        ("tty", 5, 0, stat.S_IFCHR),
        ("console", 5, 1, stat.S_IFCHR),
        ("ptmx", 5, 2, stat.S_IFCHR),
        ("sda", 8, 0, stat.S_IFBLK),
        ("zero_alias", 1, 5, stat.S_IFCHR),  # a right number under another name
        ("pts/0", 136, 0, stat.S_IFCHR),
    ):
        os.mknod(dev / name, kind | 0o666, os.makedev(major, minor))
    (dev / "fd").symlink_to("/proc/self/fd")
    removed = minimal_dev(dev)
    assert sorted(removed) == ["console", "ptmx", "pts/0", "sda", "zero_alias"]
    assert sorted(p.name for p in dev.iterdir()) == ["fd", "null", "ptmx", "pts", "tty"]
    assert os.readlink(dev / "ptmx") == "pts/ptmx"
