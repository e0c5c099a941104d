"""Serve the fake daemon app over a real loopback socket (hypercorn), for tests that run the
examples as separate processes: `python sdk_serve_fake.py PORT TOKEN_FILE`."""

from __future__ import annotations

import sys
from pathlib import Path

import trio
from fake_app import FakeDaemon
from hypercorn.config import Config
from hypercorn.trio import serve


def main() -> None:
    port, token_file = int(sys.argv[1]), Path(sys.argv[2])
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    trio.run(serve, FakeDaemon(token=token_file.read_text().strip()), config)


if __name__ == "__main__":
    main()
