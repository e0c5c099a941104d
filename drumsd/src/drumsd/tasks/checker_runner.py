"""One checker call, run inside the checker virtualenv as an unprivileged uid.

drumsd starts this file with the venv's python in a throw-away scratch directory holding copies
of the inputs; it reads one JSON request on stdin and writes one JSON answer to its stdout.
Everything the metric itself prints goes to stderr, so the answer can never be corrupted by it.
This file uses only the standard library: it is copied into the venv and must not import drumsd.

Requests:
  {"kind": "metric", "func": NAME, "args": [...], "kwargs": {...}}
  {"kind": "drums_verifier", "module_dir": DIR, "module": NAME, "check": FUNC, "args": [...],
   "kwargs": {...}}
  {"kind": "probe"}: which exported metric names load here, and why the others do not.
In args and kwargs, {"__drums_file__": "rel/name"} stands for the absolute path of that input in the
scratch directory (None when the getter found no file), and {"__drums_xlsx_last_row__": "rel"} for
the last row of that spreadsheet as strings (OSWorld's content_from_vm_file).

Answers: {"ok": true, "score": float} or {"ok": false, "error_class": CLASS, "error": TEXT}, CLASS
being "unsupported" (a library the metric needs is missing), "bad_request" or "crash".
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

_METRICS_PACKAGE = "desktop_env.evaluators.metrics"
DRUMS_MODULE = "drums"  # the probe's module name of a metric this file supplies


def _desktop_env_root() -> Path:
    # find_spec on a top-level package locates it without executing its __init__, which would
    # import the VM providers.
    spec = importlib.util.find_spec("desktop_env")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "desktop_env is not installed in this interpreter: rebuild the checker venv"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _register_empty_packages(root: Path) -> Path:
    """Stand-in package objects so that metric modules load without the packages' __init__."""
    metrics_dir = root / "evaluators" / "metrics"
    for name, path in (
        ("desktop_env", root),
        ("desktop_env.evaluators", root / "evaluators"),
        (_METRICS_PACKAGE, metrics_dir),
    ):
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__path__ = [str(path)]  # type: ignore[attr-defined]
        module.__package__ = name
        sys.modules[name] = module
    return metrics_dir


# Libraries the metric modules import at the top but use in few or no functions. When one is not
# installed, a stand-in lets the module load; only a function that touches it fails, at call time,
# with an ImportError naming the library (answered as "unsupported").
OPTIONAL_LIBRARIES = ("easyocr", "borb", "acoustid", "librosa", "fastdtw")


class _MissingAttribute:
    def __init__(self, library: str, what: str) -> None:
        self._library = library
        self._what = what

    def _fail(self) -> ImportError:
        return ImportError(
            f"{self._what} needs the library {self._library!r}, which the checker venv does not"
            " have",
            name=self._library,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._fail()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._fail()


class _MissingLibrary(types.ModuleType):
    def __init__(self, name: str, library: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self._library = library

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _MissingAttribute(self._library, f"{self.__name__}.{name}")


class _MissingLibraryFinder:
    """Answers imports of a missing optional library (and its submodules) with stand-ins."""

    def __init__(self, libraries: set[str]) -> None:
        self.libraries = libraries

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.partition(".")[0]
        if top not in self.libraries:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> types.ModuleType:
        return _MissingLibrary(spec.name, spec.name.partition(".")[0])

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _install_optional_stand_ins() -> set[str]:
    missing = {lib for lib in OPTIONAL_LIBRARIES if importlib.util.find_spec(lib) is None}
    if missing:
        sys.meta_path.append(_MissingLibraryFinder(missing))
    return missing


def _names_bound_to(tree: ast.Module, libraries: set[str]) -> dict[str, str]:
    """Module-level names that the module's imports bind to one of the libraries."""
    bound: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.partition(".")[0]
                if top in libraries:
                    bound[alias.asname or top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.partition(".")[0]
            if top in libraries:
                for alias in node.names:
                    bound[alias.asname or alias.name] = top
    return bound


def functions_needing(source: str, libraries: set[str]) -> dict[str, str]:
    """Function name -> the missing library its body uses (static reading of the module)."""
    tree = ast.parse(source)
    bound = _names_bound_to(tree, libraries)
    needs: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            used = {
                bound[inner.id]
                for inner in ast.walk(node)
                if isinstance(inner, ast.Name) and inner.id in bound
            }
            if used:
                needs[node.name] = ", ".join(repr(lib) for lib in sorted(used))
    return needs


def exported_metrics(metrics_dir: Path) -> dict[str, str]:
    """Name -> module of the metrics package, read from its __init__ without running it.

    The last import of a name wins, as it would at run time.
    """
    tree = ast.parse((metrics_dir / "__init__.py").read_text())
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = node.module
    return names


def _import_failure(exc: BaseException) -> str:
    missing = getattr(exc, "name", None)
    if isinstance(exc, ImportError) and missing:
        return f"needs the module {missing!r}, which is not installed in the checker venv"
    return f"import failed: {type(exc).__name__}: {exc}"


# Metrics OSWorld's current task files use that the pinned desktop-env release (1.0.2, the newest
# on PyPI) does not export, written here from what those tasks need. desktop-env's own function of
# the same name wins once a release exports it.


def check_play_and_exit(actual_config_path: str | None, rule: dict[str, Any]) -> float:
    """VLC's "Play and exit" setting (vlcrc's play-and-exit) against the rule's expected value.

    OSWorld's 5ac2891a: the setup writes play-and-exit=1, the agent must turn it off. VLC reads a
    key from its last uncommented line and writes a setting left at its default (0) commented out,
    as "#play-and-exit=0", so a file without an uncommented line means 0. No file (VLC never saved
    its settings) scores 0.
    """
    if actual_config_path is None:
        return 0.0
    expected = str(rule["expected_play_and_exit"]).strip()
    value = "0"
    text = Path(actual_config_path).read_bytes().decode("utf-8", errors="replace")
    for line in text.splitlines():
        key, sep, rest = line.strip().partition("=")
        if sep and key.strip() == "play-and-exit":
            value = rest.strip()
    return 1.0 if value == expected else 0.0


DRUMS_METRICS: dict[str, Any] = {"check_play_and_exit": check_play_and_exit}


def _load_metric(func: str) -> Any:
    missing = _install_optional_stand_ins()
    metrics_dir = _register_empty_packages(_desktop_env_root())
    names = exported_metrics(metrics_dir)
    if func not in names and func in DRUMS_METRICS:
        return DRUMS_METRICS[func]
    if func not in names:
        raise LookupError(f"{func!r} is not a metric exported by desktop_env")
    module = importlib.import_module(f"{_METRICS_PACKAGE}.{names[func]}")
    # Refuse a function that uses a missing library even where a path of it would not reach
    # the library: its scores would be half of what OSWorld computes.
    needs = functions_needing((metrics_dir / f"{names[func]}.py").read_text(), missing)
    if func in needs:
        raise ImportError(f"{func} needs {needs[func]}, not installed in the checker venv")
    return getattr(module, func)


def _probe() -> dict[str, Any]:
    missing = _install_optional_stand_ins()
    metrics_dir = _register_empty_packages(_desktop_env_root())
    names = exported_metrics(metrics_dir)
    failures: dict[str, str] = {}
    needing: dict[str, dict[str, str]] = {}
    for module_name in sorted(set(names.values())):
        try:
            importlib.import_module(f"{_METRICS_PACKAGE}.{module_name}")
        except Exception as exc:  # any import error marks only this module's functions
            failures[module_name] = _import_failure(exc)
            continue
        source = (metrics_dir / f"{module_name}.py").read_text()
        needing[module_name] = functions_needing(source, missing)
    unsupported: dict[str, str] = {}
    for name, module in names.items():
        if module in failures:
            unsupported[name] = f"metric module {module!r} {failures[module]}"
        elif name in needing.get(module, {}):
            library = needing[module][name]
            unsupported[name] = f"needs {library}, not installed in the checker venv"
    for name in DRUMS_METRICS:
        names.setdefault(name, DRUMS_MODULE)
    return {"ok": True, "exported": names, "unsupported": unsupported, "missing": sorted(missing)}


def _decode(value: Any, scratch: Path) -> Any:
    if isinstance(value, list):
        return [_decode(v, scratch) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__drums_file__"}:
            rel = value["__drums_file__"]
            return None if rel is None else str(scratch / rel)
        if set(value) == {"__drums_xlsx_last_row__"}:
            import pandas as pd  # only the checker venv has pandas

            frame = pd.read_excel(scratch / value["__drums_xlsx_last_row__"])
            return frame.iloc[-1].astype(str).tolist()
        return {k: _decode(v, scratch) for k, v in value.items()}
    return value


def _score(value: Any) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if value is not None and not isinstance(value, str | bytes) and hasattr(value, "__float__"):
        return float(value)  # also numpy's scalar types, which some metrics return
    raise TypeError(f"the checker returned {value!r} ({type(value).__name__}), not a number")


def _quiet_tldextract() -> None:
    # tldextract would fetch the public suffix list on first use; its bundled copy gives the same
    # answers without the network.
    try:
        import tldextract
        import tldextract.tldextract as impl
    except ImportError:
        return
    impl.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


def handle(request: dict[str, Any], scratch: Path) -> dict[str, Any]:
    kind = request.get("kind")
    if kind == "probe":
        return _probe()
    try:
        if kind == "metric":
            _quiet_tldextract()
            func = _load_metric(request["func"])
        elif kind == "drums_verifier":
            sys.path.insert(0, request["module_dir"])
            module = importlib.import_module(request["module"])
            checks = getattr(module, "CHECKS", None)
            if isinstance(checks, dict) and request["check"] in checks:
                func = checks[request["check"]]
            elif hasattr(module, request["check"]):
                func = getattr(module, request["check"])
            else:
                raise LookupError(
                    f"verifier module {request['module']!r} has no check {request['check']!r}"
                )
        else:
            return {"ok": False, "error_class": "bad_request", "error": f"unknown kind {kind!r}"}
    except LookupError as exc:
        return {"ok": False, "error_class": "bad_request", "error": str(exc)}
    except ImportError as exc:
        return {"ok": False, "error_class": "unsupported", "error": _import_failure(exc)}
    except Exception as exc:
        return {
            "ok": False,
            "error_class": "crash",
            "error": f"loading the checker failed: {type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=8),
        }
    try:
        args = _decode(request.get("args", []), scratch)
        kwargs = _decode(request.get("kwargs") or {}, scratch)
        return {"ok": True, "score": _score(func(*args, **kwargs))}
    except Exception as exc:
        return {
            "ok": False,
            "error_class": "crash",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=8),
        }


def main() -> int:
    # Keep the real stdout for the answer; anything printed from here on (Python or C) lands in
    # stderr.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.read())
    answer = handle(request, Path.cwd())
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
