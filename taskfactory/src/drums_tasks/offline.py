"""Score a solution's simulated outcome on local files, without a desktop.

This checks the checkers' logic (and the scope manifest) against what each solution is meant to
leave behind; the live validator checks the same against what the apps really write.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import verifier
from .spec import Solution, TaskSpec


@dataclass
class OfflineResult:
    score: float
    score_alt: float
    scope_violations: list[str]


def final_state(spec: TaskSpec, solution: Solution | None) -> dict[str, bytes]:
    state = dict(spec.files)
    if solution is not None:
        if solution.simulate is None:
            raise ValueError(f"{spec.family}: solution {solution.name} cannot be simulated")
        for path, data in solution.simulate(dict(spec.files)).items():
            if data is None:
                state.pop(path, None)
            else:
                state[path] = data
    return state


def evaluate(spec: TaskSpec, seeded: dict[str, str], solution: Solution | None) -> OfflineResult:
    """Score `solution` (None: do nothing) with check, check_alt and the scope rule."""
    state = final_state(spec, solution)
    with tempfile.TemporaryDirectory(prefix="drums-offline-") as tmp:
        paths: dict[str, str | None] = {}
        for vm_path, dest in spec.results:
            if vm_path in state:
                local = Path(tmp) / dest
                local.write_bytes(state[vm_path])
                paths[dest] = str(local)
            else:
                paths[dest] = None
        score = verifier.CHECKS[spec.check](paths, spec.options)
        alt = verifier.CHECKS[spec.check_alt](paths, spec.options)
    current = {p: hashlib.sha256(b).hexdigest() for p, b in state.items()}
    scope = {"roots": spec.roots, "seeded": seeded, "allow": spec.allow}
    return OfflineResult(score, alt, verifier.scope_violations(scope, current))
