"""Host preparation: build the pinned CRIU and the desktop images, idempotently and cached.

Debian 12's own criu (3.17) fails on current kernels and 4.1 cannot dump sockets on Linux >= 6.16,
so drums builds CRIU 4.2.1 from Debian sid's source tarball, pinned by sha256, with one patch of its
own (criu-track-mem-uffd-wp.patch, beside this module). Everything lands under a cache root
(default /var/cache/drums) keyed by content, so a second run is a no-op.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from drumsd.linux.criu import KDAT_DIR

Progress = Callable[[str], None]

DEFAULT_CACHE_ROOT = Path("/var/cache/drums")
CRIU_LINK = Path("/usr/local/sbin/criu")

CRIU_VERSION = "4.2.1"
CRIU_TARBALL = f"criu_{CRIU_VERSION}.orig.tar.xz"
CRIU_SHA256 = "29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9"
# Used only when `apt-get source` cannot fetch it (the hash pins the content either way).
CRIU_POOL_URL = f"http://deb.debian.org/debian/pool/main/c/criu/{CRIU_TARBALL}"
# drums' one patch to CRIU (nix/criu.nix applies the same file): `criu dump --track-mem-uffd-wp`
# makes incremental dumps from userfaultfd write-protect bits where the kernel has no soft-dirty.
# Part of the package, so the wheel ships it; its hash is part of the install dir's name.
CRIU_PATCH = Path(__file__).with_name("criu-track-mem-uffd-wp.patch")
# Its kerndat cache on a tmpfs whatever /run is (criu.KDAT_DIR; nix/criu.nix sets the same).
CRIU_MAKE_VARS = (f"RUNDIR={KDAT_DIR}",)

# Packages needed to build CRIU (from the measured recipe in shared/notes/criu-desktop.md).
CRIU_BUILD_DEPS: tuple[str, ...] = (
    "build-essential",
    "libprotobuf-c-dev",
    "libprotobuf-dev",  # descriptor.proto, found through pkg-config protobuf
    "protobuf-c-compiler",
    "protobuf-compiler",
    "python3-protobuf",
    "libnl-3-dev",
    "libnet1-dev",
    "libcap-dev",
    "libbsd-dev",
    "libgnutls28-dev",
    "uuid-dev",
    "pkg-config",
    "libnftables-dev",
    "libaio-dev",
    "patch",  # applies CRIU_PATCH
)

# What the daemon itself calls on the host (besides CRIU).
HOST_RUNTIME_PACKAGES: tuple[str, ...] = (
    "debootstrap",
    "iproute2",
    "util-linux",
    "xz-utils",
    "zstd",
    "ca-certificates",
    "procps",
    "lxcfs",  # the per-slot /proc view (config procview_dir)
)

# A source-only entry: `deb-src` never offers binary packages, so nothing on the host can be
# upgraded to sid by it; it only makes `apt-get source criu/sid` resolvable.
SID_SRC_LIST = Path("/etc/apt/sources.list.d/drums-sid-src.sources")
SID_SRC_ENTRY = """\
# Added by drums host preparation: source packages only (for CRIU 4.2.1), never binaries.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


class HostPrepError(RuntimeError):
    """A host preparation step failed; the message says which and what to do next."""


def criu_build_key(patch: bytes, make_vars: tuple[str, ...] = CRIU_MAKE_VARS) -> str:
    """The name of a build's install dir: CRIU's version, its tarball's hash and the hash of
    the patch and the make variables, so a host whose build predates a change to any of them
    builds again (the old dir stays)."""
    built_with = patch + b"".join(b"\0" + v.encode() for v in make_vars)
    return f"{CRIU_VERSION}-{CRIU_SHA256[:12]}-{hashlib.sha256(built_with).hexdigest()[:8]}"


@dataclass(frozen=True)
class CriuPaths:
    """Where one pinned, patched CRIU build lives under the cache root."""

    cache_root: Path
    build_key: str  # criu_build_key of the patch the build applies

    @classmethod
    def for_patch(cls, cache_root: Path, patch: Path = CRIU_PATCH) -> CriuPaths:
        return cls(cache_root, criu_build_key(read_patch(patch)))

    @property
    def base(self) -> Path:
        return self.cache_root / "criu"

    @property
    def install_dir(self) -> Path:
        return self.base / self.build_key

    @property
    def binary(self) -> Path:
        return self.install_dir / "criu"

    @property
    def tarball(self) -> Path:
        return self.base / "src" / CRIU_TARBALL


def read_patch(patch: Path) -> bytes:
    try:
        return patch.read_bytes()
    except FileNotFoundError:
        raise HostPrepError(
            f"{patch} is missing: drumsd's package ships CRIU's patch beside hostprep.py. "
            "Reinstall drumsd (from a wheel or the repository, not a copy of the .py files)."
        ) from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run(
    argv: Sequence[str],
    progress: Progress,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    quiet: bool = True,
) -> None:
    """Run a command; on failure raise with its tail of output so the operator sees why."""
    progress(f"$ {' '.join(argv)}")
    proc = subprocess.run(
        list(argv),
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE if quiet else None,
        stderr=subprocess.STDOUT if quiet else None,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout or "").splitlines()[-30:])
        raise HostPrepError(f"command failed (rc={proc.returncode}): {' '.join(argv)}\n{tail}")


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def missing_packages(packages: Sequence[str]) -> list[str]:
    """Packages from the list that dpkg does not report as installed."""
    missing = []
    for name in packages:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True
        )
        if proc.returncode != 0 or "install ok installed" not in proc.stdout:
            missing.append(name)
    return missing


def ensure_apt_packages(packages: Sequence[str], progress: Progress = print) -> None:
    """Install what is missing; a host that already has everything is not touched."""
    missing = missing_packages(packages)
    if not missing:
        return
    progress(f"apt: installing {len(missing)} package(s): {' '.join(missing)}")
    env = _apt_env()
    _run(["apt-get", "update", "-q"], progress, env=env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], progress, env=env)


def _ensure_sid_source_entry(progress: Progress) -> bool:
    """Write the deb-src entry for sid if absent; True if it was added (apt needs an update)."""
    if SID_SRC_LIST.exists() and SID_SRC_LIST.read_text() == SID_SRC_ENTRY:
        return False
    progress(f"apt: adding source-only entry for sid at {SID_SRC_LIST}")
    SID_SRC_LIST.write_text(SID_SRC_ENTRY)
    return True


def _fetch_tarball(paths: CriuPaths, progress: Progress) -> Path:
    """Get the pinned orig tarball into the cache, via apt-get source, else from the pool."""
    tarball = paths.tarball
    if tarball.exists() and sha256_file(tarball) == CRIU_SHA256:
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    try:
        added = _ensure_sid_source_entry(progress)
        if added or not _apt_knows_sid_criu():
            _run(["apt-get", "update", "-q"], progress, env=_apt_env())
        with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
            _run(
                ["apt-get", "source", "--download-only", "-q", "criu/sid"],
                progress,
                cwd=Path(tmp),
                env=_apt_env(),
            )
            fetched = Path(tmp) / CRIU_TARBALL
            if not fetched.exists():
                raise HostPrepError(
                    f"apt-get source did not fetch {CRIU_TARBALL} (sid may have moved past "
                    f"{CRIU_VERSION}); falling back to {CRIU_POOL_URL}"
                )
            os.replace(fetched, tarball)
    except HostPrepError as exc:
        progress(f"criu: {exc}".splitlines()[0])
        progress(f"criu: downloading {CRIU_POOL_URL}")
        partial = tarball.with_suffix(".part")
        with urllib.request.urlopen(CRIU_POOL_URL, timeout=60) as resp, partial.open("wb") as f:
            shutil.copyfileobj(resp, f)
        os.replace(partial, tarball)
    actual = sha256_file(tarball)
    if actual != CRIU_SHA256:
        bad = tarball.with_suffix(".rejected")
        os.replace(tarball, bad)
        raise HostPrepError(
            f"{CRIU_TARBALL} has sha256 {actual}, expected {CRIU_SHA256}; moved it to {bad}. "
            "Check the mirror, or update CRIU_SHA256 after verifying sid's .dsc by hand."
        )
    progress(f"criu: {CRIU_TARBALL} verified (sha256 {CRIU_SHA256[:12]}...)")
    return tarball


def _apt_knows_sid_criu() -> bool:
    proc = subprocess.run(["apt-cache", "showsrc", "criu"], capture_output=True, text=True)
    return f"Version: {CRIU_VERSION}" in proc.stdout


def _link_is(link: Path, target: Path) -> bool:
    return link.is_symlink() and os.readlink(link) == str(target)


def _point_link(link: Path, target: Path) -> None:
    """Atomically (re)point a symlink: a concurrent reader sees the old or the new target."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _apply_patch(srcdir: Path, patch: Path, progress: Progress) -> None:
    """Apply drums' patch to the unpacked tree; one that does not apply stops the build, leaving
    the installed CRIU and its link as they were."""
    progress(f"criu: applying {patch.name}")
    try:
        _run(
            ["patch", "-p1", "--forward", "--batch", "-d", str(srcdir), "-i", str(patch)],
            progress,
        )
    except HostPrepError as exc:
        raise HostPrepError(
            f"{patch} does not apply to CRIU {CRIU_VERSION} ({CRIU_TARBALL}); nothing was "
            f"installed. If CRIU_VERSION or CRIU_SHA256 changed, remake the patch against the "
            f"new tree (unpack the tarball and run `patch -p1 --dry-run -i {patch}` in it to see "
            f"the failing hunks); otherwise the packaged patch is damaged: reinstall drumsd.\n"
            f"{exc}"
        ) from exc


def ensure_criu(
    cache_root: Path = DEFAULT_CACHE_ROOT,
    progress: Progress = print,
    link: Path = CRIU_LINK,
    patch: Path = CRIU_PATCH,
) -> Path:
    """Return the path of the pinned CRIU binary, building and linking it only if needed.

    The binary lives at <cache_root>/criu/<version>-<sha12>-<patch sha8>/criu (criu_build_key)
    and `link` points at it. A host that already has both is left untouched (reading the patch
    and a few stat calls).
    """
    paths = CriuPaths.for_patch(cache_root, patch)
    binary = paths.binary
    if binary.is_file() and os.access(binary, os.X_OK):
        if not _link_is(link, binary):
            _point_link(link, binary)
            progress(f"criu: linked {link} -> {binary}")
        return binary

    started = time.monotonic()
    progress(f"criu: building {CRIU_VERSION} with {patch.name} into {paths.install_dir}")
    ensure_apt_packages(CRIU_BUILD_DEPS, progress)
    tarball = _fetch_tarball(paths, progress)
    build_root = paths.base / "build"
    build_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=build_root) as tmp:
        progress(f"criu: unpacking {tarball.name}")
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="tar")
        (srcdir,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        _apply_patch(srcdir, patch, progress)
        jobs = str(max(1, min(os.cpu_count() or 1, 8)))
        progress(f"criu: make -j{jobs} criu (about 20 s on 2 cores)")
        _run(["make", f"-j{jobs}", "criu", *CRIU_MAKE_VARS], progress, cwd=srcdir)
        built = srcdir / "criu" / "criu"
        if not built.is_file():
            raise HostPrepError(f"make finished but {built} is missing; see the build output")
        paths.install_dir.mkdir(parents=True, exist_ok=True)
        staged = paths.install_dir / ".criu.new"
        shutil.copy2(built, staged)
        staged.chmod(0o755)
        os.replace(staged, binary)
    _point_link(link, binary)
    progress(f"criu: installed {binary} and linked {link} ({time.monotonic() - started:.1f} s)")
    return binary


def criu_check(binary: Path) -> tuple[bool, str]:
    """Run `criu check`; True with its output when the kernel supports what drums needs."""
    proc = subprocess.run([str(binary), "check"], capture_output=True, text=True, timeout=60)
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0 and "Looks good" in out, out


def prepare_host(
    profile: str = "base",
    cache_root: Path = DEFAULT_CACHE_ROOT,
    progress: Progress = print,
    build_images: bool = True,
    mirror_fallback: bool = False,
) -> None:
    """Everything a host needs before `drumsd serve`: packages, CRIU, the desktop image."""
    started = time.monotonic()
    progress("host: checking apt packages")
    ensure_apt_packages((*HOST_RUNTIME_PACKAGES, *CRIU_BUILD_DEPS), progress)
    binary = ensure_criu(cache_root, progress)
    ok, out = criu_check(binary)
    progress(f"criu: check {'passed' if ok else 'FAILED'}: {out.splitlines()[-1] if out else ''}")
    if not ok:
        raise HostPrepError(f"`{binary} check` failed:\n{out}\nRun `drumsd doctor` for details.")
    if build_images:
        from drumsd.linux.image import build_image

        info = build_image(profile, cache_root, progress=progress, mirror_fallback=mirror_fallback)
        progress(f"image: {info.profile} at {info.root} sha256 {info.sha256}")
    progress(f"host: ready ({time.monotonic() - started:.1f} s)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m drumsd.linux.hostprep",
        description="Prepare this host for drumsd: CRIU 4.2.1 and a desktop image.",
    )
    parser.add_argument("--profile", default="base", help="image profile to build (base, office)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE_ROOT,
        help="cache root (default /var/cache/drums)",
    )
    parser.add_argument("--criu-only", action="store_true", help="build CRIU but no image")
    parser.add_argument(
        "--mirror-fallback",
        action="store_true",
        help="when the image lock cannot build the profile (a point release), build from the "
        "mirror by name, loudly (the lock tests then fail)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("host preparation needs root (apt, debootstrap, /usr/local/sbin)", file=sys.stderr)
        return 2
    try:
        prepare_host(
            args.profile,
            args.cache,
            build_images=not args.criu_only,
            mirror_fallback=args.mirror_fallback,
            progress=lambda m: print(m, flush=True),
        )
    except HostPrepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
