#!/usr/bin/env bash
# One idempotent set-up of a fresh Debian 12 host for drums: apt packages, CRIU 4.2.1, the desktop
# image(s), and the Python workspace in .venv: what drumsd and its main job need (what only the
# tests use, the Nix tools and the trainer venvs, scripts/test.sh builds). Heavy artifacts are
# cached under /var/cache/drums keyed by content hash, so a rerun on the same machine takes seconds.
#   scripts/setup.sh [PROFILE...]   (default: base)
#   DRUMS_CONFIG=/etc/drums/drumsd.json also fetches the OSWorld commit its tasks.osworld pins.
set -euo pipefail
cd "$(dirname "$0")/.."
profiles=("${@:-base}")
step() { printf '\n==> [setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "scripts/setup.sh: run as root (drums mounts overlays, makes namespaces and runs CRIU)" >&2
    exit 1
fi

step "Python workspace (.venv, uv)"
command -v uv >/dev/null || python3 -m pip install --quiet --root-user-action=ignore uv
# Byte-compiled at install (uv does not by default): a host that sets PYTHONDONTWRITEBYTECODE
# (this kind of machine does) otherwise compiles every imported module from source in every
# process; `vf-eval --help` took 10.5 CPU-s uncompiled and 5.5 compiled. A rerun compiles nothing.
if uv lock --check --quiet 2>/dev/null; then
    uv sync --locked --all-packages --group dev --quiet --compile-bytecode
else
    echo "uv.lock does not match the pyproject files: resolving anew (commit the new uv.lock)" >&2
    uv sync --all-packages --group dev --quiet --compile-bytecode
fi
export PATH="$PWD/.venv/bin:$PATH"
# The workspace's own packages are editable installs (their sources stay here): compile those too.
python -m compileall -q -j 0 drumsd/src sdk/src taskfactory/src verifiers_env/src >/dev/null

for profile in "${profiles[@]}"; do
    step "host packages, CRIU and the '$profile' desktop image"
    # The images install the lock's packages (drumsd/src/drumsd/linux/images.lock.json). After a
    # Debian point release the mirror may no longer serve some: setup then builds from the mirror
    # by name with a loud warning instead of failing, and the lock tests fail until the lock is
    # refreshed (docs/nix.md, "drumsd image build installs the lock").
    bash scripts/prepare-host.sh "$profile" --mirror-fallback
done

step "checker virtualenv (OSWorld's metric functions, run as an unprivileged uid)"
python -m drumsd.tasks

if [ -n "${DRUMS_CONFIG:-}" ]; then
    # tasks.osworld in that config pins OSWorld (commit + sha256); offline this fails and the
    # daemon runs without OSWorld's tasks, saying so in /v1/health.
    step "the pinned OSWorld checkout of $DRUMS_CONFIG (needs network)"
    drumsd tasks fetch-osworld --config "$DRUMS_CONFIG" ||
        echo "setup: no OSWorld task files fetched; set tasks.osworld.dir to a copy" >&2
fi

step "done"
