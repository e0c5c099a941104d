#!/usr/bin/env python3
"""List the import cycles inside a Python package; fail when one is larger than allowed.

    python scripts/import_cycles.py drumsd/src/drumsd/runtime --max 2
    python scripts/import_cycles.py drumsd/src/drumsd/runtime --types --max 21

Reads the package's modules with `ast` (nothing is imported or run) and draws an edge for every
import of another module of the package: at the top of a module or inside a function alike (a
deferred import is still a dependency). Imports under `if TYPE_CHECKING:` never run, so they are
left out unless `--types` is given: then a module that names another's class in its annotations
depends on it too (the design's coupling, not just what Python executes). A cycle is a strongly
connected set of modules; each one larger than one module is printed, largest first. `--max N`
makes any cycle of more than N modules an error (exit 1): N=2 allows a module and its helper
that import each other, nothing larger.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path


def module_name(path: Path, src_root: Path) -> str:
    parts = list(path.relative_to(src_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def src_root_of(package_dir: Path) -> Path:
    """The directory the package's top-level package sits in (the first without __init__.py)."""
    root = package_dir
    while (root / "__init__.py").exists():
        root = root.parent
    return root


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(tree: ast.AST, types: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that runs, and with `types` those under `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not types and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_modules(
    node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]
) -> set[str]:
    """The modules of `modules` an import loads: `import a.b` -> a.b; `from a import b` -> a.b
    when b is a submodule, else a (b is a name defined in a)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules
    base = node.module or ""
    if node.level:
        parts = importer.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([base] if base else []))
    found = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.add(sub if sub in modules else base)
    return found & modules


def graph(package_dir: Path, types: bool = False) -> dict[str, set[str]]:
    src_root = src_root_of(package_dir)
    files = {module_name(p, src_root): p for p in sorted(package_dir.rglob("*.py"))}
    edges: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in imports_of(tree, types):
            edges[name] |= imported_modules(node, name, is_package, set(files)) - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan, iterative), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return sorted(found, key=lambda c: (-len(c), c))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package", type=Path, help="a package directory (with __init__.py)")
    parser.add_argument(
        "--max", type=int, default=None, help="fail when a cycle has more modules than this"
    )
    parser.add_argument(
        "--types", action="store_true", help="count imports under `if TYPE_CHECKING:` too"
    )
    args = parser.parse_args(argv)
    if not (args.package / "__init__.py").exists():
        parser.error(f"{args.package} is not a package directory (no __init__.py in it)")
    edges = graph(args.package, args.types)
    found = cycles(edges)
    for cycle in found:
        print(f"cycle of {len(cycle)}: " + ", ".join(cycle))
    largest = max((len(c) for c in found), default=0)
    kind = "imports, type-only ones included" if args.types else "imports that run"
    print(f"{len(edges)} modules, {len(found)} cycles, the largest of {largest} ({kind})")
    if args.max is not None and largest > args.max:
        fix = (
            "take the narrow Protocol or the owner a module uses, not the other module's class"
            if args.types
            else "import the other module under `if TYPE_CHECKING:` when only its types are "
            "needed, or pass what is needed in"
        )
        print(
            f"error: a cycle of {largest} modules in {args.package}, over the bound of "
            f"{args.max}: {fix}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
