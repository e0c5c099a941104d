"""The daemon's version, read from the installed package's metadata: pyproject.toml is the one
place it is written (/v1/health, the OpenAPI document and the console report it)."""

from importlib.metadata import version

VERSION = version("drumsd")
