"""Host-facing subcommands of `drumsd`: doctor, image build/unpack/list, host prepare.

`register(subparsers)` adds them to the main parser; each sets `handler` (args -> exit code), so
main runs `sys.exit(args.handler(args))`. Defaults come from the config model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from drumsd.core.config import Config

_DEFAULTS = Config.model_fields
DEFAULT_STATE_DIR: Path = _DEFAULTS["state_dir"].default
DEFAULT_CRIU: Path = _DEFAULTS["criu"].default
DEFAULT_CACHE_ROOT: Path = _DEFAULTS["images_dir"].default.parent


def _progress(message: str) -> None:
    print(message, flush=True)


def run_doctor(args: argparse.Namespace) -> int:
    from drumsd.linux import doctor

    facts = doctor.gather_facts(state_dir=args.state_dir, cache_root=args.cache, criu=args.criu)
    checks = doctor.assess(facts)
    if args.json:
        print(
            json.dumps(
                {"facts": doctor.facts_as_dict(facts), "checks": [c.__dict__ for c in checks]},
                indent=2,
            )
        )
    else:
        print(doctor.render(checks))
    return doctor.exit_code(checks)


def run_image_build(args: argparse.Namespace) -> int:
    from drumsd.linux.image import ImageBuildError, build_image

    if os.geteuid() != 0:
        print("image build needs root (debootstrap, chroot, mounts)", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        info = build_image(
            args.profile, args.cache, progress=_progress, mirror_fallback=args.mirror_fallback
        )
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "profile": info.profile,
                "root": str(info.root),
                "sha256": info.sha256,
                "key": info.key,
                "manifest": str(info.manifest),
                "seconds": round(time.monotonic() - started, 1),
            },
            indent=2,
        )
    )
    return 0


def run_image_unpack(args: argparse.Namespace) -> int:
    from drumsd.linux.image import ImageBuildError
    from drumsd.linux.image_import import unpack_image

    try:
        info = unpack_image(args.tar, args.images_dir, args.profile, args.name, progress=_progress)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"profile": info.profile, "root": str(info.root), "sha256": info.sha256}))
    return 0


def run_image_list(args: argparse.Namespace) -> int:
    from drumsd.linux.image import ImageBuildError, find_image
    from drumsd.linux.image_profiles import PROFILES

    for profile in PROFILES:
        try:
            info = find_image(profile, args.cache)
            print(f"{profile:<8} {info.sha256}  {info.root}")
        except ImageBuildError:
            print(f"{profile:<8} (not built: drumsd image build --profile {profile})")
    return 0


def run_image_prune(args: argparse.Namespace) -> int:
    from drumsd.linux.image import prune_images

    removed = prune_images(args.cache, progress=_progress, dry_run=args.dry_run)
    print(f"{len(removed)} tree(s) {'to remove' if args.dry_run else 'removed'}")
    return 0


def run_host_prepare(args: argparse.Namespace) -> int:
    from drumsd.linux import hostprep

    argv = ["--profile", args.profile, "--cache", str(args.cache)]
    if args.criu_only:
        argv.append("--criu-only")
    return hostprep.main(argv)


def register(subparsers: argparse._SubParsersAction) -> None:
    from drumsd.linux.image_profiles import PROFILES

    def add_cache(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--cache",
            type=Path,
            default=DEFAULT_CACHE_ROOT,
            help=f"cache root for CRIU and images (default {DEFAULT_CACHE_ROOT})",
        )

    doctor = subparsers.add_parser(
        "doctor", help="what this host has and lacks for drums, with what to do about it"
    )
    doctor.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    doctor.add_argument("--criu", type=Path, default=DEFAULT_CRIU)
    doctor.add_argument("--json", action="store_true", help="facts and checks as JSON")
    add_cache(doctor)
    doctor.set_defaults(handler=run_doctor)

    image = subparsers.add_parser("image", help="desktop images")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help="build (or find cached) a desktop image")
    build.add_argument("--profile", choices=sorted(PROFILES), default="base")
    build.add_argument(
        "--mirror-fallback",
        action="store_true",
        help="when the image lock cannot build the profile (the mirror dropped a locked .deb in "
        "a point release, a recipe changed without a refreshed lock), install from the mirror by "
        "name instead, with a loud warning; image.json says packages_from: mirror",
    )
    add_cache(build)
    build.set_defaults(handler=run_image_build)
    unpack = image_sub.add_parser(
        "unpack",
        help="register an image built elsewhere (a root.tar, e.g. Nix's) as <profile>-<name>",
    )
    unpack.add_argument("tar", type=Path, help="the root file system as a tarball")
    unpack.add_argument("--profile", required=True, help="the profile it is found by")
    unpack.add_argument("--name", required=True, help="what tells this build apart (a hash)")
    unpack.add_argument(
        "--images-dir", type=Path, default=_DEFAULTS["images_dir"].default, help="config images_dir"
    )
    unpack.set_defaults(handler=run_image_unpack)
    listing = image_sub.add_parser("list", help="built images and their sha256")
    add_cache(listing)
    listing.set_defaults(handler=run_image_list)

    prune = image_sub.add_parser(
        "prune", help="remove builds no profile points to (their checkpoints stop restoring)"
    )
    prune.add_argument("--dry-run", action="store_true")
    add_cache(prune)
    prune.set_defaults(handler=run_image_prune)

    host = subparsers.add_parser("host", help="host preparation")
    host_sub = host.add_subparsers(dest="host_command", required=True)
    prepare = host_sub.add_parser(
        "prepare", help="apt packages, CRIU 4.2.1 and a desktop image, idempotently"
    )
    prepare.add_argument("--profile", choices=sorted(PROFILES), default="base")
    prepare.add_argument("--criu-only", action="store_true")
    add_cache(prepare)
    prepare.set_defaults(handler=run_host_prepare)
