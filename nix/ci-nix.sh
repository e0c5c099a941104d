#!/usr/bin/env bash
# A Nix new enough for nixpkgs 25.11 (>= 2.18: lib/minfeatures.nix, builtins.readFileType for
# lib.fileset) on a Debian 12 host, whose own nix-bin is 2.8. Debian 13 (trixie)'s nix-bin .debs are
# downloaded with an apt configuration of their own (its own sources, lists, dpkg status and
# archive cache; the host's apt state is never touched) and unpacked into a directory, never
# installed: trixie's libc would replace bookworm's. Wrappers run trixie's binaries through trixie's
# own ld.so and libraries, with a store of their own (a chroot store under the same directory, so
# Debian's Nix 2.8 and its /nix keep working).
#
#   bash nix/ci-nix.sh          -> prints the bin directory (nix, nix-instantiate, nix-store)
#
# Cached under $DRUMS_CACHE (/var/cache/drums)/ci-nix-<hash of this file>/; a stable link
# $DRUMS_CACHE/ci-nix points at the current one, which tests/nix uses (nix_support.py).
set -euo pipefail
cache="${DRUMS_CACHE:-/var/cache/drums}"
key=$(sha256sum "$0" | cut -c1-16)
dir="$cache/ci-nix-$key"
bin="$dir/bin"
suite=trixie
minimum=2.18

if [ ! -x "$bin/nix" ]; then
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/ci-nix-$key.partial.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    apt="$work/apt"
    mkdir -p "$apt"/etc/apt/apt.conf.d "$apt"/etc/apt/preferences.d "$apt"/var/lib/apt/lists/partial \
        "$apt"/var/cache/apt/archives/partial "$apt"/var/lib/dpkg
    : >"$apt"/var/lib/dpkg/status
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
        >"$apt"/etc/apt/sources.list
    printf '%s\n' "Dir::Etc \"$apt/etc/apt\";" "Dir::State \"$apt/var/lib/apt\";" \
        "Dir::State::status \"$apt/var/lib/dpkg/status\";" "Dir::Cache \"$apt/var/cache/apt\";" \
        'APT::Architecture "amd64";' 'Acquire::Languages "none";' >"$apt/apt.conf"
    echo "[ci-nix] downloading $suite's nix-bin and its libraries (.debs, not installed)" >&2
    APT_CONFIG="$apt/apt.conf" apt-get update -q >&2
    # An empty dpkg status: apt downloads the whole closure, libc included, for the unpacked tree.
    APT_CONFIG="$apt/apt.conf" apt-get install --download-only -y -q --no-install-recommends nix-bin >&2
    mkdir -p "$work/root"
    for deb in "$apt"/var/cache/apt/archives/*.deb; do
        dpkg-deb -x "$deb" "$work/root"
    done
    rm -rf "$apt"
    root="$dir/root"
    libs="$root/usr/lib/x86_64-linux-gnu"
    mkdir -p "$work/bin" "$work/conf"
    printf 'store = local?root=%s\nbuild-users-group =\nsubstituters =\n' "$dir/store" >"$work/conf/nix.conf"
    for prog in nix nix-instantiate nix-store; do
        # Nix's other commands are one binary dispatching on argv[0].
        printf '#!/bin/sh\nexport NIX_CONF_DIR=%s\nexec %s --library-path %s --argv0 %s %s "$@"\n' \
            "$dir/conf" "$libs/ld-linux-x86-64.so.2" "$libs:$root/usr/lib" "$prog" "$root/usr/bin/nix" \
            >"$work/bin/$prog"
        chmod +x "$work/bin/$prog"
    done
    rm -rf "$dir"
    mv "$work" "$dir"
    trap - EXIT
    mkdir -p "$dir/store"
fi

version=$("$bin/nix" --version | awk '{print $NF}')
if ! printf '%s\n%s\n' "$minimum" "$version" | sort -V -C; then
    echo "[ci-nix] $bin/nix is $version; nixpkgs 25.11 needs >= $minimum" >&2
    exit 1
fi
ln -sfn "$dir" "$cache/ci-nix.tmp" && mv -T "$cache/ci-nix.tmp" "$cache/ci-nix"
echo "[ci-nix] Nix $version in $bin" >&2
echo "$bin"
