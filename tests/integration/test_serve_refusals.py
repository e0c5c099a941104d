"""`drumsd serve` refuses unsafe starts in one line; check-config names the bad keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from drumsd_process import base_config, free_port, run_drumsd, write_token


def serve_with(tmp: Path, **overrides) -> tuple[int, str]:
    config = base_config(tmp, free_port(), **overrides)
    path = tmp / "drumsd.json"
    path.write_text(json.dumps(config))
    done = run_drumsd("serve", "--config", str(path), timeout=30)
    return done.returncode, done.stderr


def refusal_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("drumsd:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_missing_token_file(tmp_path: Path) -> None:
    code, err = serve_with(tmp_path)
    assert code != 0
    line = refusal_line(err)
    assert "refusing to start" in line and "does not exist" in line and "token" in line


def test_short_token(tmp_path: Path) -> None:
    write_token(tmp_path / "token", "short")
    code, err = serve_with(tmp_path)
    assert code != 0 and "fewer than 32" in refusal_line(err)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_token_readable_by_group_or_others(tmp_path: Path, mode: int) -> None:
    write_token(tmp_path / "token", mode=mode)
    code, err = serve_with(tmp_path)
    line = refusal_line(err)
    assert code != 0 and "group or others" in line and "chmod 600" in line


def test_non_loopback_listen_without_allow_remote(tmp_path: Path) -> None:
    write_token(tmp_path / "token")
    code, err = serve_with(tmp_path, listen="0.0.0.0:7070")
    assert code != 0
    line = refusal_line(err)
    assert "listen" in line and "allow_remote" in line


def test_directory_that_cannot_be_created(tmp_path: Path) -> None:
    write_token(tmp_path / "token")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, err = serve_with(tmp_path, journal_dir=str(blocker / "journal"))
    line = refusal_line(err)
    assert code != 0 and "journal_dir" in line and "cannot be created" in line


def test_check_config_names_every_bad_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {
                "token_file": "/etc/drums/token",
                "listne": "127.0.0.1:1",
                "vcpus": -1,
                "lease": {"env_idle_timeout_s": "soon"},
                "admission": {"bogus": 1},
            }
        )
    )
    done = run_drumsd("check-config", str(path))
    assert done.returncode != 0
    for key in ("listne: unknown key", "vcpus:", "lease.env_idle_timeout_s:", "admission.bogus"):
        assert key in done.stderr, done.stderr


def test_check_config_prints_the_effective_config(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({"token_file": "/etc/drums/token", "vcpus": 2}))
    done = run_drumsd("check-config", str(path))
    assert done.returncode == 0, done.stderr
    effective = json.loads(done.stdout)
    assert effective["vcpus"] == 2 and effective["lease"]["reap_interval_s"] == 15
    defaults = json.loads(run_drumsd("check-config", "--defaults").stdout)
    assert "token_file" not in defaults and defaults["listen"] == "127.0.0.1:7070"
    bad = tmp_path / "broken.json"
    bad.write_text("{nope")
    done = run_drumsd("check-config", str(bad))
    assert done.returncode != 0 and "not valid JSON" in done.stderr


def test_listen_port_in_use(tmp_path: Path) -> None:
    import socket

    write_token(tmp_path / "token")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = serve_with(tmp_path, listen=f"127.0.0.1:{port}")
    line = refusal_line(err)
    assert code != 0 and "cannot listen" in line
