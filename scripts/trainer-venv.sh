#!/usr/bin/env bash
# Build (once) the test venv of one RL trainer and print its path:
#   scripts/trainer-venv.sh verl   -> /var/cache/drums/verl-venv-<hash of scripts/trainers/verl.txt>
# The trainers pin torch/transformers/ray versions that cannot share the workspace .venv, so each
# lives in its own venv keyed by its requirement list; a rerun with the same list is instant.
# The file's lines before `---` are installed first and alone (torch from the CPU wheel on disk);
# lines after a `--- no-deps` line are installed without their dependencies and without the
# package's Python pin (for a trainer whose full dependency set cannot install without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:?usage: scripts/trainer-venv.sh verl}"
reqs="scripts/trainers/$name.txt"
[ -f "$reqs" ] || { echo "trainer-venv: no $reqs" >&2; exit 2; }
cache="${DRUMS_CACHE:-/var/cache/drums}"
hash="$(sha256sum "$reqs" | cut -c1-16)"
venv="$cache/$name-venv-$hash"
if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
    echo "$venv"
    exit 0
fi
python="${DRUMS_TRAINER_PYTHON:-python3.11}"
# Built in place (a venv's scripts name their own path), marked complete only at the end.
rm -rf "$venv"
mkdir -p "$cache"
start=$(date +%s)
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --root-user-action=ignore)
first=$(sed -n '/^---$/q;/^[^#]/p' "$reqs")
rest=$(sed -n '/^---$/,/^--- no-deps$/p' "$reqs" | sed '1d;/^---/d;/^#/d;/^$/d')
bare=$(sed -n '/^--- no-deps$/,$p' "$reqs" | sed '1d;/^#/d;/^$/d')
# shellcheck disable=SC2086
[ -z "$first" ] || "${pip[@]}" $first >&2
# shellcheck disable=SC2086
"${pip[@]}" $rest >&2
# shellcheck disable=SC2086
[ -z "$bare" ] || "${pip[@]}" --no-deps --ignore-requires-python $bare >&2
touch "$venv/.complete"
echo "trainer-venv: built $name in $(( $(date +%s) - start ))s at $venv" >&2
echo "$venv"
