"""drums-tasks: a seeded desktop task factory with checkers, redundant checkers, oracle and
near-miss solutions, scope manifests, and a validator that proves them on a live drumsd host."""

from ._version import GENERATOR_VERSION as GENERATOR_VERSION
from ._version import VERIFIER_MODULE as VERIFIER_MODULE
from .build import build as build
from .build import generate as generate
from .families import FAMILIES as FAMILIES
from .families import load_all as load_all
from .spec import Solution as Solution
from .spec import TaskSpec as TaskSpec

__all__ = [
    "FAMILIES",
    "GENERATOR_VERSION",
    "VERIFIER_MODULE",
    "Solution",
    "TaskSpec",
    "build",
    "generate",
    "load_all",
]
