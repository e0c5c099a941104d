"""The dump error naming a process in a nested namespace (linux/criu.py, pure)."""

from __future__ import annotations

from drumsd.linux import criu


def test_the_nested_namespace_and_process_are_read_from_criu_errors() -> None:
    errors = [
        "(00.069366) Error (criu/namespaces.c:460): Can't dump nested user namespace for 11381",
        "(00.069366) Error (criu/namespaces.c:754): Can't make userns id",
    ]
    assert criu.nested_namespace(errors) == ("user", 11381)
    pid_ns = ["(00.1) Error (criu/namespaces.c:460): Can't dump nested pid namespace for 7430"]
    assert criu.nested_namespace(pid_ns) == ("pid", 7430)


def test_other_dump_errors_are_not_a_nested_namespace() -> None:
    assert criu.nested_namespace(["(00.2) Error (criu/cr-dump.c:1975): Dumping FAILED."]) is None
    assert criu.nested_namespace([]) is None
