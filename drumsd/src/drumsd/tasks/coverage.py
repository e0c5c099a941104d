"""`drumsd tasks coverage`: how many of a task set this host can run, per domain, and why not.

Runs the daemon's own support check (`support()`, with the image's app manifest) over the tasks of
a directory (an OSWorld checkout, its `evaluation_examples/examples`, or any copy) twice: as the
host is (its download cache as it is) and with every download present (stand-in files in a
temporary cache), and prints supported / total per domain and the reasons, as a table and as JSON.
In an OSWorld checkout the task set is its test list (`evaluation_examples/test_all.json`, the
tasks OSWorld's own runner evaluates); elsewhere, or with `--test-list none`, every task file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drumsd.core.config import TasksConfig
from drumsd.linux.image_apps import AppManifest, features, manifest_for_root

from .apps import missing_apps
from .host_support import SLOT_FEATURES, support
from .model import Task, TaskContext, beneath, list_tasks, url_file_name

OSWORLD_EXAMPLES = Path("evaluation_examples/examples")
OSWORLD_TEST_LIST = Path("evaluation_examples/test_all.json")


def examples_dir(root: Path) -> Path:
    """An OSWorld checkout's task directory, or the directory itself when it holds tasks."""
    inner = root / OSWORLD_EXAMPLES
    return inner if inner.is_dir() else root


def default_test_list(root: Path) -> Path | None:
    """An OSWorld checkout's test list (`evaluation_examples/test_all.json`), if it has one."""
    for candidate in (root / OSWORLD_TEST_LIST, root.parent / "test_all.json"):
        if candidate.is_file() and (candidate.parent / "examples").is_dir():
            return candidate
    return None


def read_test_list(path: Path) -> dict[str, list[str]]:
    """OSWorld's test list: {domain: [task id, ...]}; a clear error when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the test list {path}: {exc}") from None
    ok = isinstance(data, dict) and all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in data.values()
    )
    if not ok:
        raise ValueError(f"{path} is not a test list: want {{domain: [task id, ...]}}")
    return data


def select_listed(
    tasks: list[Task], broken: dict[Path, str], root: Path, listed: dict[str, list[str]]
) -> tuple[list[Task], dict[Path, str]]:
    """The tasks a test list names (by domain and id), and a "not a task file" entry for each
    listed id with no readable file, so the total is the list's."""
    by_key = {(domain_of(t, root), t.id): t for t in tasks}
    chosen: list[Task] = []
    gaps: dict[Path, str] = {}
    for domain, ids in listed.items():
        for task_id in ids:
            task = by_key.get((domain, task_id))
            if task is not None:
                chosen.append(task)
                continue
            path = root / domain / f"{task_id}.json"
            gaps[path] = broken.get(path, "listed in the test list, but no such file")
    return chosen, gaps


def domain_of(task: Task, root: Path) -> str:
    """OSWorld files a task under examples/<domain>/<id>.json; else its snapshot."""
    if task.source_path is not None:
        try:
            rel = task.source_path.resolve().relative_to(root.resolve())
        except ValueError:
            rel = None
        if rel is not None and len(rel.parts) > 1:
            return rel.parts[0]
    return task.snapshot or "(none)"


def download_files(task: Task) -> list[str]:
    """The file names a task's downloads and cloud_file getters take from the cache."""
    names: list[str] = []
    for step in [*task.config, *task.evaluator.postconfig]:
        if step.type == "download":
            for item in step.parameters.get("files", []):
                if isinstance(item, dict) and isinstance(item.get("url"), str):
                    names.append(url_file_name(item["url"]))
    ev = task.evaluator
    getters: list[Any] = []
    for value in (ev.result, ev.expected):
        getters += value if isinstance(value, list) else [value]
    for getter in getters:
        if isinstance(getter, dict) and getter.get("type") == "cloud_file":
            paths = getter.get("path")
            for url in paths if isinstance(paths, list) else [paths]:
                if isinstance(url, str):
                    names.append(url_file_name(url))
    return [n for n in names if n]


def stand_in_cache(tasks: list[Task], cache: Path) -> int:
    """Empty files where each task's downloads would be cached; returns how many."""
    made = 0
    for task in tasks:
        for name in download_files(task):
            slot = beneath(cache, task.id, name)
            if slot is None:
                continue
            slot.parent.mkdir(parents=True, exist_ok=True)
            slot.touch()
            made += 1
    return made


_PATHISH = re.compile(r"(?<!\w)(/[^\s'\"]+)")


def reason_kind(reason: str) -> str:
    """A reason without its task's particulars (paths, file names), to count alike ones."""
    for prefix in (
        "download not in the cache",
        "expected file not in the cache",
        "upload_file source missing",
        "task asset missing",
    ):
        if reason.startswith(prefix):
            return prefix
    if reason.startswith("needs the GSettings schema"):
        return "needs a GNOME GSettings schema the image lacks (list below)"
    if reason.startswith("its setup fetches packages"):
        return "its setup fetches packages (apt, pip), which needs the network"
    if reason.startswith("it runs `") and "systemd" in reason:
        return "it runs a systemd tool (timedatectl, systemctl, ...), and slots run no systemd"
    if reason.startswith("its sleep steps add up to"):
        return "its sleep steps add up to more than setup_timeout_s"
    # "needs VS Code (related_apps lists 'vscode'), which image 'office' lacks" -> by app
    reason = re.sub(r" \((related_apps lists|runs|opens) [^)]*\)", "", reason)
    return _PATHISH.sub("…", reason)


@dataclass
class Coverage:
    """One pass of the support check over a task set."""

    label: str
    total: Counter[str] = field(default_factory=Counter)  # domain -> tasks
    supported: Counter[str] = field(default_factory=Counter)  # domain -> supported tasks
    reasons: Counter[str] = field(default_factory=Counter)  # reason kind -> tasks
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, task_id: str, domain: str, ok: bool, reason: str | None) -> None:
        self.total[domain] += 1
        if ok:
            self.supported[domain] += 1
        else:
            self.reasons[reason_kind(reason or "")] += 1
        self.rows.append({"id": task_id, "domain": domain, "supported": ok, "reason": reason})

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "supported": sum(self.supported.values()),
            "total": sum(self.total.values()),
            "domains": {
                d: {"supported": self.supported[d], "total": self.total[d]}
                for d in sorted(self.total)
            },
            "reasons": dict(self.reasons.most_common()),
            "tasks": self.rows,
        }


def run_pass(
    label: str, tasks: list[Task], broken: dict[Path, str], root: Path, ctx: TaskContext
) -> Coverage:
    cov = Coverage(label)
    for task in tasks:
        ok, reason = support(task, ctx)
        cov.add(task.id, domain_of(task, root), ok, reason)
    for path, why in broken.items():
        cov.add(path.stem, path.parent.name, False, f"not a task file: {why}")
    return cov


def coverage(
    task_root: Path,
    ctx: TaskContext,
    assume_downloads: bool,
    test_list: dict[str, list[str]] | None = None,
) -> tuple[list[Coverage], dict[str, int]]:
    """The offline pass (the cache as it is) and, when asked, the pass with every download
    present; and how many tasks each app the image lacks blocks. With a test list, only the
    tasks it names count."""
    root = examples_dir(task_root)
    tasks, broken = list_tasks([root])
    if test_list is not None:
        tasks, broken = select_listed(tasks, broken, root, test_list)
    passes = [run_pass("offline (download cache as it is)", tasks, broken, root, ctx)]
    if assume_downloads:
        with tempfile.TemporaryDirectory(prefix="drums-coverage-cache-") as tmp:
            stand_in_cache(tasks, Path(tmp))
            with_files = ctx.model_copy(update={"cache_dir": Path(tmp)})
            passes.append(run_pass("downloads assumed present", tasks, broken, root, with_files))
    apps = missing_apps(tasks, ctx.apps) if ctx.apps is not None else {}
    return passes, apps


def render_table(passes: list[Coverage], apps: dict[str, int], image: str) -> str:
    """Markdown: supported / total per domain (one column per pass), then the reasons."""
    domains = sorted(set().union(*(p.total for p in passes)))
    head = "| domain | " + " | ".join(p.label for p in passes) + " |"
    lines = [head, "|---" * (len(passes) + 1) + "|"]
    for d in domains:
        cells = [f"{p.supported[d]} / {p.total[d]}" for p in passes]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    totals = [f"**{sum(p.supported.values())} / {sum(p.total.values())}**" for p in passes]
    lines.append("| **all** | " + " | ".join(totals) + " |")
    lines += ["", "| reason a task is unsupported (first found) | "]
    lines[-1] += " | ".join(p.label for p in passes) + " |"
    lines.append("|---" * (len(passes) + 1) + "|")
    kinds = sorted(
        set().union(*(p.reasons for p in passes)),
        key=lambda k: (-max(p.reasons[k] for p in passes), k),
    )
    for kind in kinds:
        cells = [str(p.reasons[kind]) for p in passes]
        lines.append(f"| {kind.replace('|', '/')} | " + " | ".join(cells) + " |")
    if apps:
        lines += ["", f"| app or schema image {image!r} lacks | tasks that need it |", "|---|---|"]
        lines += [f"| {name} | {n} |" for name, n in apps.items()]
    return "\n".join(lines) + "\n"


def _image_manifest(image: str, images_dir: Path) -> AppManifest | None:
    if image == "none":
        return None
    candidate = Path(image)
    root = candidate if candidate.is_absolute() else images_dir / image / "root"
    if not root.is_dir():
        raise SystemExit(
            f"drumsd tasks coverage: no image root at {root}; build it with `drumsd image build "
            f"--profile {image}`, give an image root, or --image none (apps unchecked)"
        )
    return manifest_for_root(root, "" if candidate.is_absolute() else image)


def _test_list_path(option: str | None, task_root: Path) -> Path | None:
    if option == "none":
        return None
    if option is not None:
        return Path(option)
    return default_test_list(task_root)


def add_coverage_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--osworld",
        type=Path,
        required=True,
        metavar="DIR",
        help="an OSWorld checkout (or any directory of OSWorld-format task files)",
    )
    parser.add_argument(
        "--assume-downloads",
        action="store_true",
        help="also count with every download present (stand-in files in a temporary cache)",
    )
    parser.add_argument(
        "--image",
        default=None,
        help="the image profile whose apps count (or an image root, or 'none'); default office, "
        "or the config's default_image",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="a drumsd config: its tasks block (cache, timeouts, verifier dirs) and images",
    )
    parser.add_argument(
        "--test-list",
        default=None,
        metavar="FILE|none",
        help="which tasks count: an OSWorld test list ({domain: [id, ...]}); default the "
        "checkout's evaluation_examples/test_all.json when there is one; 'none': every task file",
    )
    parser.add_argument("--images-dir", type=Path, default=Path("/var/cache/drums/images"))
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="the download cache the offline pass reads (default: the config's tasks.cache_dir)",
    )
    parser.add_argument(
        "--checker-venv", type=Path, default=None, help="a built checker venv (default: the pins')"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")


def main_coverage(args: argparse.Namespace) -> int:
    from .checker_venv import load_checker_venv

    task_root: Path = args.osworld
    if not task_root.is_dir():
        print(f"drumsd tasks coverage: {task_root} is not a directory", file=sys.stderr)
        return 2
    tasks_cfg = TasksConfig()
    if args.config is not None:  # the daemon's own tasks block: its cache, timeouts, verifiers
        from drumsd.linux.config_file import load_config_or_report

        config = load_config_or_report(args.config)
        if config is None:
            return 1
        tasks_cfg = config.tasks
        args.images_dir = config.images_dir
        args.image = args.image or config.default_image
    if args.cache_dir is not None:
        tasks_cfg = tasks_cfg.model_copy(update={"cache_dir": args.cache_dir})
    args.image = args.image or "office"
    manifest = _image_manifest(args.image, args.images_dir)
    venv = load_checker_venv(path=args.checker_venv or tasks_cfg.checker_venv)
    # The context the daemon would build (context_from_config), so the answers are the daemon's.
    ctx = TaskContext(
        cache_dir=tasks_cfg.cache_dir,
        verifier_dirs=list(tasks_cfg.verifier_dirs),
        setup_timeout_s=tasks_cfg.setup_timeout_s,
        eval_timeout_s=tasks_cfg.eval_timeout_s,
        screen_width=tasks_cfg.screen_width,
        screen_height=tasks_cfg.screen_height,
        apps=manifest,
        # As the bridge does: an image's apps give slot features (AT-SPI: the tree getter).
        capabilities=SLOT_FEATURES | features(manifest),
        metrics=venv.catalog if venv is not None else None,
    )
    list_path = _test_list_path(args.test_list, task_root)
    try:
        listed = read_test_list(list_path) if list_path is not None else None
    except ValueError as exc:
        print(
            f"drumsd tasks coverage: {exc}; give --test-list FILE or --test-list none",
            file=sys.stderr,
        )
        return 2
    passes, apps = coverage(task_root, ctx, args.assume_downloads, listed)
    if not sum(passes[0].total.values()):
        print(f"drumsd tasks coverage: no task files under {task_root}", file=sys.stderr)
        return 1
    which = f"the {sum(map(len, listed.values()))} of {list_path}" if listed else "every task file"
    print(f"tasks: {which} under {examples_dir(task_root)}; image: {args.image}; ", end="")
    print(f"checker venv: {venv.path if venv else 'not built (metrics count as unsupported)'}")
    print()
    print(render_table(passes, apps, args.image), end="")
    if args.json is not None:
        out = {
            "task_dir": str(examples_dir(task_root)),
            "test_list": str(list_path) if list_path is not None else None,
            "image": args.image,
            "image_apps": sorted(manifest.apps) if manifest else None,
            "checker_venv": str(venv.path) if venv else None,
            "passes": [p.to_json() for p in passes],
            "missing_apps": apps,
        }
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nJSON: {args.json}")
    return 0
