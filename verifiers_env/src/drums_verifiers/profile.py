"""Timestamps along a tool call's path, for finding where a round trip goes (off by default).

With DRUMS_PROFILE=<file> set, the tool server and the drums-verifiers chat program append one
JSON line per mark: `{"t": wall clock, "pid", "who", "what", ...}`. Wall clock because the marks
come from three processes (vf-eval's interception server records its model calls with
`time.time()` too), so one file orders them. Stdlib only: this module is bundled verbatim into
the harness's chat program.
"""

import json
import os
import time
from typing import Any

PROFILE_ENV = "DRUMS_PROFILE"


def profile_mark(who: str, what: str, **fields: Any) -> None:
    """Append one mark to $DRUMS_PROFILE; nothing (one environment lookup) when it is unset."""
    path = os.environ.get(PROFILE_ENV)
    if not path:
        return
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "who": who, "what": what, **fields})
    # One write of a short line in append mode: lines from the processes do not interleave.
    with open(path, "a") as f:
        f.write(line + "\n")
