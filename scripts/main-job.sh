#!/usr/bin/env bash
# The README's main job: set up the host (idempotent, cached), start drumsd on the `office` image,
# and run a real episode through the API with the SDK: create on an example task (examples/tasks/, in
# OSWorld's format), act, fork into 4, verify each copy, save a state. Prints where the screenshots
# are. Needs nothing outside the checkout; DRUMS_OSWORLD_DIR=/path/to/OSWorld/evaluation_examples
# adds OSWorld's own tasks. Run it as root (sudo when not root).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
bash scripts/setup.sh base office
export PATH="$repo/.venv/bin:$PATH"

run="${DRUMS_MAIN_DIR:-/var/lib/drums-main}"
mkdir -p "$run"
token_file="$run/token"
[ -s "$token_file" ] || (umask 077 && python -c 'import secrets; print(secrets.token_hex(32))' > "$token_file")
port="${DRUMS_PORT:-7070}"
if [ "$(id -u)" != 0 ]; then
  echo "main-job.sh sets up the host and runs drumsd: run it as root (sudo bash $0)" >&2
  exit 1
fi
task_dirs="\"$repo/examples/tasks\""
if [ -n "${DRUMS_OSWORLD_DIR:-}" ]; then
  [ -d "$DRUMS_OSWORLD_DIR" ] || { echo "DRUMS_OSWORLD_DIR=$DRUMS_OSWORLD_DIR is not a directory" >&2; exit 1; }
  task_dirs="$task_dirs, \"$DRUMS_OSWORLD_DIR\""
fi
cat > "$run/drumsd.json" <<JSON
{
  "listen": "127.0.0.1:$port",
  "token_file": "$token_file",
  "state_dir": "${DRUMS_MAIN_STATE_DIR:-/run/drums-main}",
  "journal_dir": "$run/journal",
  "forgotten_dir": "$run/forgotten",
  "default_image": "office",
  "tasks": {"dirs": [$task_dirs]}
}
JSON
drumsd check-config "$run/drumsd.json" >/dev/null

echo "==> starting drumsd (log: $run/drumsd.log)"
drumsd serve --config "$run/drumsd.json" >"$run/drumsd.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
export DRUMS_URL="http://127.0.0.1:$port" DRUMS_TOKEN_FILE="$token_file"
DRUMSD_PID=$daemon python - <<'PY'
import os, time, drums
deadline = time.monotonic() + 300
with drums.connect() as client:
    while True:
        try:
            os.kill(int(os.environ["DRUMSD_PID"]), 0)
        except ProcessLookupError:
            raise SystemExit("drumsd exited; see its log") from None
        try:
            ready = [c for c in client.list_states() if c.kind == "template" and c.image == "office"]
        except drums.ConnectionFailed:  # still starting
            ready = []
        if ready:
            print(f"==> template checkpoint {ready[0].id} of the office image is ready")
            break
        if time.monotonic() > deadline:
            raise SystemExit("the office template checkpoint was not ready in 300 s; see the log")
        time.sleep(0.5)
PY
out="$repo/out/main-job/$(date +%Y%m%d-%H%M%S)"
python examples/first_episode.py --out "$out" ${DRUMS_MAIN_TASK:+--task "$DRUMS_MAIN_TASK"}
echo "==> screenshots: $out"
