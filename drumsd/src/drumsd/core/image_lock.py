"""The Debian package lock of the desktop images (`images.lock.json`, written by
nix/lock_images.py): what one profile installs on one architecture, the local repository index
that serves exactly those .debs, and the digest of it all that goes into the image's cache key.

`drumsd image build` and the Nix images (nix/debian-image.nix) both install from this lock, so
both give the same packages. Pure: the effects (fetching, debootstrap, apt) are drumsd.linux.image.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

# The command that rewrites the lock from today's mirror (run from a checkout).
REFRESH = "PYTHONPATH=drumsd/src .venv/bin/python nix/lock_images.py"

# dpkg's architecture names for the machines the lock covers.
DPKG_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}

# Kept once at the top of each .deb's entry; the index stanza is these plus its `control`.
_TOP_LEVEL = ("Package", "Version", "Architecture", "Filename", "Size", "SHA256")


class LockError(ValueError):
    """The lock cannot build this profile as the recipe says; the message says what to do."""


@dataclass(frozen=True)
class LockedDeb:
    name: str
    version: str
    architecture: str
    filename: str  # pool path under the mirror
    size: int
    sha256: str

    @property
    def basename(self) -> str:
        return self.filename.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class LockedPip:
    name: str
    version: str
    url: str
    sha256: str

    @property
    def basename(self) -> str:
        # pip reads a wheel's tags from its file name: the file keeps the URL's.
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ProfileLock:
    """Everything of the lock one profile's build on one architecture reads."""

    profile: str
    arch: str
    suite: str
    mirror: str
    component: str
    packages: tuple[str, ...]
    debs: tuple[LockedDeb, ...]
    pip_files: tuple[LockedPip, ...]
    packages_index: str
    digest: str  # sha256 of what this build installs: part of the image's cache key

    def manifest(self) -> dict[str, tuple[str, str]]:
        """name -> (version, architecture): what dpkg must list once installed."""
        return {d.name: (d.version, d.architecture) for d in self.debs}


def index_stanza(name: str, entry: dict[str, Any]) -> str:
    """One locked .deb as a Packages stanza (nix/debian-lock.nix writes the same, in Nix)."""
    fields = {
        "Package": name,
        **dict(sorted(entry["control"].items())),
        "Version": entry["version"],
        "Architecture": entry["architecture"],
        "Filename": entry["filename"],
        "Size": str(entry["size"]),
        "SHA256": entry["sha256"],
    }
    return "".join(f"{k}: {v}\n" for k, v in fields.items())


def release_text(suite: str, component: str, arch: str, packages_index: str) -> str:
    """The Release file of a local repository serving `packages_index` (unsigned: the .debs are
    checked against the lock's sha256 before they go into it)."""
    data = packages_index.encode()
    digest = hashlib.sha256(data).hexdigest()
    return (
        f"Suite: {suite}\nCodename: {suite}\nArchitectures: {arch}\nComponents: {component}\n"
        f"SHA256:\n {digest} {len(data)} {component}/binary-{arch}/Packages\n"
    )


def recipe_of(profile: Any) -> dict[str, Any]:
    """What of a drumsd image profile the lock records besides the packages (as
    nix/lock_images.py writes it)."""
    return {
        "packages": sorted(set(profile.packages)),
        "pip": list(profile.pip),
        "files": {
            path: {"mode": f"{mode:o}", "text": text}
            for path, (mode, text) in profile.files.items()
        },
        "setup": profile.setup,
    }


def profile_lock(
    lock: dict[str, Any], profile: Any, arch: str, common: dict[str, Any]
) -> ProfileLock:
    """The lock of `profile` (a drumsd Profile) on `arch`, after checking the lock was written
    from this very recipe (`common`: builder version, suite, mirror, user, devices). A recipe
    changed without refreshing the lock is refused: the lock would install something else."""
    name = profile.name
    stale = f"refresh it ({REFRESH}) and rebuild"
    for key, want in common.items():
        if lock.get(key) != want:
            raise LockError(
                f"the image lock's {key} is {lock.get(key)!r}, the builder's {want!r}: {stale}"
            )
    recipe = lock.get("profiles", {}).get(name)
    if recipe is None:
        raise LockError(f"the image lock has no profile {name!r}: {stale}")
    mine = recipe_of(profile)
    changed = [k for k, v in mine.items() if recipe.get(k) != v]
    if changed:
        raise LockError(
            f"profile {name}'s {', '.join(changed)} changed since the image lock was written: "
            f"{stale}"
        )
    closure = recipe.get("closure", {}).get(arch)
    index = lock.get("debs", {}).get(arch)
    if closure is None or index is None:
        raise LockError(
            f"the image lock has no {arch} packages for {name}: "
            f"{REFRESH} --arch {arch} (it has {sorted(recipe.get('closure', {}))})"
        )
    names = sorted(set(closure["bootstrap"]) | set(closure["apt"]))
    missing = [n for n in names if n not in index]
    if missing:
        raise LockError(f"the image lock's {arch} index lacks {missing[:5]}: {stale}")
    debs = tuple(
        LockedDeb(
            name=n,
            version=index[n]["version"],
            architecture=index[n]["architecture"],
            filename=index[n]["filename"],
            size=int(index[n]["size"]),
            sha256=index[n]["sha256"],
        )
        for n in names
    )
    pip_files = tuple(
        LockedPip(name=p["name"], version=p["version"], url=p["url"], sha256=p["sha256"])
        for p in recipe.get("pip_files", [])
    )
    packages_index = "\n".join(index_stanza(n, index[n]) for n in names) + "\n"
    spec = {
        "common": {k: lock.get(k) for k in sorted(common)},
        "component": lock.get("component", "main"),
        "recipe": mine,
        "index": packages_index,
        "pip_files": [[p.url, p.sha256] for p in pip_files],
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return ProfileLock(
        profile=name,
        arch=arch,
        suite=lock["suite"],
        mirror=lock["mirror"],
        component=lock.get("component", "main"),
        packages=tuple(mine["packages"]),
        debs=debs,
        pip_files=pip_files,
        packages_index=packages_index,
        digest=digest,
    )


def manifest_diff(
    installed: dict[str, tuple[str, str]], wanted: dict[str, tuple[str, str]]
) -> list[str]:
    """Lines saying how dpkg's list differs from the lock (empty when it is the lock)."""
    lines = [f"only in the image: {n} {installed[n][0]}" for n in sorted(installed.keys() - wanted)]
    lines += [f"only in the lock: {n} {wanted[n][0]}" for n in sorted(wanted.keys() - installed)]
    lines += [
        f"{n}: image {installed[n][0]} ({installed[n][1]}), lock {wanted[n][0]} ({wanted[n][1]})"
        for n in sorted(installed.keys() & wanted.keys())
        if installed[n] != wanted[n]
    ]
    return lines


def missing_debs_message(missing: list[LockedDeb], mirror: str) -> str:
    """What to say when the mirror no longer serves locked .debs (a Debian point release moved
    them out of the pool)."""
    names = ", ".join(f"{d.name} {d.version}" for d in missing[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    return (
        f"{mirror} no longer serves {len(missing)} .deb(s) of the image lock: {names}{more} "
        f"(a Debian point release replaced them). Nothing else was installed in their place. "
        f"Refresh the lock from a checkout ({REFRESH}), commit it and build again; or build "
        f"from the mirror by name with `drumsd image build --mirror-fallback` (not the locked "
        f"packages: the image records it and the lock tests fail)."
    )


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """Stanzas of a Debian control file (a Packages index, dpkg's status) as dicts, continuation
    lines joined with newlines."""
    found = []
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        last = None
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and last:
                fields[last] += "\n" + line
            elif ":" in line:
                last, value = line.split(":", 1)
                fields[last] = value.strip()
        if "Package" in fields:
            found.append(fields)
    return found


def installed_packages(status: str) -> dict[str, tuple[str, str]]:
    """name -> (version, architecture) of what dpkg's status file lists as installed."""
    return {
        s["Package"]: (s["Version"], s["Architecture"])
        for s in parse_stanzas(status)
        if s.get("Status", "").endswith(" installed")
    }
