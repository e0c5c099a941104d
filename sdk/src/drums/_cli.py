"""The `drums` command: `drums mcp ...` serves desktops as MCP tools, `drums pool ...` is Ray's."""

from __future__ import annotations

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["mcp"]:
        from .mcp import main as mcp_main

        return mcp_main(args[1:])
    from .ray._cli import main as pool_main

    return pool_main(args)


if __name__ == "__main__":
    sys.exit(main())
