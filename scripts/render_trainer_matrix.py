"""Render the trainer compatibility matrix in docs/verifiers.md from docs/trainer-matrix.json.

The JSON holds the rows (trainer, path, what runs, the checks behind the row, and where a row's
checks run outside the trainer's environment the checks whose versions it shows, `versions_from`)
and the last result of each check as the tests wrote it (verifiers_env/tests/matrix_results.py,
one file a check and mode under build/trainer-matrix/). Usage:
  render_trainer_matrix.py            rewrite the table in docs/verifiers.md from the JSON
  render_trainer_matrix.py --update   first fold build/trainer-matrix/*.json into the JSON
  render_trainer_matrix.py --check    exit 1 when the docs' table is not the JSON's rendering
A result that skipped does not replace a pass or failure recorded earlier.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "trainer-matrix.json"
DOC = REPO / "docs" / "verifiers.md"
RESULTS = REPO / "build" / "trainer-matrix"
BEGIN = "<!-- trainer-matrix: scripts/render_trainer_matrix.py renders this from its JSON -->"
END = "<!-- trainer-matrix end -->"
HEADER = "| trainer | version | path | what runs | result |\n|---|---|---|---|---|"


def result_key(check: str) -> str:
    """`file.py::test [live]` -> the results' key `file.py::test.live` (fake by default)."""
    name, _, tag = check.partition(" [")
    return f"{name}.{tag.rstrip(']') or 'fake'}"


def fold(spec: dict[str, Any], results_dir: Path) -> int:
    """Take the results under `results_dir` for the rows' checks into `spec`; how many."""
    wanted = {result_key(check) for row in spec["rows"] for check in row["checks"]}
    taken = 0
    for path in sorted(results_dir.glob("*.json")):
        result = json.loads(path.read_text())
        key = f"{result['check']}.{result['mode']}"
        if key not in wanted:
            continue
        old = spec["results"].get(key)
        if result["outcome"] == "skipped" and old and old["outcome"] != "skipped":
            continue
        spec["results"][key] = result
        taken += 1
    return taken


def version_cell(row: dict[str, Any], results: list[dict[str, Any]]) -> str:
    seen: dict[str, str] = {}
    for result in results:
        for name in row["packages"]:
            if name in result.get("versions", {}):
                seen.setdefault(name, result["versions"][name])
    parts = [row["version"]] if row["version"] else []
    parts += [f"{name} {seen.get(name, '?')}" for name in row["packages"]]
    return ", ".join(parts)


def fact_text(facts: dict[str, Any]) -> str:
    if not facts:
        return ""
    inner = "; ".join(f"{k}: {json.dumps(v, separators=(', ', ': '))}" for k, v in facts.items())
    return f" ({inner})"


def result_cell(row: dict[str, Any], spec: dict[str, Any]) -> str:
    parts = []
    for check in row["checks"]:
        result = spec["results"].get(result_key(check))
        label = f"`{check.replace(' [live]', '')}`" + (" live" if check.endswith("[live]") else "")
        if result is None:
            parts.append(f"{label}: not run yet")
            continue
        text = f"{label}: {result['outcome']} {result['date']}, {result['seconds']:g} s"
        if result["outcome"] == "skipped" and result.get("skip_reason"):
            text += f" ({result['skip_reason']})"
        parts.append(text + fact_text(result.get("facts", {})))
    if row.get("note"):
        parts.append(row["note"])
    return "; ".join(parts).replace("|", "\\|")


def render(spec: dict[str, Any]) -> str:
    lines = [HEADER]
    for row in spec["rows"]:
        # the versions of the checks run in the trainer's environment, where the row says
        checks = row.get("versions_from") or row["checks"]
        results = [spec["results"][k] for k in map(result_key, checks) if k in spec["results"]]
        cells = [row["trainer"], version_cell(row, results), row["path"], row["runs"],
                 result_cell(row, spec)]  # fmt: skip
        lines.append("| " + " | ".join(cell.replace("\n", " ") for cell in cells) + " |")
    return "\n".join(lines)


def table_span(text: str) -> tuple[int, int]:
    """Where the rendered block in docs/verifiers.md starts and ends (inside the markers)."""
    try:
        start = text.index(BEGIN) + len(BEGIN)
        return start, text.index(END, start)
    except ValueError:
        msg = f"{DOC}: no {BEGIN!r} ... {END!r} block; add one where the table goes"
        raise SystemExit(msg) from None


def docs_table(text: str) -> str:
    start, end = table_span(text)
    return text[start:end].strip("\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="fold the tests' results in first")
    parser.add_argument("--check", action="store_true", help="only compare, change nothing")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the tests' results dir")
    args = parser.parse_args(argv)
    spec = json.loads(SPEC.read_text())
    text = DOC.read_text()
    if args.check:
        if docs_table(text) != render(spec):
            print(f"{DOC}: the matrix table is not {SPEC.name}'s rendering; run {__file__}")
            return 1
        return 0
    if args.update:
        if not args.results.is_dir():
            print(f"no results at {args.results}: run the matrix tests first", file=sys.stderr)
            return 2
        print(f"{fold(spec, args.results)} results taken from {args.results}")
        SPEC.write_text(json.dumps(spec, indent=1, sort_keys=False) + "\n")
    start, end = table_span(text)
    DOC.write_text(f"{text[:start]}\n{render(spec)}\n{text[end:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
