"""`drumsd image build` installs from the image lock: the lock of one profile (checked against its
recipe), the local repository's index, the cache key, the verified fetch of the locked .debs, and
what a .deb the mirror no longer serves does (a clear error, or with --mirror-fallback the mirror
by name, loudly). The build itself from the lock is live (tests/nix/test_nix_debian_lock.py
compares the built images with the lock)."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drumsd.core import image_lock
from drumsd.core.image_lock import LockedDeb
from drumsd.linux import image
from drumsd.linux.image_profiles import PROFILES


@pytest.fixture(scope="module")
def lock() -> dict[str, Any]:
    return json.loads(image.LOCK_FILE.read_text())


def test_the_package_ships_the_lock_nix_reads() -> None:
    repo_link = Path(__file__).resolve().parents[2] / "nix" / "images.lock.json"
    assert repo_link.resolve() == image.LOCK_FILE


def test_a_profiles_lock_is_its_closure_with_the_locked_hashes(lock: dict[str, Any]) -> None:
    locked = image.load_profile_lock(PROFILES["base"], arch="amd64")
    closure = lock["profiles"]["base"]["closure"]["amd64"]
    assert [d.name for d in locked.debs] == sorted({*closure["bootstrap"], *closure["apt"]})
    bash = next(d for d in locked.debs if d.name == "bash")
    entry = lock["debs"]["amd64"]["bash"]
    assert (bash.version, bash.sha256, bash.size) == (
        entry["version"],
        entry["sha256"],
        entry["size"],
    )
    assert bash.basename == entry["filename"].rsplit("/", 1)[1]
    stanzas = image_lock.parse_stanzas(locked.packages_index)
    assert [s["Package"] for s in stanzas] == [d.name for d in locked.debs]
    assert {s["SHA256"] for s in stanzas} == {d.sha256 for d in locked.debs}
    assert [p.url for p in locked.pip_files] == [
        p["url"] for p in lock["profiles"]["base"]["pip_files"]
    ]


def test_the_release_file_hashes_the_index() -> None:
    text = image_lock.release_text("bookworm", "main", "arm64", "Package: a\n")
    digest = hashlib.sha256(b"Package: a\n").hexdigest()
    assert f" {digest} 11 main/binary-arm64/Packages\n" in text
    assert "Architectures: arm64\n" in text


def test_a_recipe_changed_without_a_refreshed_lock_is_refused() -> None:
    changed = dataclasses.replace(PROFILES["base"], packages=(*PROFILES["base"].packages, "gedit"))
    with pytest.raises(image.ImageBuildError, match="packages changed since") as err:
        image.load_profile_lock(changed, arch="amd64")
    assert image_lock.REFRESH in str(err.value)


def test_a_lock_of_another_builder_or_arch_is_refused(lock: dict[str, Any], tmp_path: Path) -> None:
    other = tmp_path / "lock.json"
    other.write_text(json.dumps({**lock, "mirror": "http://elsewhere/debian"}))
    with pytest.raises(image.ImageBuildError, match="mirror is 'http://elsewhere/debian'"):
        image.load_profile_lock(PROFILES["base"], other, arch="amd64")
    with pytest.raises(image.ImageBuildError, match="no riscv64 packages for base"):
        image.load_profile_lock(PROFILES["base"], arch="riscv64")
    with pytest.raises(image.ImageBuildError, match="not s390x"):
        image.host_arch("s390x")
    missing = tmp_path / "absent.json"
    with pytest.raises(image.ImageBuildError, match="cannot read the image lock"):
        image.load_profile_lock(PROFILES["base"], missing, arch="amd64")


def test_the_cache_key_has_the_lock_content(lock: dict[str, Any], tmp_path: Path) -> None:
    base = PROFILES["base"]
    locked = image.load_profile_lock(base, arch="amd64")
    assert image.layer_key(base, locked) != image.layer_key(base)
    assert image.layer_key(base, locked) == image.layer_key(
        base, image.load_profile_lock(base, arch="amd64")
    )
    # One locked .deb rebuilt (same version, new bytes): another layer.
    edited = json.loads(json.dumps(lock))
    edited["debs"]["amd64"]["bash"]["sha256"] = "0" * 64
    path = tmp_path / "lock.json"
    path.write_text(json.dumps(edited))
    assert image.layer_key(base, image.load_profile_lock(base, path, arch="amd64")) != (
        image.layer_key(base, locked)
    )
    assert image.layer_key(base, image.load_profile_lock(base, arch="arm64")) != (
        image.layer_key(base, locked)
    )


def test_the_manifest_diff_names_each_difference() -> None:
    wanted = {"a": ("1", "amd64"), "b": ("2", "amd64"), "c": ("3", "all")}
    installed = {"a": ("1", "amd64"), "b": ("2.1", "amd64"), "d": ("4", "all")}
    assert image_lock.manifest_diff(installed, wanted) == [
        "only in the image: d 4",
        "only in the lock: c 3",
        "b: image 2.1 (amd64), lock 2 (amd64)",
    ]
    assert image_lock.manifest_diff(wanted, wanted) == []
    status = (
        "Package: a\nStatus: install ok installed\nVersion: 1\nArchitecture: amd64\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 9\nArchitecture: all\n"
    )
    assert image_lock.installed_packages(status) == {"a": ("1", "amd64")}


# ---------------------------------------------------------------- the fetch, against a server


@pytest.fixture()
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server of tmp_path/pool (404 for anything absent)."""
    served = tmp_path / "served"
    served.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def _deb(served: Path, name: str, body: bytes | None, claimed: bytes | None = None) -> LockedDeb:
    """A locked .deb whose lock entry hashes `claimed` (default: body); served unless None."""
    filename = f"pool/main/{name[0]}/{name}/{name}_1_amd64.deb"
    if body is not None:
        (served / filename).parent.mkdir(parents=True, exist_ok=True)
        (served / filename).write_bytes(body)
    ref = claimed if claimed is not None else body or b""
    return LockedDeb(name, "1", "amd64", filename, len(ref), hashlib.sha256(ref).hexdigest())


def _profile_lock(url: str, debs: tuple[LockedDeb, ...]) -> image_lock.ProfileLock:
    base = image.load_profile_lock(PROFILES["base"], arch="amd64")
    return dataclasses.replace(base, mirror=url, debs=debs)


def test_locked_debs_are_fetched_verified_and_reused(
    mirror: tuple[str, Path], tmp_path: Path
) -> None:
    url, served = mirror
    locked = _profile_lock(url, (_deb(served, "alpha", b"a" * 10), _deb(served, "beta", None)))
    cache = tmp_path / "debs"
    missing = image.fetch_locked_debs(locked, cache, lambda _m: None)
    assert [d.name for d in missing] == ["beta"]
    assert (cache / "alpha_1_amd64.deb").read_bytes() == b"a" * 10
    assert not (cache / "beta_1_amd64.deb").exists()
    # Cached with the right hash: not fetched again (the server no longer has it).
    (served / locked.debs[0].filename).unlink()
    assert (
        image.fetch_locked_debs(
            dataclasses.replace(locked, debs=locked.debs[:1]), cache, lambda _m: None
        )
        == []
    )


def test_a_deb_with_other_bytes_is_refused_and_not_kept(
    mirror: tuple[str, Path], tmp_path: Path
) -> None:
    url, served = mirror
    locked = _profile_lock(url, (_deb(served, "gamma", b"evil", claimed=b"good"),))
    cache = tmp_path / "debs"
    with pytest.raises(image.ImageBuildError, match="refusing it"):
        image.fetch_locked_debs(locked, cache, lambda _m: None)
    assert list(cache.iterdir()) == []


def _lock_served_by(lock: dict[str, Any], url: str, tmp_path: Path) -> Path:
    path = tmp_path / "lock.json"
    path.write_text(json.dumps({**lock, "mirror": url}))
    return path


def test_a_deb_the_mirror_dropped_stops_the_build_naming_it(
    lock: dict[str, Any], mirror: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is served: the build stops before debootstrap with the names and the fix; no
    layer is built from anything else."""
    url, _served = mirror
    monkeypatch.setattr(image, "MIRROR", url)
    monkeypatch.setattr(image, "FETCH_THREADS", 16)
    built: list[Any] = []
    monkeypatch.setattr(image, "_build_layer_cached", lambda *a: built.append(a))
    with pytest.raises(image.LockedDebsMissing) as err:
        image.build_image(
            "base",
            tmp_path / "cache",
            progress=lambda _m: None,
            lock_file=_lock_served_by(lock, url, tmp_path),
        )
    message = str(err.value)
    assert "no longer serves" in message and "adduser " in message
    assert image_lock.REFRESH in message and "--mirror-fallback" in message
    assert built == []


def test_mirror_fallback_builds_by_name_and_says_so_loudly(
    lock: dict[str, Any], mirror: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _served = mirror
    monkeypatch.setattr(image, "MIRROR", url)
    monkeypatch.setattr(image, "FETCH_THREADS", 16)

    class Stop(Exception):
        pass

    def layer(prof: Any, lkey: str, path: Path, progress: Any, locked: Any) -> None:
        raise Stop(lkey, locked)

    monkeypatch.setattr(image, "_build_layer_cached", layer)
    said: list[str] = []
    with pytest.raises(Stop) as stop:
        image.build_image(
            "base",
            tmp_path / "cache",
            progress=said.append,
            lock_file=_lock_served_by(lock, url, tmp_path),
            mirror_fallback=True,
        )
    lkey, locked = stop.value.args
    assert locked is None and lkey == image.layer_key(PROFILES["base"])
    assert any("NOT FROM THE LOCK" in m and "adduser" in m for m in said)
    assert image._source_meta(None) == {"packages_from": "mirror"}


def test_a_stale_lock_fails_the_build_unless_mirror_fallback(
    lock: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = json.loads(json.dumps(lock))
    stale["profiles"]["base"]["pip"] = ["pyautogui==0.0.1"]
    path = tmp_path / "lock.json"
    path.write_text(json.dumps(stale))
    with pytest.raises(image.ImageBuildError, match="pip changed since"):
        image.build_image("base", tmp_path / "cache", progress=lambda _m: None, lock_file=path)
    monkeypatch.setattr(
        image, "_build_layer_cached", lambda *a: (_ for _ in ()).throw(RuntimeError(a[-1]))
    )
    with pytest.raises(RuntimeError) as err:
        image.build_image(
            "base", tmp_path / "cache", lambda _m: None, lock_file=path, mirror_fallback=True
        )
    assert err.value.args == (None,)
