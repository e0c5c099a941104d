#!/usr/bin/env bash
# Prepare this Debian/Ubuntu host for drumsd, idempotently: apt packages, CRIU 4.2.1, a desktop image.
# Usage: scripts/prepare-host.sh [PROFILE] [--mirror-fallback]   (PROFILE: base (default), office, osworld)
# Env: DRUMS_CACHE (default /var/cache/drums), DRUMS_PYTHON (default: the repo's .venv python).
set -euo pipefail

profile="${1:-base}"
# --mirror-fallback: build from the mirror by name when the image lock cannot (drumsd image build).
fallback=("${@:2}")
cache="${DRUMS_CACHE:-/var/cache/drums}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${DRUMS_PYTHON:-$repo/.venv/bin/python}"

if [[ $EUID -ne 0 ]]; then
    echo "prepare-host: run as root (apt-get, debootstrap, /usr/local/sbin/criu)" >&2
    exit 2
fi
if [[ ! -x "$python" ]]; then
    echo "prepare-host: no python at $python; create the venv first (uv venv $repo/.venv --python 3.11)" >&2
    exit 2
fi

# Keep this list in step with HOST_RUNTIME_PACKAGES and CRIU_BUILD_DEPS in drumsd/linux/hostprep.py.
packages=(
    debootstrap iproute2 util-linux xz-utils zstd ca-certificates procps lxcfs
    build-essential pkg-config libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler
    protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev
    libgnutls28-dev uuid-dev libnftables-dev libaio-dev
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "[prepare-host] apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "[prepare-host] apt: all ${#packages[@]} host packages present"
fi

echo "[prepare-host] criu + image '$profile' (cache $cache)"
PYTHONPATH="$repo/drumsd/src${PYTHONPATH:+:$PYTHONPATH}" \
    "$python" -u -m drumsd.linux.hostprep --profile "$profile" --cache "$cache" "${fallback[@]}"
echo "[prepare-host] done"
