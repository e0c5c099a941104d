"""The CRIU userns image codec and the uid range arithmetic of the hardened profile."""

from __future__ import annotations

from pathlib import Path

from drumsd.linux import idmap

# A real userns-*.img of an identity-mapped slot (criu 4.2.1): magic, size 24, uid and gid maps.
IDENTITY_IMG = bytes.fromhex(
    "1943565406494755180000000a0a0800100018ffffffff0f120a0800100018ffffffff0f"
)


def test_decode_the_identity_image() -> None:
    img = idmap.decode_userns_image(IDENTITY_IMG)
    assert img.uid_map == idmap.IDENTITY and img.gid_map == idmap.IDENTITY
    assert idmap.encode_userns_image(img) == IDENTITY_IMG


def test_rewrite_for_a_slot_range() -> None:
    data = idmap.rewrite_userns_image(IDENTITY_IMG, idmap.range_map(3))
    img = idmap.decode_userns_image(data)
    assert img.uid_map == ((0, 100000 + 3 * 65536, 65536),) == img.gid_map
    assert data[:8] == IDENTITY_IMG[:8]
    assert len(data) == 36  # the size the hardened note measured
    back = idmap.rewrite_userns_image(data, idmap.IDENTITY)
    assert back == IDENTITY_IMG


def test_ranges_do_not_overlap() -> None:
    assert idmap.uid_base(0) == 100000
    assert idmap.uid_base(1) - idmap.uid_base(0) == idmap.UID_COUNT
    assert idmap.map_text(idmap.range_map(1)) == "0 165536 65536\n"


def test_images_for_map_links_and_rewrites(tmp_path: Path) -> None:
    src = tmp_path / "images"
    src.mkdir()
    (src / "pages-1.img").write_bytes(b"x" * 10)
    (src / "userns-13.img").write_bytes(IDENTITY_IMG)
    dst = tmp_path / ".images-map-2"
    idmap.images_for_map(src, dst, idmap.range_map(2))
    assert (dst / "pages-1.img").stat().st_ino == (src / "pages-1.img").stat().st_ino
    img = idmap.decode_userns_image((dst / "userns-13.img").read_bytes())
    assert img.uid_map == idmap.range_map(2)
    assert (src / "userns-13.img").read_bytes() == IDENTITY_IMG
