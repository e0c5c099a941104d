"""The config file read from disk: the model validated from its text (core/config.py), and for a
command line each problem printed as `path: problem`. Here, below tasks/ and serve, so every
command that takes --config reads it the same way."""

from __future__ import annotations

import sys
from pathlib import Path

from drumsd.core.config import Config, ConfigError, config_with_notices, json_object


def load_config(path: Path) -> Config:
    return load_config_with_notices(path)[0]


def load_config_with_notices(path: Path) -> tuple[Config, list[str]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read the config file: {exc.strerror}"]) from None
    return config_with_notices(json_object(text, str(path)), str(path))


def load_config_or_report(path: Path, prefix: str = "") -> Config | None:
    """load_config for a command line: each problem printed to stderr as `path: problem`
    (after `prefix`), None when the config is refused; each notice of a documented key read
    under its name here as `path: notice: ...`."""
    try:
        config, notices = load_config_with_notices(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{prefix}{exc.path}: {problem}", file=sys.stderr)
        return None
    for notice in notices:
        print(f"{prefix}{path}: notice: {notice}", file=sys.stderr)
    return config
