"""Where url and token come from, and that the token never shows in a repr, log or exception."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
from sdk_harness import TOKEN, Daemon

import drums
from drums._config import DEFAULT_URL, Secret, resolve_settings


def test_arguments_win_over_the_environment(tmp_path: Path) -> None:
    env = {"DRUMS_URL": "http://env:1/", "DRUMS_TOKEN": "from-env"}
    s = resolve_settings("http://arg:2/", "from-arg", None, env)
    assert s.url == "http://arg:2"
    assert s.token == Secret("from-arg")


def test_environment_then_token_file_then_nothing(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    s = resolve_settings(None, None, None, {"DRUMS_TOKEN": " from-env "})
    assert (s.url, s.token, s.token_source) == (DEFAULT_URL, Secret("from-env"), "DRUMS_TOKEN")
    s = resolve_settings(None, None, None, {"DRUMS_TOKEN_FILE": str(token_file)})
    assert s.token == Secret("from-file")
    assert s.token_source == str(token_file)
    s = resolve_settings(None, None, None, {"DRUMS_TOKEN_FILE": str(tmp_path / "absent")})
    assert s.token is None
    assert "absent" in s.token_source


def test_the_secret_hides_itself() -> None:
    secret = Secret(TOKEN)
    assert TOKEN not in repr(secret) and TOKEN not in str(secret) and TOKEN not in f"{secret}"
    with pytest.raises(TypeError):
        pickle.dumps(secret)


def test_the_token_is_in_no_repr_log_line_or_exception(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen = []
    daemon.faults.error("POST", "/v1/slots", "overloaded", headers={"Retry-After": "0"}, times=1)
    with daemon.client() as client:
        seen.append(repr(client))
        env = client.create(task="task-ok")
        seen += [repr(env), repr(env.slot), repr(env.observe())]
        with pytest.raises(drums.NotFound) as not_found:
            client.attach("nope")
        seen += [str(not_found.value), repr(not_found.value)]
    with daemon.client(token="wrong-" + TOKEN[:8]) as bad:
        with pytest.raises(drums.Unauthorized) as unauthorized:
            bad.list_envs()
        seen += [str(unauthorized.value), repr(unauthorized.value), repr(bad)]
    text = "\n".join(seen) + caplog.text
    assert "overloaded" in caplog.text  # the retry was logged ...
    assert TOKEN not in text and TOKEN[:8] not in text  # ... and no token anywhere


def test_unauthorized_says_where_the_token_was_looked_for(daemon: Daemon, tmp_path: Path) -> None:
    with daemon.client(token=None, token_file=tmp_path / "missing") as client:
        assert client.ping() is True  # /healthz needs no token
        with pytest.raises(drums.Unauthorized, match="DRUMS_TOKEN") as err:
            client.health()
    assert "missing" in str(err.value)
    assert err.value.status == 401
