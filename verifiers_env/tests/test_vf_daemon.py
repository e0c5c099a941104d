"""Which daemon and token each entry point uses, the package's declared imports, no import cycle."""

from __future__ import annotations

import ast
import logging
import sys
from importlib import metadata
from pathlib import Path

import pytest
from drums_verifiers.config import DaemonConfig, DrumsTaskConfig
from drums_verifiers.daemon import DaemonSettingsError, resolve_daemon

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "drums_verifiers"


@pytest.fixture()
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("file-token\n")
    return path


def test_explicit_config_beats_environment(token_file: Path) -> None:
    env = {"DRUMS_URL": "http://127.0.0.1:9001", "DRUMS_TOKEN": "env-token"}
    daemon = resolve_daemon("http://127.0.0.1:9002", token_file=token_file, environ=env)
    assert daemon.url == "http://127.0.0.1:9002" and daemon.url_source == "config"
    assert daemon.require_token().reveal() == "file-token"
    assert daemon.token_source == f"{token_file} (config)"
    explicit = resolve_daemon(token="value", token_file=token_file, environ=env)
    assert explicit.require_token().reveal() == "value"
    assert explicit.token_source == "config token"


def test_environment_beats_defaults(token_file: Path) -> None:
    env = {"DRUMS_URL": "http://127.0.0.1:9001/", "DRUMS_TOKEN_FILE": str(token_file)}
    daemon = resolve_daemon(environ=env)
    assert (daemon.url, daemon.url_source) == ("http://127.0.0.1:9001", "DRUMS_URL")
    assert daemon.require_token().reveal() == "file-token"
    assert daemon.token_source == f"{token_file} (DRUMS_TOKEN_FILE)"
    with_value = resolve_daemon(environ={**env, "DRUMS_TOKEN": "env-token"})
    assert with_value.require_token().reveal() == "env-token"
    assert with_value.token_source == "DRUMS_TOKEN" and with_value.token_file is None


def test_defaults_and_a_clear_error_without_token(tmp_path: Path) -> None:
    daemon = resolve_daemon(environ={"DRUMS_TOKEN_FILE": str(tmp_path / "absent")})
    assert (daemon.url, daemon.url_source) == ("http://127.0.0.1:7070", "default")
    assert daemon.token is None
    with pytest.raises(DaemonSettingsError) as err:
        daemon.require_token("set --env.taskset.task.daemon.token-file")
    message = str(err.value)
    assert str(tmp_path / "absent") in message and "DRUMS_TOKEN_FILE" in message
    assert "--env.taskset.task.daemon.token-file" in message
    assert resolve_daemon(environ={}).url == "http://127.0.0.1:7070"


def test_first_log_line_names_the_sources_never_the_token(
    token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="drums_verifiers.daemon")
    env = {"DRUMS_URL": "http://127.0.0.1:9011", "DRUMS_TOKEN": "sekrit-value"}
    resolve_daemon(environ=env)
    resolve_daemon(environ=env)  # the same setting again: logged once
    lines = [r.getMessage() for r in caplog.records if r.name == "drums_verifiers.daemon"]
    assert lines == ["drumsd http://127.0.0.1:9011 (from DRUMS_URL), token from DRUMS_TOKEN"]
    assert "sekrit" not in caplog.text


def test_daemon_config_falls_back_to_environment(
    token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRUMS_URL", "http://127.0.0.1:9021")
    monkeypatch.setenv("DRUMS_TOKEN_FILE", str(token_file))
    monkeypatch.delenv("DRUMS_TOKEN", raising=False)
    config = DrumsTaskConfig()
    assert config.daemon.url is None and config.daemon.token_file is None
    daemon = config.daemon.resolve()
    assert daemon.url == "http://127.0.0.1:9021"
    assert daemon.require_token().reveal() == "file-token"
    # The tool servers get the resolved URL and file written into their config.
    pinned = config.tools_config().daemon
    assert (pinned.url, pinned.token_file) == ("http://127.0.0.1:9021", token_file)
    explicit = DaemonConfig(url="http://127.0.0.1:9022", token_file=token_file)
    assert explicit.resolve().url == "http://127.0.0.1:9022"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_imported_package_is_declared() -> None:
    """Each third-party import of the package (eager or lazy) is in its dependencies or in
    the extra of the adapter that imports it. The chat program is a uv script with its own."""
    requires = metadata.requires("drums-verifiers") or []
    declared: dict[str, set[str]] = {}
    for req in requires:
        name = req.split(";")[0].split("[")[0]
        for stop in "<>=!~ ":
            name = name.split(stop)[0]
        extra = req.split("extra ==")[1].strip().strip("\"'") if "extra ==" in req else ""
        declared.setdefault(extra, set()).add(name.strip().lower().replace("_", "-"))
    dists = metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names) | {"drums_verifiers", "__future__"}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "chat_program.py":
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        allowed = set(declared.get("", set()))
        for extra in ("verl", "skyrl"):
            if extra in rel:
                allowed |= declared.get(extra, set())
        for module in sorted(_imports(path) - stdlib):
            owners = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
            if module == "drums":
                owners = {"drums-sdk"}
            if not owners & allowed:
                missing.append(f"{rel}: {module} ({', '.join(sorted(owners))})")
    assert not missing, "imported but not declared in verifiers_env/pyproject.toml: " + "; ".join(
        missing
    )


def test_tools_do_not_import_the_task_module() -> None:
    """task.py names the toolsets; the toolsets must not import task.py back (issue 16)."""
    for path in sorted((PACKAGE / "tools").glob("*.py")):
        text = path.read_text()
        assert (
            "drums_verifiers.task" not in text and "from drums_verifiers import task" not in text
        ), path.name


def test_ray_mode_needs_no_token_and_refuses_an_address(tmp_path: Path) -> None:
    absent = {"DRUMS_TOKEN_FILE": str(tmp_path / "absent")}
    for daemon in (
        resolve_daemon("ray://", environ=absent),
        resolve_daemon(environ={**absent, "DRUMS_URL": "ray://"}),
    ):
        assert daemon.ray and daemon.url == "ray://" and daemon.missing is None
        assert "ray mode" in daemon.describe()
    assert not resolve_daemon("http://127.0.0.1:9002", environ=absent).ray
    with pytest.raises(DaemonSettingsError, match="ray mode is exactly 'ray://'"):
        resolve_daemon("ray://head:10001", environ=absent)
    with pytest.raises(DaemonSettingsError, match="DRUMS_URL is 'ray://x'"):
        resolve_daemon(environ={"DRUMS_URL": "ray://x"})


def test_the_verifiers_env_refuses_ray_mode_and_names_the_gateway() -> None:
    with pytest.raises(DaemonSettingsError, match="drums pool serve"):
        DaemonConfig(url="ray://").resolve()


def test_a_wrong_token_names_where_it_came_from(fake_host, tmp_path: Path) -> None:
    """A 401's message names the token's real source (DRUMS_TOKEN_FILE and its path), not
    "the token argument" (the SDK is handed the token as a value)."""
    import drums

    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token-" + "y" * 32)
    environ = {"DRUMS_URL": fake_host.url, "DRUMS_TOKEN_FILE": str(wrong)}
    daemon = resolve_daemon(environ=environ, announce=False)
    with daemon.connect() as client, pytest.raises(drums.Unauthorized) as caught:
        client.tasks()
    message = str(caught.value)
    assert f"{wrong} (DRUMS_TOKEN_FILE)" in message, message
    assert "the token argument" not in message, message
