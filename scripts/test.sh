#!/usr/bin/env bash
# The README's test command: set up the host (idempotent, cached), then run every test, including
# the live ones on real restored desktops (DRUMS_LIVE=1 makes a missing CRIU or image a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh base office  # live tests run OSWorld and factory tasks on office apps

# The task factory's app tests run the real apps on the host (headless conversions, GIMP batch,
# Chromium print-to-pdf), so the host needs them too.
host_apps=(libreoffice-calc libreoffice-writer libreoffice-impress gimp chromium xvfb xdotool)
missing=()
for p in "${host_apps[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "==> apt: host apps for the task factory's tests: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
export PATH="$PWD/.venv/bin:$PATH" DRUMS_LIVE=1 DRUMS_CI=1
echo "==> tools only the tests use (Nix >= 2.18 for the Nix checks, unpacked from Debian 13's .debs)"
bash nix/ci-nix.sh >/dev/null
# Trainer venvs (cached by requirement-list hash; trainer-venv.sh builds each once, under a lock).
# prime-rl's needs the trainer sources in ../shared/trainers: without them its tests skip, saying so.
echo "==> trainer test venvs (verl 0.9.1, skyrl-train 0.3.1, prime-rl 559b44772)"
bash scripts/trainer-venv.sh verl >/dev/null
bash scripts/trainer-venv.sh skyrl >/dev/null
rc=0
bash scripts/trainer-venv.sh primerl >/dev/null || rc=$?
((rc == 0 || rc == 3))
echo "==> ruff"
ruff check .
ruff format --check .
echo "==> import contracts (lint-imports: guest < core < linux < tasks < runtime < api < serve, bench < cli)"
lint-imports
# No import cycle in runtime/ larger than a module and its helper (issue 31), counting the
# imports that run and, with --types, those only annotations need too: the operations and
# services take narrow Protocols of the supervisor (ops_fork.ForkHost, ...), not its class.
echo "==> import cycles in runtime/ (scripts/import_cycles.py)"
python scripts/import_cycles.py drumsd/src/drumsd/runtime --max 2
python scripts/import_cycles.py drumsd/src/drumsd/runtime --types --max 2
# Each package from its own config (sdk/ and drumsd/pyproject.toml): the SDK strict, the daemon
# strict less the per-module ratchet listed there. The caches keep a rerun to seconds.
echo "==> mypy (sdk strict; drumsd strict with its ratchet)"
(cd sdk && mypy --cache-dir ../.mypy_cache/sdk)
(cd drumsd && mypy --cache-dir ../.mypy_cache/drumsd)
# --timeout: a test that hangs fails with its stack and the run goes on. The slowest live test
# takes under 3 min here, the slowest unit test under 1 min, so the unit tier's bound is tighter
# (a unit test once hung on a supervisor shutdown and cost the run 20 min).
pytest_args=(-q -rs -p no:cacheprovider --durations=60 --timeout=1200)
if (($#)); then
    echo "==> pytest $*"
    exec pytest "${pytest_args[@]}" "$@"
fi
# Every test, in two runs: the unit tier (one layer in process, no shared host state) in one
# worker per core, then the integration and live tiers in one process, since they share the
# host's CRIU, cgroups and desktops and their timings (gates, quiescence) assume a quiet host.
# Both always run; the command fails if either does.
cores=$(nproc)
echo "==> pytest: unit tier in $cores workers"
unit_rc=0
pytest "${pytest_args[@]}" --timeout=300 -n "$cores" -m unit || unit_rc=$?
echo "==> pytest: integration and live tiers"
rest_rc=0
pytest "${pytest_args[@]}" -m "not unit" || rest_rc=$?
echo "==> pytest: unit tier exit $unit_rc, integration and live tiers exit $rest_rc"
((unit_rc == 0 && rest_rc == 0))
