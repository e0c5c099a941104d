"""The public namespace is exactly what the docs promise, and the error tree covers every code."""

from __future__ import annotations

import inspect

import drums
from drums import _exceptions, models

PUBLIC = {
    # clients and envs
    "connect", "aconnect", "Client", "AsyncClient", "Env", "AsyncEnv", "Forked", "Observation",
    "RetryPolicy", "Timeouts", "Secret", "__version__",
    # wire models people annotate with
    "Action", "Checkpoint", "SavedState", "GateReport", "StepResult", "VerifyResult", "models",
    # the action and gate vocabulary daemon, SDK and verifiers share (drums.vocabulary)
    "vocabulary",
    # errors
    "DrumsError", "ConnectionFailed", "Timeout", "BadResponse", "CleanupFailed", "Unauthorized",
    "NotFound", "EnvGone", "InvalidRequest", "UnsupportedTask", "ActionFailed", "Conflict",
    "NotQuiescent", "InvalidEpisode", "Quarantined", "Overloaded", "StateDirFull",
    "RestoreFailed", "CheckerFailed", "SetupFailed", "DaemonUnavailable", "ShuttingDown",
}  # fmt: skip


def test_public_names_are_exactly_the_documented_ones() -> None:
    names = {n for n in dir(drums) if not n.startswith("_") or n == "__version__"}
    names.discard("ray")  # drums.ray, the optional pool extra: an attribute once imported
    names.discard("osworld")  # drums.osworld, the DesktopEnv drop-in: likewise
    names.discard("mcp")  # drums.mcp, the MCP server extra: likewise
    names.discard("actions")  # drums.actions, the tool front ends' action layer: likewise
    names.discard("dialects")  # drums.dialects, vendors' computer tools -> actions: likewise
    assert names == PUBLIC


def test_public_classes_claim_the_public_module_path_only_via_reexport() -> None:
    # `from ._client import Client as Client`: defined privately, re-exported by name.
    assert drums.Client.__module__ == "drums._client"
    assert drums.AsyncClient.__module__ == "drums._async_client"
    assert drums.SavedState is models.Checkpoint


def test_every_daemon_error_code_has_its_own_exception_class() -> None:
    for code in models.ErrorCode:
        cls = _exceptions.ERROR_CLASSES[code.value]
        assert issubclass(cls, drums.DrumsError)
        assert cls.default_code == code.value
        assert getattr(drums, cls.__name__) is cls, f"{cls.__name__} is not public"
    assert set(_exceptions.ERROR_CLASSES) == {c.value for c in models.ErrorCode}
    assert set(models.ERROR_STATUS) == {c.value for c in models.ErrorCode}


def test_every_public_exception_is_a_drums_error_and_documented_in_the_tree() -> None:
    tree = inspect.getdoc(_exceptions) or ""
    for name in PUBLIC:
        obj = getattr(drums, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert issubclass(obj, drums.DrumsError)
            assert name in tree, f"{name} missing from the tree in _exceptions.py"


def test_quarantined_counts_as_an_invalid_episode() -> None:
    assert issubclass(drums.Quarantined, drums.InvalidEpisode)
    assert issubclass(drums.UnsupportedTask, drums.InvalidRequest)
    assert issubclass(drums.ShuttingDown, drums.DaemonUnavailable)
