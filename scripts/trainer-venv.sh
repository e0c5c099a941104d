#!/usr/bin/env bash
# Build (once) the test venv of one RL trainer and print its path:
#   scripts/trainer-venv.sh verl   -> /var/cache/drums/verl-venv-<hash of scripts/trainers/verl.txt>
# The trainers pin torch/transformers/ray versions that cannot share the workspace .venv, so each
# lives in its own venv keyed by its requirement list; a rerun with the same list is instant.
# The file's lines before `---` are installed first and alone (torch from the CPU wheel on disk);
# lines after a `--- no-deps` line are installed without their dependencies and without the
# package's Python pin (for a trainer whose full dependency set cannot install without a GPU).
# Directives: `#! python 3.12` builds with that Python (from PATH, else pyenv's), `#! env N=V`
# is exported for the installs, and `@shared@` stands for ../shared/trainers (trainer sources no
# registry has); when that folder is absent the script exits 3 naming it.
# One build per venv at a time (flock): a second caller waits and then reuses the result.
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:?usage: scripts/trainer-venv.sh verl|skyrl|primerl}"
reqs="scripts/trainers/$name.txt"
[ -f "$reqs" ] || { echo "trainer-venv: no $reqs" >&2; exit 2; }
cache="${DRUMS_CACHE:-/var/cache/drums}"
hash="$(sha256sum "$reqs" | cut -c1-16)"
venv="$cache/$name-venv-$hash"
mkdir -p "$cache"
exec 9>"$venv.lock"
flock 9
if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
    echo "$venv"
    exit 0
fi
shared="${DRUMS_SHARED_TRAINERS:-$(cd .. && pwd)/shared/trainers}"
if grep -q '@shared@' "$reqs" && [ ! -d "$shared" ]; then
    echo "trainer-venv: $name needs trainer sources from $shared, which is absent" >&2
    exit 3
fi
version=$(sed -n 's/^#! python //p' "$reqs")
python="${DRUMS_TRAINER_PYTHON:-python3.11}"
if [ -n "$version" ]; then
    # pyenv's shims answer for every version, so ask pyenv first
    if command -v pyenv >/dev/null && found=$(pyenv prefix "$(pyenv latest "$version")" 2>/dev/null); then
        python="$found/bin/python$version"
    else
        python="python$version"
    fi
    "$python" -c '' 2>/dev/null ||
        { echo "trainer-venv: $name needs Python $version (pyenv's or on PATH)" >&2; exit 2; }
fi
while read -r assignment; do export "${assignment?}"; done < <(sed -n 's/^#! env //p' "$reqs")
# Built in place (a venv's scripts name their own path), marked complete only at the end.
rm -rf "$venv"
start=$(date +%s)
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --root-user-action=ignore)
lines() { sed "s|@shared@|$shared|g" "$reqs" | sed '/^#/d;/^$/d'; }
first=$(lines | sed -n '/^---/q;p')
rest=$(lines | sed -n '/^---$/,/^--- no-deps$/p' | sed '/^---/d')
bare=$(lines | sed -n '/^--- no-deps$/,$p' | sed '1d')
# shellcheck disable=SC2086
[ -z "$first" ] || "${pip[@]}" $first >&2
# shellcheck disable=SC2086
"${pip[@]}" $rest >&2
# shellcheck disable=SC2086
[ -z "$bare" ] || "${pip[@]}" --no-deps --ignore-requires-python $bare >&2
touch "$venv/.complete"
echo "trainer-venv: built $name in $(( $(date +%s) - start ))s at $venv" >&2
echo "$venv"
