#!/usr/bin/env bash
# The README's test command: set up the host (idempotent, cached), then run every test, including
# the live ones on real restored desktops (DRUMS_LIVE=1 makes a missing CRIU or image a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh base
export PATH="$PWD/.venv/bin:$PATH" DRUMS_LIVE=1 DRUMS_CI=1
echo "==> ruff"
ruff check .
ruff format --check .
echo "==> pytest"
exec pytest -q -p no:cacheprovider "$@"
