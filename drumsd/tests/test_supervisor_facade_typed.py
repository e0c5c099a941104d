"""The supervisor's facade answers typed results (core/results.py dataclasses, records or wire
models), never a dict of Any: the routes read fields a type checker sees, not keys the runtime
happens to write (issue 31)."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

from drumsd.runtime.supervisor import Supervisor


def untyped(hint: Any) -> bool:
    """Any, or a mapping whose values are Any, anywhere in a union or a tuple."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (dict, typing.Mapping, typing.MutableMapping) or (
        isinstance(origin, type) and issubclass(origin, dict)
    ):
        return len(args) == 2 and args[1] is Any
    if origin in (typing.Union, types.UnionType, tuple, list):
        return any(untyped(a) for a in args)
    return False


def facade() -> dict[str, Any]:
    return {
        name: fn
        for name, fn in inspect.getmembers(Supervisor, inspect.isfunction)
        if not name.startswith("_")
    }


def test_the_check_sees_an_untyped_dict() -> None:
    assert untyped(dict[str, Any]) and untyped(dict[str, Any] | None)
    assert untyped(tuple[int, dict[str, Any]]) and untyped(Any)
    assert not untyped(dict[str, int]) and not untyped(dict[str, list[str]])


def test_every_public_method_of_the_facade_answers_a_typed_result() -> None:
    methods = facade()
    assert {"step", "health", "fork", "metrics_report", "admission_state"} <= set(methods)
    missing = [name for name, fn in methods.items() if "return" not in fn.__annotations__]
    assert not missing, f"facade methods without a return annotation: {missing}"
    loose = {
        name: hint
        for name, fn in methods.items()
        if untyped(hint := typing.get_type_hints(fn)["return"])
    }
    assert not loose, (
        f"facade methods answering a dict of Any: {loose}; return a dataclass of "
        "drumsd.core.results or a drums.models wire model"
    )
