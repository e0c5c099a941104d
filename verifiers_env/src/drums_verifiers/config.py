"""The knobs of the drums taskset, its tasks and its tool servers, as verifiers config classes.

Where a field lives decides who can read it: the taskset config is read at load time and by the
fork-group env; the task config rides to every rollout and to the per-rollout tool servers
(`--env.taskset.task.*`); the tool server config is the subset a tool server process needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import verifiers.v1 as vf
from pydantic import Field
from pydantic_config import BaseConfig

from drums_verifiers.daemon import Daemon, DaemonSettingsError, resolve_daemon

ToolStyle = Literal["drums", "scalecua", "hybrid", "anthropic", "openai"]
ScreenshotFormat = Literal["png", "jpeg", "webp"]
TOKEN_HINT = "set --env.taskset.task.daemon.token-file (env.taskset.task.daemon.token_file)"


class DaemonConfig(BaseConfig):
    """How to reach drumsd. Unset fields fall back to DRUMS_URL / DRUMS_TOKEN_FILE / DRUMS_TOKEN,
    then to http://127.0.0.1:7070 and /etc/drums/token (`drums_verifiers.daemon`). The token is
    read from `token_file` at use, never stored here."""

    url: str | None = None
    token_file: Path | None = None

    def resolve(self, announce: bool = True) -> Daemon:
        daemon = resolve_daemon(url=self.url, token_file=self.token_file, announce=False)
        if daemon.ray:
            # Each rollout's tool servers attach to its env by id from their own processes,
            # which a Ray pool's envs (held by the rollout's actors) cannot serve.
            raise DaemonSettingsError(
                f"the verifiers env does not run in a Ray job, so ray mode ({daemon.url}) does "
                "not apply: set daemon.url (or DRUMS_URL) to the pool's gateway, the URL of "
                "`drums pool serve`, and daemon.token_file to its token"
            )
        if announce:
            daemon.announce()
        return daemon

    def check_token_file(self) -> None:
        """Fail early, naming the setting, instead of deep inside the SDK."""
        self.resolve(announce=False).require_token(TOKEN_HINT)

    def pinned(self) -> DaemonConfig:
        """This config with the resolved URL and token file written in, for the tool servers
        (which may run where this process's environment does not reach). A token that came from
        DRUMS_TOKEN stays out of the config: the tool server reads its own environment."""
        daemon = self.resolve(announce=False)
        return DaemonConfig(url=daemon.url, token_file=daemon.token_file)


class DesktopToolsConfig(vf.ToolsetConfig):
    """What a per-rollout tool server needs: where the daemon is and how to show the screen."""

    daemon: DaemonConfig = DaemonConfig()
    screenshot_scale: float = Field(1.0, gt=0, le=1)
    """Screenshots are resized by this factor before the model sees them; the model's
    coordinates are mapped back to screen pixels by the same factor."""
    screenshot_format: ScreenshotFormat = "png"
    screenshot_quality: int | None = Field(None, ge=1, le=100)
    step_timeout_s: float = Field(60.0, gt=0)
    shell_timeout_s: float = Field(60.0, gt=0, le=600)


class DrumsTaskConfig(vf.TaskConfig):
    """Per-rollout behaviour (`--env.taskset.task.*`)."""

    daemon: DaemonConfig = DaemonConfig()
    tool_style: ToolStyle = "drums"
    max_turns: int = Field(30, ge=1)
    """The rollout stops after this many model turns (a `@vf.stop`)."""
    screenshot_scale: float = Field(1.0, gt=0, le=1)
    screenshot_format: ScreenshotFormat = "png"
    """What the tool results' screenshots are: png (lossless), or jpeg / webp (fewer bytes
    through the harness and into the model's context). The daemon encodes and scales them."""
    screenshot_quality: int | None = Field(None, ge=1, le=100)
    """jpeg / webp quality; unset takes the daemon's default (80)."""
    wait_valid_timeout_s: float = Field(120.0, gt=0)
    verify_timeout_s: float = Field(300.0, gt=0)
    idle_timeout_s: float = Field(900.0, gt=0)
    """Backstop lease: the daemon reaps an env nobody touched for this long, even if this
    process died without closing it."""

    def tools_config(self) -> DesktopToolsConfig:
        return DesktopToolsConfig(
            daemon=self.daemon.pinned(),
            screenshot_scale=self.screenshot_scale,
            screenshot_format=self.screenshot_format,
            screenshot_quality=self.screenshot_quality,
        )


class DrumsTasksetConfig(vf.TasksetConfig):
    """Where the tasks come from and how an episode is shaped (`--env.taskset.*`)."""

    task: DrumsTaskConfig = DrumsTaskConfig()
    task_ids: list[str] = Field(default_factory=list)
    """Task ids the daemon knows (`GET /v1/tasks`); `["*"]` takes every supported one."""
    task_dir: Path | None = None
    """A directory of OSWorld-format task JSON files (searched recursively)."""
    tasks_jsonl: Path | None = None
    """A task factory's `tasks.jsonl`: one task per line."""
    visual_window: int = Field(3, ge=1)
    """Only the last K screenshots stay images in the model's context (drums-verifiers
    harness); older ones become a short text placeholder."""
