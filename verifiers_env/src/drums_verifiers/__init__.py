"""drums desktops as environments for verifiers (v1 API: 0.4.x, or prime-rl's pinned commit).

`vf-eval drums-verifiers ...` finds the taskset, its fork-group env and its chat harness here.
The exports load lazily: importing verifiers is slow, and the test servers under
`drums_verifiers.testing` (and the adapters) must start without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drums_verifiers.env import DrumsEnv as DrumsEnv
    from drums_verifiers.harness import DrumsChatHarness as DrumsChatHarness
    from drums_verifiers.taskset import DrumsTaskset as DrumsTaskset
    from drums_verifiers.verdict import iter_trainable_traces as iter_trainable_traces

__all__ = ["DrumsChatHarness", "DrumsEnv", "DrumsTaskset", "iter_trainable_traces"]
_HOMES = {
    "DrumsChatHarness": "harness",
    "DrumsEnv": "env",
    "DrumsTaskset": "taskset",
    "iter_trainable_traces": "verdict",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'drums_verifiers' has no attribute {name!r}")
    from drums_verifiers.compat import require_v1

    require_v1()
    value = getattr(importlib.import_module(f"drums_verifiers.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
