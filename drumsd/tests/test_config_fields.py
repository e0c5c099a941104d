"""Every config field is read by the daemon and documented; keys of the design's table read under
their names here are listed in docs/runtime.md."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from drumsd.core.config import Config
from drumsd.core.config_compat import rules
from pydantic import BaseModel

SRC = Path(__file__).resolve().parents[1] / "src" / "drumsd"
DOC = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"
CONFIG_NAMES = {"config", "cfg", "_config", "conf", "c"}


def fields(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(dotted key, block name or "", field name) of every leaf field."""
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from fields(ann, prefix + name + ".")
        else:
            yield prefix + name, prefix.rstrip("."), name


def blocks(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(dotted key, class) of every block, nested ones too (tasks.osworld)."""
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield prefix + name, ann
            yield from blocks(ann, prefix + name + ".")


def tail(node: ast.expr) -> str | None:
    """The last name of `a.b.c` (c) or of a plain name."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def reads(tree: ast.AST) -> set[tuple[str, str]]:
    """(block, field) pairs read in a module: `x.config.f` is ("", f), `x.quiesce.f` and
    `q.f` after `q = x.quiesce` (or a parameter typed QuiesceConfig) are ("quiesce", f)."""
    block_classes = {cls.__name__: dotted for dotted, cls in blocks(Config)}
    # A block's field name (at any depth, e.g. `osworld` in tasks.osworld) -> its dotted key.
    nested = {dotted.rsplit(".", 1)[-1]: dotted for dotted, _ in blocks(Config) if "." in dotted}
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Attribute):
                if value.attr in Config.model_fields:
                    aliases[target.id] = value.attr
                elif value.attr in nested:
                    aliases[target.id] = nested[value.attr]
        if isinstance(node, ast.arg) and node.annotation is not None:
            text = ast.unparse(node.annotation)
            for cls, block in block_classes.items():
                if re.search(rf"\b{cls}\b", text):
                    aliases[node.arg] = block
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = tail(node.value)
        if owner is None:
            continue
        if owner in CONFIG_NAMES:
            found.add(("", node.attr))
        if owner in Config.model_fields:
            found.add((owner, node.attr))
        if owner in nested:
            found.add((nested[owner], node.attr))
        if isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.add((aliases[node.value.id], node.attr))
    return found


def all_reads() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in SRC.rglob("*.py"):
        if path == SRC / "core" / "config.py":
            continue
        found |= reads(ast.parse(path.read_text(), str(path)))
    return found


def test_every_config_field_is_read_outside_the_model() -> None:
    found = all_reads()
    unread = [key for key, block, name in fields() if (block, name) not in found]
    assert not unread, (
        f"config fields parsed and never read: {unread}; make them take effect, or accept the "
        "key as unused with its reason in core/config_compat.py (and docs/runtime.md)"
    )


def test_the_reader_finds_a_field_nobody_reads() -> None:
    # The check above can fail: a module reading only quiesce.window_s does not count for
    # quiesce.poll_ms, and a plain variable named like a field is not a config read.
    tree = ast.parse("q = sup.config.quiesce\nx = q.window_s\ny = other.poll_ms\n")
    assert ("quiesce", "window_s") in reads(tree)
    assert ("quiesce", "poll_ms") not in reads(tree)


def doc_rows() -> dict[str, str]:
    section = DOC.read_text().split("## Daemon config fields", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z0-9_.]+)` \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def test_docs_list_every_field_with_its_default() -> None:
    rows = doc_rows()
    defaults = Config(token_file=Path("/t")).model_dump(mode="json")
    missing, wrong = [], []
    for key, _, _ in fields():
        if key not in rows:
            missing.append(key)
            continue
        if key == "token_file":
            continue
        value: object = defaults
        for part in key.split("."):
            assert isinstance(value, dict)
            value = value[part]
        shown = rows[key].strip("`")
        expected = (
            "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        )
        if shown != str(expected) and not (
            isinstance(value, float) and shown in (f"{value:g}", str(value))
        ):
            wrong.append(f"{key}: docs say {rows[key]!r}, model says {value!r}")
    assert not missing, f"docs/runtime.md's field table lacks {missing}"
    assert not wrong, wrong
    stale = sorted(set(rows) - {k for k, _, _ in fields()} - {r.key for r in rules()})
    assert not stale, f"docs/runtime.md lists fields the model does not have: {stale}"


def test_docs_list_every_key_read_under_another_name() -> None:
    section = DOC.read_text().split("### Keys of the design's table read under other names", 1)[1]
    missing = [r.key for r in rules() if f"`{r.key}`" not in section.split("\n## ", 1)[0]]
    assert not missing, f"docs/runtime.md does not list {missing}"
