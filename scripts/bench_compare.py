"""Print two `drumsd bench` JSON results side by side with the after/before ratio per figure, and
write the comparison as JSON. Usage: bench_compare.py BEFORE.json AFTER.json OUT.json"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROWS = (
    ("create p50", ("create_s", "p50")),
    ("reset p50", ("reset_s", "p50")),
    ("reset p99", ("reset_s", "p99")),
    ("reset via spare p50", ("reset_spare_s", "p50")),
    ("reset via spare p99", ("reset_spare_s", "p99")),
    ("branch of 4 p50", ("branch", "4", "p50")),
    ("branch of 8 p50", ("branch", "8", "p50")),
    ("step+screenshot p50", ("step_screenshot_s", "p50")),
    ("step+screenshot p99", ("step_screenshot_s", "p99")),
    ("CPU per restore p50", ("restore_cpu_s", "p50")),
    ("cold boot p50", ("cold_boot_s", "p50")),
)


def pick(d: dict, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return float(d)


def main() -> int:
    before, after = (json.loads(Path(p).read_text()) for p in sys.argv[1:3])
    out = []
    print(f"{'figure (s)':24} {'before':>9} {'after':>9} {'after/before':>13}")
    for name, path in ROWS:
        b, a = pick(before, path), pick(after, path)
        ratio = round(a / b, 2) if a is not None and b else None
        out.append({"figure": name, "before": b, "after": a, "ratio_after_over_before": ratio})
        print(
            f"{name:24} {b if b is not None else '-':>9} {a if a is not None else '-':>9} "
            f"{ratio if ratio is not None else '-':>13}"
        )
    lb, la = before["host"].get("loadavg_end"), after["host"].get("loadavg_end")
    print(f"load average at end: before {lb}, after {la}")
    Path(sys.argv[3]).write_text(
        json.dumps({"rows": out, "before": before, "after": after}, indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
