"""Desktop image builder: a debootstrap'd Debian root with the desktop packages and the guest agent.

The packages come from the image lock (images.lock.json next to this module, the file
nix/images.lock.json links to; nix/lock_images.py writes it): every .deb is fetched by its pool
URL and checked against the lock's sha256, and debootstrap and apt install from a local
repository of exactly those files, so the image holds the lock's packages and the Nix images
(nix/debian-image.nix, the same steps) hold the same. A .deb the mirror no longer serves stops the
build, naming it; `mirror_fallback` (`--mirror-fallback`) builds from the mirror by name instead,
loudly, and the image records it (image.json `packages_from`).

Two cache levels under <cache_root>/images, both keyed by content:
  layers/<layer key>/root      debootstrap + apt + pip (key: recipe, lock digest, builder version)
  <profile>-<image key>/root   that layer + the guest files (key: layer key + guest sources hash)
so editing the guest agent rebuilds in seconds instead of re-running debootstrap. Finished images
are immutable lower layers: the final tree shares inodes with its layer (hard links) and must never
be written to. The image's sha256 is taken over a manifest of the tree (path, mode, uid, gid, size,
content hash, link target) and becomes the checkpoints' `image_sha256`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from drumsd.core.image_lock import (
    DPKG_ARCH,
    LockedDeb,
    LockError,
    ProfileLock,
    installed_packages,
    manifest_diff,
    missing_debs_message,
    profile_lock,
    release_text,
)
from drumsd.linux.image_apps import APPS, probe_apps
from drumsd.linux.image_apps import read_manifest as read_app_manifest
from drumsd.linux.image_apps import write_manifest as write_app_manifest
from drumsd.linux.image_manifest import write_manifest
from drumsd.linux.image_profiles import PROFILES, Profile
from drumsd.linux.mounts import DEVICES

Progress = Callable[[str], None]

# Bump when the build recipe changes in a way the package lists do not show.
BUILDER_VERSION = "2"  # 2: /dev holds only the minimal nodes
# Bump when the image stage (guest files, /dev, byte-compiling) changes: images are assembled
# again from their cached layers; the layers and the lock stay as they are.
ASSEMBLY_VERSION = "2"  # 2: the image's Python modules byte-compiled
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"

DESKTOP_USER = "user"
DESKTOP_UID = 1000
# OSWorld's VM convention (its setup steps sometimes type it into sudo prompts).
DESKTOP_PASSWORD = "password"
GUEST_DIR_IN_IMAGE = "opt/drums/guest"
GUEST_SOURCE_DIR = Path(__file__).resolve().parent.parent / "guest"
# The Debian package lock the images install from (shipped in the package).
LOCK_FILE = Path(__file__).resolve().with_name("images.lock.json")
LOCK_COMPONENT = "main"
FETCH_TIMEOUT_S = 60.0
FETCH_THREADS = 4


class ImageBuildError(RuntimeError):
    """A build step failed; the message names the step and what to do next."""


class LockedDebsMissing(ImageBuildError):
    """The mirror no longer serves some of the lock's .debs (a Debian point release)."""


@dataclass(frozen=True)
class ImageInfo:
    profile: str
    root: Path
    sha256: str
    key: str
    manifest: Path
    meta: Path


# ---------------------------------------------------------------- pure: keys


def lock_common() -> dict:
    """What of the builder the lock records for every profile (nix/lock_images.py writes it;
    a lock written for another builder is refused)."""
    return {
        "builder_version": BUILDER_VERSION,
        "suite": SUITE,
        "mirror": MIRROR,
        "component": LOCK_COMPONENT,
        "user": {"name": DESKTOP_USER, "uid": DESKTOP_UID, "password": DESKTOP_PASSWORD},
        "devices": [[name, major, minor] for name, major, minor in DEVICES],
    }


def host_arch(machine: str | None = None) -> str:
    machine = machine or os.uname().machine
    if machine not in DPKG_ARCH:
        raise ImageBuildError(
            f"the image lock covers {', '.join(DPKG_ARCH)}, not {machine}; "
            "build from the mirror by name with --mirror-fallback"
        )
    return DPKG_ARCH[machine]


def load_profile_lock(
    profile: Profile, lock_file: Path = LOCK_FILE, arch: str | None = None
) -> ProfileLock:
    """The lock of `profile` on this machine's architecture, checked against the recipe."""
    try:
        lock = json.loads(lock_file.read_text())
    except (OSError, ValueError) as exc:
        raise ImageBuildError(f"cannot read the image lock {lock_file}: {exc}") from exc
    try:
        return profile_lock(lock, profile, arch or host_arch(), lock_common())
    except LockError as exc:
        raise ImageBuildError(f"image lock {lock_file}: {exc}") from exc


def layer_key(profile: Profile, locked: ProfileLock | None = None) -> str:
    """Key of the package layer: what went into it, not when it was built. A layer built from
    the lock has the lock's digest in its key (any change to the locked .debs, index or pip
    files is a new layer); one built from the mirror by name (--mirror-fallback) has not."""
    spec = {
        "builder": BUILDER_VERSION,
        "suite": SUITE,
        "mirror": MIRROR,
        "packages": sorted(set(profile.packages)),
        "pip": sorted(profile.pip),
        "files": {k: [m, c] for k, (m, c) in sorted(profile.files.items())},
        "user": [DESKTOP_USER, DESKTOP_UID],
    }
    if profile.setup:  # only when set, so the keys of profiles without one stay as they were
        spec["setup"] = profile.setup
    if locked is not None:
        spec["lock"] = locked.digest
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def guest_sources_hash(source_dir: Path = GUEST_SOURCE_DIR) -> str:
    """Hash of the guest package's files (names and contents), ignoring caches."""
    digest = hashlib.sha256()
    for path in sorted(source_dir.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            rel = path.relative_to(source_dir).as_posix()
            digest.update(f"{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def image_key(layer: str, guest_hash: str) -> str:
    spec = f"{BUILDER_VERSION}\0{ASSEMBLY_VERSION}\0{layer}\0{guest_hash}"
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- effects: chroot work


# Build commands (and the chroot) see only this environment: host settings such as PIP_* or
# proxies must not leak into the image.
_CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LC_ALL": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


def _run(
    argv: Sequence[str],
    progress: Progress,
    what: str,
    *,
    env: dict | None = None,
    stream: bool = False,
) -> None:
    """Run a build command; stream lines with a prefix, or keep the tail for the error."""
    started = time.monotonic()
    progress(f"image: {what}")
    proc = subprocess.Popen(
        list(argv),
        start_new_session=True,  # so an interrupted build can kill the whole chroot job
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**_CLEAN_ENV, **(env or {})},
        errors="replace",
    )
    tail: list[str] = []
    assert proc.stdout is not None
    last_report = started
    try:
        for line in proc.stdout:
            tail = [*tail[-39:], line.rstrip()]
            now = time.monotonic()
            if stream or now - last_report > 10:
                progress(f"image:   [{what}] {line.rstrip()}")
                last_report = now
        rc = proc.wait()
    except BaseException:
        # Interrupted (Ctrl-C, an error): stop apt/dpkg before the caller removes their tree.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if rc != 0:
        raise ImageBuildError(f"{what} failed (rc={rc}): {' '.join(argv)}\n" + "\n".join(tail))
    progress(f"image: {what}: done in {time.monotonic() - started:.1f} s")


def _in_chroot(
    root: Path, script: str, apt_cache: Path | None = None, repo: Path | None = None
) -> list[str]:
    """A shell script run inside `root` with /proc, /sys and /dev mounted in a private mount
    namespace, so the mounts vanish with the process even if the build is interrupted.
    `apt_cache` is bind-mounted over the chroot's apt archive so rebuilds reuse downloads;
    `repo` (the lock's local repository) at /drums-repo."""
    outer = (
        'set -e; r="$1"; c="$2"; p="$3"; '
        'mount -t proc proc "$r/proc"; mount -t sysfs sysfs "$r/sys"; '
        'mount --rbind /dev "$r/dev"; '
        'if [ -n "$c" ]; then mount --bind "$c" "$r/var/cache/apt/archives"; fi; '
        'if [ -n "$p" ]; then mount --bind "$p" "$r/drums-repo"; fi; '
        'exec chroot "$r" /bin/sh -ec "$0"'
    )
    cache = str(apt_cache) if apt_cache else ""
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        outer,
        script,
        str(root),
        cache,
        str(repo) if repo else "",
    ]


def resolve_in_root(root: Path, rel: str, _depth: int = 0) -> Path:
    """Host path of `rel` as the image sees it: symlinks inside the tree are followed relative to
    `root`, so an absolute link (Debian's share/registry -> /etc/libreoffice/registry) can never
    send a write to the host's own /etc."""
    if _depth > 40:
        raise ImageBuildError(f"too many symlinks resolving {rel} in {root}")
    current = root
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    for i, part in enumerate(parts):
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        if candidate.is_symlink():
            target = os.readlink(candidate)
            rest = "/".join(parts[i + 1 :])
            base = "" if target.startswith("/") else str(current.relative_to(root))
            return resolve_in_root(root, f"{base}/{target}/{rest}", _depth + 1)
        current = candidate
    return current


def _write(root: Path, rel: str, content: str, mode: int = 0o644) -> None:
    path = resolve_in_root(root, rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    path.chmod(mode)


def _prepare_chroot(root: Path) -> None:
    """What the builds write after debootstrap, before apt runs."""
    # No daemons may start inside the build chroot (no init there; dbus would try).
    _write(root, "usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)
    _write(
        root,
        "etc/apt/apt.conf.d/90drums",
        'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n',
    )
    _write(
        root,
        "etc/dpkg/dpkg.cfg.d/90drums-nodoc",
        "path-exclude=/usr/share/doc/*\npath-include=/usr/share/doc/*/copyright\n"
        "path-exclude=/usr/share/man/*\npath-exclude=/usr/share/info/*\n",
    )


def _build_layer(profile: Profile, dest: Path, progress: Progress, debs: Path) -> None:
    """From the mirror by name (--mirror-fallback only): debootstrap + apt + pip + desktop user
    into `dest` (a fresh directory); downloaded .debs are kept in `debs` for the next build."""
    root = dest / "root"
    (debs / "partial").mkdir(parents=True, exist_ok=True)
    _run(
        ["debootstrap", "--variant=minbase", f"--cache-dir={debs}", SUITE, str(root), MIRROR],
        progress,
        f"debootstrap --variant=minbase {SUITE}",
    )
    _prepare_chroot(root)
    shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")
    packages = " ".join(sorted(set(profile.packages)))
    _run(
        _in_chroot(root, f"apt-get update -q && apt-get install -y -q {packages}", debs),
        progress,
        f"apt-get install {len(set(profile.packages))} packages",
    )
    if profile.pip:
        # pip inside the chroot trusts the host's CA bundle for this one command: hosts behind a
        # TLS-inspecting proxy add its CA there. The copy is removed right after.
        host_ca = Path("/etc/ssl/certs/ca-certificates.crt")
        cert = ""
        if host_ca.exists():
            shutil.copy2(host_ca, root / "tmp/drums-host-ca.crt")
            cert = "PIP_CERT=/tmp/drums-host-ca.crt"
        pip = " ".join(profile.pip)
        try:
            # setuptools comes from apt (python3-pip): sdists build without isolation.
            _run(
                _in_chroot(
                    root,
                    f"{cert} pip install -q --no-cache-dir --no-build-isolation --no-deps "
                    f"--break-system-packages --root-user-action=ignore {pip}",
                ),
                progress,
                f"pip install {pip}",
            )
        finally:
            (root / "tmp/drums-host-ca.crt").unlink(missing_ok=True)
    _finish_layer(profile, root, progress)


def _fetch(url: str, dest: Path, sha256: str, size: int | None) -> str | None:
    """Download `url` to `dest` unless it is there with `sha256`. Returns None, or "missing"
    when the server answers 404/410. A wrong hash or size is an error: nothing unverified is
    kept."""
    if dest.is_file() and (size is None or dest.stat().st_size == size):
        if _sha256_file(dest) == sha256:
            return None
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        with (
            urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response,
            tmp.open("wb") as out,
        ):
            shutil.copyfileobj(response, out, 1 << 20)
    except urllib.error.HTTPError as exc:
        tmp.unlink(missing_ok=True)
        if exc.code in (404, 410):
            return "missing"
        raise ImageBuildError(f"fetching {url}: HTTP {exc.code}; check the mirror") from exc
    except (urllib.error.URLError, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise ImageBuildError(f"fetching {url}: {exc}; check the network or the mirror") from exc
    got = _sha256_file(tmp)
    if got != sha256 or (size is not None and tmp.stat().st_size != size):
        tmp.unlink()
        raise ImageBuildError(
            f"{url} has sha256 {got}, the lock {sha256}: refusing it (a proxy or mirror serving "
            "other bytes); nothing was installed"
        )
    os.replace(tmp, dest)
    return None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_locked_debs(locked: ProfileLock, debs: Path, progress: Progress) -> list[LockedDeb]:
    """Every .deb of the lock into `debs` (by pool file name), each checked against its sha256
    and size; returns the ones the mirror no longer serves (404). Files already there with the
    locked hash are not fetched again."""
    debs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    progress(f"image: fetching {len(locked.debs)} locked .debs into {debs}")

    def one(deb: LockedDeb) -> str | None:
        return _fetch(f"{locked.mirror}/{deb.filename}", debs / deb.basename, deb.sha256, deb.size)

    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        results = list(pool.map(one, locked.debs))
    missing = [deb for deb, r in zip(locked.debs, results, strict=True) if r == "missing"]
    progress(
        f"image: {len(locked.debs) - len(missing)} locked .debs verified "
        f"({time.monotonic() - started:.1f} s), {len(missing)} not served"
    )
    return missing


def _write_local_repo(locked: ProfileLock, repo: Path, debs: Path) -> None:
    """A repository of exactly the lock's .debs (hard links into the fetch cache) and index."""
    for deb in locked.debs:
        target = repo / deb.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(debs / deb.basename, target)
    dist = repo / "dists" / locked.suite
    index = dist / locked.component / f"binary-{locked.arch}"
    index.mkdir(parents=True, exist_ok=True)
    (index / "Packages").write_text(locked.packages_index)
    (dist / "Release").write_text(
        release_text(locked.suite, locked.component, locked.arch, locked.packages_index)
    )


def _build_layer_locked(
    profile: Profile, locked: ProfileLock, dest: Path, progress: Progress, debs: Path
) -> None:
    """From the lock: debootstrap and apt against a local repository of only the locked .debs
    (fetched and verified by fetch_locked_debs into `debs`), pip from the locked files, then the
    desktop user, files and setup; fails unless dpkg lists exactly the lock's packages."""
    root = dest / "root"
    repo = dest / "repo"
    _write_local_repo(locked, repo, debs)
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            "--no-check-gpg",  # the repository is the lock's verified files
            f"--arch={locked.arch}",
            locked.suite,
            str(root),
            f"file://{repo}",
        ],
        progress,
        f"debootstrap --variant=minbase {locked.suite} (from the lock)",
    )
    _prepare_chroot(root)
    (root / "drums-repo").mkdir()
    sources = root / "etc/apt/sources.list"
    sources.write_text(f"deb [trusted=yes] file:/drums-repo {locked.suite} {locked.component}\n")
    _run(
        _in_chroot(
            root,
            f"apt-get update -q && apt-get install -y -q {' '.join(locked.packages)}",
            repo=repo,
        ),
        progress,
        f"apt-get install {len(locked.packages)} packages (from the lock)",
    )
    # The sources an image built from the mirror has (debootstrap writes the mirror it used).
    sources.write_text(f"deb {locked.mirror} {locked.suite} {locked.component}\n")
    (root / "drums-repo").rmdir()
    if locked.pip_files:
        wheels = root / "tmp/drums-pip"
        wheels.mkdir()
        for pin in locked.pip_files:
            if _fetch(pin.url, wheels / pin.basename, pin.sha256, None) == "missing":
                raise ImageBuildError(
                    f"PyPI no longer serves {pin.url} ({pin.name} {pin.version}) of the image "
                    "lock: refresh the lock (PYTHONPATH=drumsd/src .venv/bin/python "
                    "nix/lock_images.py)"
                )
        try:
            _run(
                _in_chroot(
                    root,
                    "pip install -q --no-cache-dir --no-index --no-build-isolation --no-deps "
                    "--break-system-packages --root-user-action=ignore /tmp/drums-pip/*",
                ),
                progress,
                f"pip install {len(locked.pip_files)} locked files",
            )
        finally:
            shutil.rmtree(wheels, ignore_errors=True)
    diff = manifest_diff(
        installed_packages((root / "var/lib/dpkg/status").read_text()), locked.manifest()
    )
    if diff:
        raise ImageBuildError(
            f"the {profile.name} image's packages differ from the lock ({len(diff)}):\n"
            + "\n".join(diff[:20])
        )
    progress(f"image: dpkg lists exactly the lock's {len(locked.debs)} packages")
    shutil.rmtree(repo)
    _finish_layer(profile, root, progress)


def _finish_layer(profile: Profile, root: Path, progress: Progress) -> None:
    """The desktop user, cleanup, the profile's files and setup script."""
    user_script = (
        f"useradd --create-home --home-dir /home/{DESKTOP_USER} --uid {DESKTOP_UID} "
        f"--user-group --shell /bin/bash {DESKTOP_USER}; "
        f"echo '{DESKTOP_USER}:{DESKTOP_PASSWORD}' | chpasswd; "
        f"for d in Desktop Documents Downloads Pictures Music Videos .config .cache; do "
        f"install -d -o {DESKTOP_UID} -g {DESKTOP_UID} /home/{DESKTOP_USER}/$d; done; "
        "apt-get clean; rm -rf /var/lib/apt/lists/* /var/log/*.log /var/log/apt/* "
        "/var/cache/debconf/*-old /var/lib/dpkg/*-old; "
        "find / -xdev -name __pycache__ -type d -prune -exec rm -rf {} +"
    )
    _run(_in_chroot(root, user_script), progress, f"desktop user {DESKTOP_USER} and cleanup")
    for rel, (mode, content) in profile.files.items():
        _write(root, rel, content, mode)
    if profile.setup:
        _run(_in_chroot(root, profile.setup), progress, f"{profile.name} setup")
    _write(root, "etc/resolv.conf", "")  # the slot has no network; no host resolver leaks in
    _write(root, "etc/hostname", "drums\n")
    _write(root, "etc/machine-id", "")
    (root / "usr/sbin/policy-rc.d").unlink()


# The layer drops apt's __pycache__ dirs, and a slot's user cannot write any under /usr: without
# pycs every python3 a task's setup or check starts compiles its imports from source, each time
# (office image: `import zipfile` 80 ms of CPU against 10 ms, `urllib.request` 140 against 30).
# Run by the image's own python3 in the image (its magic number, its paths); timestamp pycs, as
# the sources keep their package mtimes in every layer and slot.
_COMPILE_PYTHON = """\
import compileall, sys
for d in sys.argv[1:]:
    compileall.compile_dir(d, quiet=2)
"""
_PYTHON_DIRS = ("usr/lib/python3*", "usr/local/lib/python3*", GUEST_DIR_IN_IMAGE)


def _compile_python(root: Path, progress: Progress) -> int:
    """Byte-compile the image's Python modules (stdlib, dist-packages, the guest) in place;
    returns how many .pyc files they then hold. New files only: the layer's hard-linked files
    are never written."""
    dirs = sorted({p.relative_to(root) for pattern in _PYTHON_DIRS for p in root.glob(pattern)})
    script = f"python3 -c {shlex.quote(_COMPILE_PYTHON)} " + " ".join(
        shlex.quote(f"/{d}") for d in dirs
    )
    _run(_in_chroot(root, script), progress, "byte-compile the image's Python modules")
    return sum(1 for d in dirs for _ in (root / d).rglob("*.pyc"))


def minimal_dev(dev: Path) -> list[str]:
    """Leave in the image's /dev only the device nodes a slot may open (mounts.DEVICES, which a
    slot in a user namespace uses as they are, since it cannot mknod) and make ptmx the slot's own
    devpts instance's. Any other node (console, a disk) would open the host's device from inside
    the slot. Returns the names removed. Unlinking is safe on the hard-linked package layer."""
    allowed = {(name, major, minor) for name, major, minor in DEVICES}
    removed: list[str] = []
    for path in sorted(dev.rglob("*"), reverse=True):
        st = path.lstat()
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            continue
        rel = str(path.relative_to(dev))
        node = (rel, os.major(st.st_rdev), os.minor(st.st_rdev))
        if stat.S_ISCHR(st.st_mode) and node in allowed:
            continue
        path.unlink()
        removed.append(rel)
    ptmx = dev / "ptmx"
    if dev.is_dir() and not ptmx.is_symlink() and not ptmx.exists():
        ptmx.symlink_to("pts/ptmx")
    return removed


def _install_guest(root: Path, source_dir: Path) -> None:
    """Copy the guest package into the image and write its entry points."""
    target = root / GUEST_DIR_IN_IMAGE
    if target.exists():
        shutil.rmtree(target)
    pkg = target / "drums_guest"
    shutil.copytree(source_dir, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for entry, module in (("desktop-init", "init"), ("agent", "agent"), ("worker", "worker")):
        _write(
            target,
            entry,
            "#!/usr/bin/python3 -I\n"
            "# drums guest entry point (generated by drumsd.linux.image).\n"
            "import sys\n"
            f"sys.path.insert(0, '/{GUEST_DIR_IN_IMAGE}')\n"
            f"from drums_guest.{module} import main\n"
            "sys.exit(main())\n",
            0o755,
        )
    for path in [target, *target.rglob("*")]:
        os.chown(path, 0, 0, follow_symlinks=False)
        if path.is_dir():
            path.chmod(0o755)
        elif path.name not in ("desktop-init", "agent", "worker"):
            path.chmod(0o644)


def build_image(
    profile: str,
    cache_root: Path,
    progress: Progress = print,
    guest_source: Path = GUEST_SOURCE_DIR,
    *,
    mirror_fallback: bool = False,
    lock_file: Path = LOCK_FILE,
) -> ImageInfo:
    """Build (or find in the cache) the image of `profile` and return where it is and its hash.

    The packages are the lock's (`lock_file`). When the lock cannot build it (a recipe changed
    without a refreshed lock, another architecture, .debs the mirror no longer serves) the build
    fails saying so, unless `mirror_fallback`: then it installs from the mirror by name, warns
    loudly, and image.json says `packages_from: mirror` (the lock tests fail on such an image)."""
    if profile not in PROFILES:
        raise ImageBuildError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    prof = PROFILES[profile]
    images = cache_root / "images"
    locked: ProfileLock | None
    try:
        locked = load_profile_lock(prof, lock_file)
    except ImageBuildError as exc:
        if not mirror_fallback:
            raise
        _warn_fallback(progress, str(exc))
        locked = None
    lkey = layer_key(prof, locked)
    layer = images / "layers" / lkey
    debs = images / "layers" / "apt-archives"
    if locked is not None and not (layer / "layer.json").exists():
        # Fetched before the layer's key is final: a lock the mirror no longer serves falls
        # back (when asked) to the mirror's layer, whose key has no lock digest.
        debs.parent.mkdir(parents=True, exist_ok=True)
        with _locked(debs.parent / ".apt-archives.lock"):
            missing = fetch_locked_debs(locked, debs, progress)
        if missing:
            message = missing_debs_message(missing, locked.mirror)
            if not mirror_fallback:
                raise LockedDebsMissing(message)
            _warn_fallback(progress, message)
            locked = None
            lkey = layer_key(prof)
            layer = images / "layers" / lkey
    gkey = guest_sources_hash(guest_source)
    ikey = image_key(lkey, gkey)
    final = images / f"{profile}-{ikey}"
    meta_path = final / "image.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        progress(f"image: {profile} is cached at {final} (sha256 {meta['sha256'][:16]}...)")
        if read_app_manifest(final) is None:  # built before images recorded their apps
            _record_apps(final, profile, progress)
        _point_current(images, profile, final)
        return _info(final, meta)

    started = time.monotonic()
    layer.parent.mkdir(parents=True, exist_ok=True)
    with _locked(layer.parent / f".{lkey}.lock"):
        if (layer / "layer.json").exists():
            progress(f"image: package layer {lkey} is cached")
        else:
            _build_layer_cached(prof, lkey, layer, progress, locked)
    with _locked(images / f".{profile}-{ikey}.lock"):
        if meta_path.exists():  # another builder finished it while we waited
            meta = json.loads(meta_path.read_text())
        else:
            meta = _assemble(prof, lkey, gkey, ikey, layer, final, guest_source, progress, locked)
    _point_current(images, profile, final)
    progress(f"image: {profile} ready at {final}/root in {time.monotonic() - started:.1f} s")
    return _info(final, meta)


def _warn_fallback(progress: Progress, why: str) -> None:
    bar = "!" * 78
    progress(
        f"image: {bar}\nimage: NOT FROM THE LOCK: building from {MIRROR} by name "
        f"(--mirror-fallback).\nimage: {why}\nimage: the image will not be the Nix image's "
        f"packages, and the lock tests fail on it until the lock is refreshed.\nimage: {bar}"
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder per key at a time (two `image build` runs, or a build and `host prepare`).
    Holding the lock also means any staging dir of this key is a leftover of a dead build."""
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        for stale in path.parent.glob(path.name.removesuffix(".lock") + ".*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        yield


def _build_layer_cached(
    prof: Profile, lkey: str, layer: Path, progress: Progress, locked: ProfileLock | None
) -> None:
    started = time.monotonic()
    progress(
        f"image: building package layer {lkey} for {prof.name} ({len(set(prof.packages))} packages)"
    )
    staging = Path(tempfile.mkdtemp(prefix=f".{lkey}.", dir=layer.parent))
    staging.chmod(0o755)  # mkdtemp makes 0700; unprivileged mount helpers must traverse it
    try:
        # One layer build at a time per cache: apt locks its (shared) archive directory.
        with _locked(layer.parent / ".apt-archives.lock"):
            debs = layer.parent / "apt-archives"
            if locked is None:
                _build_layer(prof, staging, progress, debs)
            else:
                fetch_locked_debs(locked, debs, progress)  # all verified and cached by now
                _build_layer_locked(prof, locked, staging, progress, debs)
        layer_meta = {
            "key": lkey,
            "profile": prof.name,
            **_source_meta(locked),
            "packages": sorted(set(prof.packages)),
            "pip": list(prof.pip),
            "built_at": _now(),
            "seconds": round(time.monotonic() - started, 1),
        }
        (staging / "layer.json").write_text(json.dumps(layer_meta, indent=2) + "\n")
        if layer.exists():
            shutil.rmtree(layer)
        os.replace(staging, layer)
    except BaseException:
        progress(f"image: layer build failed; removing {staging}")
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _assemble(
    prof: Profile,
    lkey: str,
    gkey: str,
    ikey: str,
    layer: Path,
    final: Path,
    guest_source: Path,
    progress: Progress,
    locked: ProfileLock | None = None,
) -> dict:
    """Final image = package layer (hard links) + guest files, hashed, moved into place."""
    progress(f"image: assembling {final.name} (layer {lkey} + guest {gkey[:12]})")
    staging = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=final.parent))
    staging.chmod(0o755)
    try:
        # Hard links: instant and space-free; safe because images are read-only lower layers.
        _run(
            ["cp", "-al", str(layer / "root"), str(staging / "root")],
            progress,
            "link package layer",
        )
        _install_guest(staging / "root", guest_source)
        compiled = _compile_python(staging / "root", progress)
        progress(f"image: {compiled} .pyc files in the image")
        removed = minimal_dev(staging / "root" / "dev")
        progress(
            f"image: /dev reduced to the minimal nodes (removed {', '.join(removed) or 'none'})"
        )
        progress("image: hashing the tree (manifest)")
        t0 = time.monotonic()
        sha = write_manifest(staging / "root", staging / "manifest.tsv")
        progress(f"image: sha256 {sha} ({time.monotonic() - t0:.1f} s)")
        meta = {
            "profile": prof.name,
            "key": ikey,
            "sha256": sha,
            "layer_key": lkey,
            "guest_sha256": gkey,
            "builder_version": BUILDER_VERSION,
            "suite": SUITE,
            **_source_meta(locked),
            "packages": sorted(set(prof.packages)),
            "pip": list(prof.pip),
            "built_at": _now(),
        }
        (staging / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
        _record_apps(staging, prof.name, progress)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def _source_meta(locked: ProfileLock | None) -> dict:
    """Where the packages came from, for image.json and layer.json."""
    if locked is None:
        return {"packages_from": "mirror"}
    return {"packages_from": "lock", "lock_sha256": locked.digest, "arch": locked.arch}


def _record_apps(image_dir: Path, profile: str, progress: Progress) -> None:
    """apps.json next to the root: which apps the tree has, for the task support check. Outside
    the root, so the image's sha256 does not change."""
    manifest = probe_apps(image_dir / "root", profile)
    write_app_manifest(image_dir, manifest)
    missing = sorted(set(APPS) - manifest.apps)
    progress(
        f"image: {profile} has {', '.join(sorted(manifest.apps)) or 'no known apps'}; "
        f"lacks {', '.join(missing) or 'nothing'} ({len(manifest.schemas)} GSettings schemas)"
    )


def _point_current(images: Path, profile: str, final: Path) -> None:
    """images/<profile> -> the newest build, for configs that name a profile, not a hash."""
    link = images / profile
    if link.is_symlink() and os.readlink(link) == final.name:
        return
    tmp = images / f".{profile}.link.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(final.name)
    os.replace(tmp, link)


def _info(final: Path, meta: dict) -> ImageInfo:
    return ImageInfo(
        profile=meta["profile"],
        root=final / "root",
        sha256=meta["sha256"],
        key=meta["key"],
        manifest=final / "manifest.tsv",
        meta=final / "image.json",
    )


def find_image(profile_or_dir: str, cache_root: Path) -> ImageInfo:
    """Resolve a profile name (via images/<profile>) or an image directory to its ImageInfo."""
    candidate = Path(profile_or_dir)
    if not candidate.is_absolute():
        candidate = cache_root / "images" / profile_or_dir
    meta_path = candidate.resolve() / "image.json"
    if not meta_path.exists():
        raise ImageBuildError(
            f"no built image at {candidate}; run `drumsd image build --profile {profile_or_dir}`"
        )
    return _info(candidate.resolve(), json.loads(meta_path.read_text()))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def prune_images(cache_root: Path, progress: Progress = print, dry_run: bool = False) -> list[Path]:
    """Remove image builds no profile link points to, and layers no kept image uses.

    A tree that appears in the mount table (the lower layer of a running slot, an idmapped bind
    of it) is kept. Checkpoints of a removed image can no longer be restored: run this
    deliberately, not from the daemon."""
    images = cache_root / "images"
    if not images.is_dir():
        return []
    kept = {(images / p).resolve() for p in PROFILES if (images / p).is_symlink()}
    mounted = _read_text("/proc/self/mountinfo")
    removed: list[Path] = []
    kept_layers = set()
    for final in sorted(images.iterdir()):
        meta = final / "image.json"
        if final.is_symlink() or not meta.exists():
            continue
        if final.resolve() in kept or str(final) in mounted:
            kept_layers.add(json.loads(meta.read_text()).get("layer_key"))
            continue
        removed.append(final)
    for layer in sorted((images / "layers").glob("*/layer.json")):
        if layer.parent.name not in kept_layers and str(layer.parent) not in mounted:
            removed.append(layer.parent)
    for path in removed:
        progress(f"image: {'would remove' if dry_run else 'removing'} {path}")
        if not dry_run:
            shutil.rmtree(path)
    return removed


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
