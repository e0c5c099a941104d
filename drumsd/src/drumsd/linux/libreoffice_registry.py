"""LibreOffice's system-wide registry fragments (an .xcd under /etc/libreoffice/registry) that
the image profiles install: one document shape, the settings inside it differing."""

from __future__ import annotations

XCD_HEAD = """\
<?xml version="1.0" encoding="UTF-8"?>
<oor:data xmlns:xs="http://www.w3.org/2001/XMLSchema"
          xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
          xmlns:oor="http://openoffice.org/2001/registry">
<dependency file="main"/>
"""


def xcd(components: str) -> str:
    """An .xcd holding `components` (its <oor:component-data> elements, one per line)."""
    return XCD_HEAD + components + "</oor:data>\n"
