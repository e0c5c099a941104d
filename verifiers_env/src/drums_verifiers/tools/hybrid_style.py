"""The `hybrid` tool style: the GUI tools plus shell, file and app-launch tools.

The extra tools run on the same desktop as its user, through the step API's `execute` action,
so they see and change exactly what the GUI shows (and what the checker will read).
"""

import verifiers.v1 as vf

from drums_verifiers import actions
from drums_verifiers.compat import CallToolResult
from drums_verifiers.tools.drums_style import DrumsTools


class HybridTools(DrumsTools):
    @vf.tool
    async def shell(self, command: str) -> CallToolResult:
        """Run a bash command as the desktop user; returns exit code, stdout and stderr."""
        return await self.act(
            lambda: actions.shell(command, self.config.shell_timeout_s), screenshot=False
        )

    @vf.tool
    async def read_file(self, path: str) -> CallToolResult:
        """Read up to 20 kB of a file on the desktop."""
        return await self.act(lambda: actions.read_file(path), screenshot=False)

    @vf.tool
    async def write_file(self, path: str, content: str) -> CallToolResult:
        """Write a text file on the desktop (replacing it)."""
        return await self.act(lambda: actions.write_file(path, content), screenshot=False)

    @vf.tool
    async def launch_app(self, app: str) -> CallToolResult:
        """Start an application (e.g. 'libreoffice --calc', 'gedit notes.txt') and look."""
        return await self.act(lambda: actions.launch_app(app))


if __name__ == "__main__":
    HybridTools.run()
