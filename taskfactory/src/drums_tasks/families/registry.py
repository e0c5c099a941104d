"""The family table: name -> (app, generator). Families register themselves on import."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from ..spec import TaskSpec

Generator = Callable[[random.Random], TaskSpec]


@dataclass(frozen=True)
class Family:
    name: str
    app: str
    generate: Generator


FAMILIES: dict[str, Family] = {}


def family(name: str, app: str) -> Callable[[Generator], Generator]:
    def register(fn: Generator) -> Generator:
        if name in FAMILIES:
            raise ValueError(f"family {name!r} registered twice; rename one of them")

        def generate(rng: random.Random) -> TaskSpec:
            spec = fn(rng)
            spec.family = name
            spec.app = app
            return spec

        FAMILIES[name] = Family(name, app, generate)
        return fn

    return register
