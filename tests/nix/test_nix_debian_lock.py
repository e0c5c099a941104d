"""The desktop images, the checker venv and OSWorld's task files, pinned for Nix.

nix/images.lock.json (nix/lock_images.py) must still be what the image recipes
(drumsd.linux.image_profiles) install: the same packages asked for, pip pins, files, setup script,
user and device list, and a closure that debootstrap and apt, run against a repository of only
the lock's index, resolve to exactly (the same steps nix/debian-image.nix runs). Every URL and hash
is well-formed; the Nix side fetches exactly the lock's; the images `drumsd image build` made on
this host have exactly the lock's packages (dpkg's status), and the .debs its apt cache kept have
the lock's sha256. Where the registries answer, a sample of URLs resolves to the locked sizes.
nix/checker-venv.lock.json is the pins drumsd installs, and matches a built checker venv."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from drumsd.linux import image
from drumsd.linux.image_profiles import PROFILES
from drumsd.linux.mounts import DEVICES
from drumsd.tasks import checker_venv
from nix_support import CACHE_ROOT, REPO, nix_env, require_tool
from nixos_tree import unpack_tree

LOCK = REPO / "nix" / "images.lock.json"
CHECKER_LOCK = REPO / "nix" / "checker-venv.lock.json"
EVAL = Path(__file__).with_name("debian_lock_eval.nix")
ARCHES = ("amd64", "arm64")
HEX64 = re.compile(r"[0-9a-f]{64}")


def _load_script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "nix" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


lock_images = _load_script("lock_images")


@pytest.fixture(scope="module")
def lock() -> dict[str, Any]:
    return json.loads(LOCK.read_text())


def closure(lock: dict[str, Any], profile: str, arch: str) -> dict[str, tuple[str, str]]:
    sets = lock["profiles"][profile]["closure"][arch]
    debs = lock["debs"][arch]
    return {
        n: (debs[n]["version"], debs[n]["architecture"]) for n in {*sets["bootstrap"], *sets["apt"]}
    }


# ---------------------------------------------------------------- the lock is the recipes'


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_lock_has_each_profiles_recipe(lock: dict[str, Any], profile: str) -> None:
    """A package, pip pin, file or setup line added to a profile without refreshing the lock
    fails here, naming the refresh command."""
    locked = lock["profiles"].get(profile)
    assert locked is not None, f"no {profile} in {LOCK}; run nix/lock_images.py"
    wanted = lock_images.recipe(PROFILES[profile])
    stale = [key for key, value in wanted.items() if locked[key] != value]
    assert not stale, (
        f"{LOCK}'s {profile} differs from drumsd.linux.image_profiles in {stale}; refresh it: "
        "PYTHONPATH=drumsd/src .venv/bin/python nix/lock_images.py"
    )
    pins = sorted(f"{p['name'].lower()}=={p['version']}" for p in locked["pip_files"])
    assert pins == sorted(p.lower() for p in PROFILES[profile].pip)


def test_the_lock_has_the_builders_common_recipe(lock: dict[str, Any]) -> None:
    assert lock["suite"] == image.SUITE
    assert lock["mirror"] == image.MIRROR
    assert lock["builder_version"] == image.BUILDER_VERSION
    assert lock["user"] == {
        "name": image.DESKTOP_USER,
        "uid": image.DESKTOP_UID,
        "password": image.DESKTOP_PASSWORD,
    }
    assert lock["devices"] == [list(d) for d in DEVICES]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_asked_package_is_in_the_closure(
    lock: dict[str, Any], profile: str, arch: str
) -> None:
    have = closure(lock, profile, arch)
    missing = [p for p in PROFILES[profile].packages if p not in have]
    assert not missing, f"{profile}/{arch}: the lock lacks {missing}"


def test_every_url_and_hash_is_well_formed(lock: dict[str, Any]) -> None:
    bad = []
    for arch in ARCHES:
        for name, deb in lock["debs"][arch].items():
            upstream = deb["version"].split(":", 1)[-1]
            expected = f"_{upstream}_{deb['architecture']}.deb"
            if not (
                deb["filename"].startswith(f"pool/{lock['component']}/")
                and deb["filename"].endswith(expected)
                and f"/{name}_" in deb["filename"]
                and HEX64.fullmatch(deb["sha256"])
                and deb["size"] > 0
                and deb["architecture"] in (arch, "all")
            ):
                bad.append((arch, name, deb["filename"]))
    for profile in lock["profiles"].values():
        for pin in profile["pip_files"]:
            if not (
                pin["url"].startswith("https://files.pythonhosted.org/packages/")
                and HEX64.fullmatch(pin["sha256"])
            ):
                bad.append(("pip", pin["name"], pin["url"]))
    assert lock["mirror"].startswith("http")
    assert not bad, bad[:10]


def test_a_malformed_entry_fails_the_url_check(lock: dict[str, Any]) -> None:
    """The check above is not vacuous: a truncated hash or a pool path of another version fails."""
    broken = json.loads(json.dumps(lock))
    bash = broken["debs"]["amd64"]["bash"]
    bash["sha256"] = bash["sha256"][:-1]
    with pytest.raises(AssertionError):
        test_every_url_and_hash_is_well_formed(broken)
    broken = json.loads(json.dumps(lock))
    broken["debs"]["arm64"]["bash"]["version"] = "9.9-1"
    with pytest.raises(AssertionError):
        test_every_url_and_hash_is_well_formed(broken)


# ---------------------------------------------------------------- the closure resolves alone


def _resolve_from_lock(
    lock: dict[str, Any], profile: str, tmp: Path
) -> tuple[list[str], list[str]]:
    """debootstrap's and apt's answer against a repository of only the lock's index (amd64)."""
    require_tool("debootstrap")
    repo = lock_images.write_local_repo(lock, profile, "amd64", tmp / "repo")
    mirror = f"file://{repo}"
    boot = lock_images.bootstrap_names(tmp, lock["suite"], mirror, "amd64", check_gpg=False)
    apt = lock_images.AptIndex(tmp, lock["suite"], mirror, "amd64", options="trusted=yes")
    index = apt.update()
    added = apt.simulate(
        [lock_images.only_version(index, n) for n in boot], sorted(set(PROFILES[profile].packages))
    )
    return boot, sorted(name for name, _v, _a in added)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_debootstrap_and_apt_resolve_the_lock_to_itself(
    lock: dict[str, Any], profile: str, tmp_path: Path
) -> None:
    """What nix/debian-image.nix runs (debootstrap minbase, then apt-get install of the
    profile's packages) picks exactly the lock's packages from the lock's own repository:
    nothing missing, nothing the lock would not have (amd64; ~2 s each)."""
    boot, added = _resolve_from_lock(lock, profile, tmp_path)
    sets = lock["profiles"][profile]["closure"]["amd64"]
    assert boot == sets["bootstrap"]
    assert added == sets["apt"]


def test_a_lock_missing_a_dependency_does_not_resolve(lock: dict[str, Any], tmp_path: Path) -> None:
    """Take a library out of base's closure: apt, limited to the lock, cannot install base."""
    broken = json.loads(json.dumps(lock))
    sets = broken["profiles"]["base"]["closure"]["amd64"]
    sets["apt"].remove("libxdo3")
    with pytest.raises(SystemExit, match="apt-get -s"):
        _resolve_from_lock(broken, "base", tmp_path)


# ---------------------------------------------------------------- the Nix side fetches the lock


@pytest.fixture(scope="module")
def nix_side(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    lib = unpack_tree(tmp_path_factory.mktemp("nixpkgs-snapshot"))[0] / "lib"
    result = subprocess.run(
        [require_tool("nix-instantiate"), "--eval", str(EVAL), "--arg", "libPath", str(lib)],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(json.loads(result.stdout))


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_nix_image_fetches_exactly_the_lock(
    lock: dict[str, Any], nix_side: dict[str, Any], profile: str, arch: str
) -> None:
    got = nix_side["images"][profile][arch]
    debs = lock["debs"][arch]
    wanted = {
        n: (f"{lock['mirror']}/{debs[n]['filename']}", debs[n]["sha256"])
        for n in closure(lock, profile, arch)
    }
    assert {d["name"]: (d["url"], d["sha256"]) for d in got["debs"]} == wanted
    # Store names: Nix's own rules (no `~`, no `:`), checked again here for a clear message.
    bad = [
        d["storeName"]
        for d in got["debs"]
        if not re.fullmatch(r"[A-Za-z0-9+._?=-]+", d["storeName"])
    ]
    assert not bad
    # The local repository's index is what lock_images writes (the resolution test used it).
    names = sorted(wanted)
    assert got["packagesIndex"] == "\n".join(lock_images.index_stanza(n, debs[n]) for n in names)
    assert got["manifest"] == "".join(f"{n} {debs[n]['version']}\n" for n in names)
    assert got["packages"] == sorted(set(PROFILES[profile].packages))
    assert [(p["url"], p["sha256"]) for p in got["pip"]] == [
        (p["url"], p["sha256"]) for p in lock["profiles"][profile]["pip_files"]
    ]
    assert all(p["fileName"] == p["url"].rsplit("/", 1)[1] for p in got["pip"])


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_nix_checker_venv_fetches_exactly_its_lock(
    nix_side: dict[str, Any], machine: str
) -> None:
    checker = json.loads(CHECKER_LOCK.read_text())
    wanted = [checker["desktop_env"], *checker["machines"][machine]["files"]]
    assert [(f["url"], f["sha256"]) for f in nix_side["checker"][machine]] == [
        (f["url"], f["sha256"]) for f in wanted
    ]
    assert nix_side["checkerRiscv"] == {"success": False, "value": False}


def test_the_nix_osworld_tasks_fetch_the_pinned_tarball(nix_side: dict[str, Any]) -> None:
    """Same URL and sha256 as drumsd's own fetch-osworld (tasks.osworld_pin)."""
    from drumsd.tasks.osworld_pin import tarball_url

    got = nix_side["osworld"]
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert got["url"] == tarball_url("https://github.com/xlang-ai/OSWorld", commit)
    assert got["sha256"] == "89abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567"
    assert "--wildcards '*/evaluation_examples/examples/*'" in got["script"]


# ---------------------------------------------------------------- what was really installed


def _installed(root: Path) -> dict[str, tuple[str, str]]:
    status = (root / "var/lib/dpkg/status").read_text()
    return {
        s["Package"]: (s["Version"], s["Architecture"])
        for s in lock_images.parse_index(status)
        if s.get("Status", "").endswith(" installed")
    }


def _built_image(profile: str) -> Path:
    root = CACHE_ROOT / "images" / profile / "root"
    if not (root / "var/lib/dpkg/status").is_file():
        message = f"no {profile} image at {root} (scripts/setup.sh {profile} builds it)"
        if os.environ.get("DRUMS_CI") == "1" and profile in ("base", "office"):
            pytest.fail(f"DRUMS_CI=1 but {message}")
        pytest.skip(message)
    return root


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_built_image_has_exactly_the_locked_packages(
    lock: dict[str, Any], profile: str
) -> None:
    """`drumsd image build` installed from the lock (image.json says so: not a
    --mirror-fallback build, which setup.sh makes when the mirror dropped locked .debs in a
    point release) and dpkg lists the lock's names, versions and architectures, nothing more or
    less. Fails on an image built by name from the mirror, or before the lock."""
    root = _built_image(profile)
    meta = json.loads((root.parent / "image.json").read_text())
    how = {"mirror": "from the mirror by name (--mirror-fallback)", None: "before the lock build"}
    assert meta.get("packages_from") == "lock", (
        f"the {profile} image at {root.parent} was built {how.get(meta.get('packages_from'))}: "
        f"refresh the lock ({lock_images.HEADER.split('Refresh: ')[1]}) and rebuild it"
    )
    installed = _installed(root)
    wanted = closure(lock, profile, "amd64")
    assert installed == wanted, {
        "only in the image": sorted(set(installed) - set(wanted))[:20],
        "only in the lock": sorted(set(wanted) - set(installed))[:20],
        "other version": sorted(
            n for n in set(installed) & set(wanted) if installed[n] != wanted[n]
        )[:20],
    }


def test_the_debs_the_image_build_fetched_have_the_locked_hashes(lock: dict[str, Any]) -> None:
    archives = CACHE_ROOT / "images" / "layers" / "apt-archives"
    present = [
        (deb, archives / Path(deb["filename"]).name)
        for deb in lock["debs"]["amd64"].values()
        if (archives / Path(deb["filename"]).name).is_file()
    ]
    if not present:
        pytest.skip(f"no .deb of the lock in {archives} (an image build keeps them there)")
    wrong = [
        path.name
        for deb, path in present
        if path.stat().st_size != deb["size"]
        or hashlib.sha256(path.read_bytes()).hexdigest() != deb["sha256"]
    ]
    assert not wrong, wrong[:10]


# ---------------------------------------------------------------- the registries, sampled


def _head(url: str) -> int | None:
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.headers.get("Content-Length", -1))
    except (urllib.error.URLError, OSError):
        return None


def test_a_sample_of_locked_urls_resolves(lock: dict[str, Any]) -> None:
    """Five .debs (first, middle, last of office's amd64 closure; one arm64; the smallest, whose
    bytes are hashed) and one pip file: each answers with the locked size. Skips when the
    registries do not answer (a clone offline)."""
    debs = lock["debs"]
    office = sorted(closure(lock, "office", "amd64"))
    sample = [debs["amd64"][office[i]] for i in (0, len(office) // 2, -1)]
    sample.append(debs["arm64"]["bash"])
    smallest = min(debs["amd64"].values(), key=lambda d: d["size"])
    urls = [(f"{lock['mirror']}/{d['filename']}", d["size"]) for d in [*sample, smallest]]
    pin = lock["profiles"]["base"]["pip_files"][0]
    first = _head(urls[0][0])
    if first is None:
        pytest.skip("the Debian mirror does not answer from here")
    sizes = [first] + [_head(url) for url, _size in urls[1:]] + [_head(pin["url"])]
    assert sizes[: len(urls)] == [size for _url, size in urls]
    assert sizes[-1] and sizes[-1] > 0
    with urllib.request.urlopen(urls[-1][0], timeout=20) as response:
        assert hashlib.sha256(response.read()).hexdigest() == smallest["sha256"]


# ---------------------------------------------------------------- the checker venv's pins


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_checker_lock_is_drumsds_pins(machine: str) -> None:
    checker = json.loads(CHECKER_LOCK.read_text())
    assert sorted(checker["machines"]) == ["aarch64", "x86_64"]
    files = checker["machines"][machine]["files"]
    normalize = lambda pin: re.sub(r"[-_.]+", "-", pin.lower())  # noqa: E731
    pinned = sorted(normalize(f"{f['name']}=={f['version']}") for f in files)
    assert pinned == sorted(normalize(p) for p in checker_venv.pinned_requirements()), (
        "checker-requirements.txt changed; refresh: nix/lock_checker_venv.py"
    )
    # Built wheels for the machine (an sdist only where x86_64 has one: odfpy, pure Python).
    for f in files:
        name = f["url"].rsplit("/", 1)[1]
        assert name.endswith((".tar.gz", "-any.whl")) or f"_{machine}" in name, name
    assert [f["name"] for f in files if f["url"].endswith(".tar.gz")] == ["odfpy"]
    assert normalize(f"desktop-env=={checker['desktop_env']['version']}") == normalize(
        checker_venv.DESKTOP_ENV
    )
    assert (
        checker["requirements_sha256"]
        == hashlib.sha256(checker_venv.requirements_text().encode()).hexdigest()
    )
    for f in [checker["desktop_env"], *files]:
        assert f["url"].startswith("https://files.pythonhosted.org/packages/"), f
        assert HEX64.fullmatch(f["sha256"]), f
        assert f["url"].endswith((".whl", ".tar.gz")), f


def test_a_built_checker_venv_has_the_locked_versions() -> None:
    venvs = sorted(CACHE_ROOT.glob("checker-venv-*/drums-venv.json"))
    if not venvs:
        pytest.skip(f"no checker venv under {CACHE_ROOT} (python -m drumsd.tasks builds one)")
    checker = json.loads(CHECKER_LOCK.read_text())
    wanted = {
        re.sub(r"[-_.]+", "-", f["name"].lower()): f["version"]
        for f in [checker["desktop_env"], *checker["machines"][platform.machine()]["files"]]
    }
    venv = venvs[-1].parent
    found = {}
    for meta in venv.glob("lib/python*/site-packages/*.dist-info/METADATA"):
        fields = dict(
            line.split(": ", 1)
            for line in meta.read_text(errors="replace").splitlines()[:5]
            if ": " in line
        )
        found[re.sub(r"[-_.]+", "-", fields["Name"].lower())] = fields["Version"]
    assert {n: found.get(n) for n in wanted} == wanted


@pytest.mark.skipif(
    os.environ.get("DRUMS_LOCK_FRESH") != "1",
    reason="re-resolving the lock against the mirror takes minutes: set DRUMS_LOCK_FRESH=1",
)
def test_the_lock_is_todays_resolution() -> None:
    """The lock is what debootstrap, apt and pip resolve today (it changes at a point release)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "nix" / "lock_images.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "drumsd" / "src")},
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
