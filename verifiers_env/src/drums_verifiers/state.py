"""The rollout state shared between the task (this process) and the per-rollout tool servers.

Its own module so that the tool servers (tools/) and the task (task.py) both depend on it and
not on each other: the task names its toolset classes, the toolsets read this state.
"""

from __future__ import annotations

import verifiers.v1 as vf
from pydantic import Field


class DrumsState(vf.State):
    """Shared with the tool servers (pulled and pushed around every tool call)."""

    env_id: str | None = None
    fork_parent: str | None = None
    fork_index: int | None = None
    screen: list[int] = Field(default_factory=lambda: [1920, 1080])
    cursor: list[int] | None = None
    actions: dict[str, int] = Field(default_factory=dict)
    terminal: str | None = None
    """'done' or 'fail' once the agent ended the episode."""
    tool_s: list[float] = Field(default_factory=list)
    """Seconds each tool call spent on the desktop (step + screenshot), in call order."""
    env_failed: str | None = None
    """Set by a tool server when the daemon or desktop failed; ends the rollout."""
