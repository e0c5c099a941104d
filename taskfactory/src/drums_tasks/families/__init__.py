"""Task families, registered by app module."""

from __future__ import annotations

import importlib

from .registry import FAMILIES, Family

APP_MODULES = ("calc", "writer", "impress", "chromium", "gimp", "files", "multi")


def load_all() -> dict[str, Family]:
    for m in APP_MODULES:
        importlib.import_module(f"{__name__}.{m}")
    return FAMILIES


__all__ = ["FAMILIES", "Family", "load_all"]
