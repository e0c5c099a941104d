"""The documented config file, read as this implementation names it.

The design's field table (DESIGN.md, "Configuration") names a few keys differently from this
daemon's model, or names parts this implementation does not have. A config written from that
table is accepted: each such key is mapped to its name here with a one-line notice, or accepted
with a notice saying why it is unused; a key that cannot be carried over is a problem naming it.
Pure: a dict in, a dict, notices and problems out (core/config.py validates the rest).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The runtime's block in the documented file: its keys are top-level fields here.
OSW_BLOCK = "osw"
OSW_KEYS = (
    "lower",
    "image_sha256",
    "criu",
    "vcpus",
    "memory_mib",
    "swap_mib",
    "port_base",
    "slot_range",
    "max_concurrent_restores",
    "natural_exits",
    "alive_after_s",
    "max_attempts",
    "warm_upper",
    "async_kill",
    "restore_cpu_boost",
)

# Documented keys this implementation accepts and does not use, and why.
UNUSED: dict[str, str] = {
    "quiesce.confirm_s": "quiesce.window_s is the one quiet period (kernel process events prove "
    "it), so there is no second confirmation wait",
    "py_src": "the guest's code ships inside the desktop image here, not from a host source dir",
    "nested_pidns": "a slot cannot keep an app in namespaces of its own: the desktop user's "
    "seccomp lock refuses unshare (EPERM), and CRIU 4.2.1 fails a dump with \"Can't dump nested "
    'user namespace" / "Can\'t dump nested pid namespace" and a restore of a nested net '
    'namespace with "Can\'t restore sub-task in NS (cflags 40000080)"; such a capture is a 409 '
    'conflict naming the process (docs/runtime.md, "Nested namespaces")',
}


@dataclass
class Translation:
    raw: dict[str, Any]
    notices: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Rule:
    """One documented key and what becomes of it here (for `check-config --explain`)."""

    key: str
    status: str  # "renamed" | "unused" | "reshaped"
    here: str  # the name (or shape) here, or why unused


def translate(raw: dict[str, Any]) -> Translation:
    """The documented file's keys as this model names them (a new dict; `raw` is untouched)."""
    out = Translation(dict(raw))
    for fix in (_osw_block, _unused_keys, _extra_ports_list, _forgotten_dir_null):
        fix(out)
    return out


def rules() -> list[Rule]:
    """Every mapping `translate` applies, as a table."""
    table = [Rule(f"{OSW_BLOCK}.{k}", "renamed", k) for k in OSW_KEYS]
    table += [Rule(k, "unused", why) for k, why in UNUSED.items()]
    table.append(Rule("extra_ports (a list)", "reshaped", "[] reads as {}: guest port -> base"))
    table.append(Rule("forgotten_dir: null", "reshaped", "the default /var/lib/drums/forgotten"))
    return table


def _osw_block(out: Translation) -> None:
    block = out.raw.pop(OSW_BLOCK, None)
    if block is None:
        return
    if not isinstance(block, dict):
        out.problems.append(f"{OSW_BLOCK}: must be an object of runtime fields")
        return
    for key, value in block.items():
        where = f"{OSW_BLOCK}.{key}"
        if key not in OSW_KEYS:
            out.problems.append(
                f"{where}: unknown key (the block's keys are {', '.join(OSW_KEYS)})"
            )
        elif key in out.raw and out.raw[key] != value:
            out.problems.append(
                f"{where}: set to {value!r} while top-level {key} is {out.raw[key]!r}; keep one"
            )
        else:
            out.raw[key] = value
            out.notices.append(f"{where}: read as top-level `{key}` (its name here)")


def _unused_keys(out: Translation) -> None:
    for dotted, why in UNUSED.items():
        if _pop(out.raw, dotted):
            out.notices.append(f"{dotted}: accepted and unused: {why}")


def _extra_ports_list(out: Translation) -> None:
    value = out.raw.get("extra_ports")
    if not isinstance(value, list):
        return
    if value:
        out.problems.append(
            "extra_ports: a list of ports has no host bases; write a mapping "
            '{"<guest port>": <host base>} (slot N\'s is at 127.0.0.1:base+N)'
        )
        return
    out.raw["extra_ports"] = {}
    out.notices.append("extra_ports: [] read as {} (a mapping guest port -> host base here)")


def _forgotten_dir_null(out: Translation) -> None:
    if "forgotten_dir" in out.raw and out.raw["forgotten_dir"] is None:
        del out.raw["forgotten_dir"]
        out.notices.append(
            "forgotten_dir: null read as the default /var/lib/drums/forgotten (destroyed slots' "
            "records are always kept here; retention caps their size)"
        )


def _pop(data: dict[str, Any], dotted: str) -> bool:
    """Remove `dotted` (a.b) from `data` (copying the inner block); True when it was there."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return data.pop(head, _MISSING) is not _MISSING
    inner = data.get(head)
    if not isinstance(inner, dict) or rest not in inner:
        return False
    data[head] = {k: v for k, v in inner.items() if k != rest}
    return True


_MISSING = object()
