"""What a family produces for one task, and how it becomes the OSWorld-format JSON lines."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._version import GENERATOR_VERSION, VERIFIER_MODULE
from .actions import Action

# Changed files of a solution, by desktop path; None means the file was deleted.
Effects = dict[str, bytes | None]
# A pure function from the seeded inputs (desktop path -> bytes) to a solution's final effects:
# lets tests check the checkers on files without a desktop.
Simulator = Callable[[dict[str, bytes]], Effects]


@dataclass
class Solution:
    name: str
    actions: list[Action]
    simulate: Simulator | None = None
    why: str = ""


@dataclass
class TaskSpec:
    family: str
    app: str  # OSWorld snapshot / app name
    instruction: str
    files: dict[str, bytes]  # desktop path -> seeded bytes
    launch: list[dict[str, Any]]  # OSWorld config steps run after the files are placed
    results: list[tuple[str, str]]  # (desktop path, dest key of `paths`)
    check: str
    check_alt: str
    options: dict[str, Any]
    roots: list[str]
    allow: list[str]
    oracle: Solution
    near_misses: list[Solution]
    decoy: str  # a seeded file under the roots that no solution may touch (the scope probe does)
    related_apps: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)  # extra directories to create before upload


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def asset_name(task_id: str, path: str) -> str:
    return f"{task_id}/{posixpath.basename(path)}"


def scope_probe(spec: TaskSpec) -> Solution:
    """The oracle plus one write outside the allowed globs: scores as the oracle, and is flagged."""
    from .actions import shell

    line = "scope probe\n"
    oracle_sim = spec.oracle.simulate

    def simulate(inputs: dict[str, bytes]) -> Effects:
        eff = dict(oracle_sim(inputs)) if oracle_sim else {}
        eff[spec.decoy] = inputs[spec.decoy] + line.encode()
        return eff

    return Solution(
        "scope_probe",
        [*spec.oracle.actions, shell(f"printf '{line.strip()}\\n' >> '{spec.decoy}'")],
        simulate,
        why=f"oracle, then appends to {spec.decoy}, which no allowed glob covers",
    )


def task_json(spec: TaskSpec, task_id: str, seed: int, index: int) -> dict[str, Any]:
    names = [posixpath.basename(p) for p in spec.files]
    if len(set(names)) != len(names):
        raise ValueError(f"{spec.family}: two seeded files share a name in {sorted(spec.files)}")
    dirs = sorted({posixpath.dirname(p) for p in spec.files} | set(spec.dirs))
    config: list[dict[str, Any]] = [
        {"type": "execute", "parameters": {"command": ["mkdir", "-p", *dirs]}},
        {
            # drumsd's drums_files step: sources are <assets_dir>/<task id>/<src>, placed owned by
            # the desktop user (the agent must be able to save over them).
            "type": "drums_files",
            "parameters": {
                "files": [{"src": posixpath.basename(p), "path": p} for p in sorted(spec.files)]
            },
        },
        *spec.launch,
    ]
    results = [{"type": "vm_file", "path": p, "dest": d} for p, d in spec.results]
    seeded = {
        p: sha256(b)
        for p, b in sorted(spec.files.items())
        if any(p.startswith(r.rstrip("/") + "/") for r in spec.roots)
    }
    return {
        "id": task_id,
        "snapshot": spec.app,
        "instruction": spec.instruction,
        "source": f"drums-tasks {GENERATOR_VERSION} seed={seed} family={spec.family} index={index}",
        "config": config,
        "related_apps": spec.related_apps or [spec.app],
        "evaluator": {
            "func": "drums_verifier",
            "module": VERIFIER_MODULE,
            "check": spec.check,
            "check_alt": spec.check_alt,
            "options": spec.options,
            "result": results[0] if len(results) == 1 else results,
            "scope": {"roots": spec.roots, "seeded": seeded, "allow": spec.allow},
        },
        "proxy": False,
        "fixed_ip": False,
        "possibility_of_env_change": "low",
        "drums": {
            "generator": GENERATOR_VERSION,
            "seed": seed,
            "family": spec.family,
            "index": index,
        },
    }


def solutions_json(spec: TaskSpec, task_id: str) -> dict[str, Any]:
    probe = scope_probe(spec)

    def one(s: Solution) -> dict[str, Any]:
        return {"name": s.name, "why": s.why, "actions": s.actions}

    return {
        "id": task_id,
        "family": spec.family,
        "oracle": one(spec.oracle),
        "near_misses": [one(s) for s in spec.near_misses],
        "scope_probe": one(probe),
        "expect": {
            "oracle": 1.0,
            "near_miss": 0.0,
            "noop": 0.0,
            "scope_probe_flag": "scope_violation",
        },
    }
