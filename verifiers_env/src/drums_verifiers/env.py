"""The drums episode: one desktop per rollout, or a fork group of N children of one parent.

The env owns every desktop of its episode and closes them on every path (success, error,
cancellation), shielded. With `fork_n = N` (N >= 1) one episode plays `prefix` on a parent,
lets it settle, forks N children and runs one agent per child: the N traces are the comparison
group, so train with `group_size = 1` (GRPO's group is then the fork group, whose members share
the exact desktop state at the fork point).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.runtimes import RuntimeConfig

from drums_verifiers import desktop
from drums_verifiers.episode import CURRENT, SEAT, EpisodeDesktops, ForkSeat
from drums_verifiers.verdict import DrumsInvalidEpisode, drop_reason

log = logging.getLogger("drums_verifiers.env")


PrefixAction = str | dict[str, Any]
"""pyautogui code (`"pyautogui.click(960, 540)"`) or a drumsd action dict (`{"type": "click"}`)."""


class DrumsAgentConfig(vf.AgentConfig):
    """verifiers' agent config with a local runtime by default: the agent only calls tools (the
    desktops are drums'), so a cloud sandbox (verifiers' default, which needs a prime login)
    buys nothing. `--env.agent.runtime.type` still picks another."""

    runtime: RuntimeConfig = vf.SubprocessConfig()


class DrumsEnvConfig(vf.EnvConfig):
    """The episode's shape (`--env.*`, `env.*` in a prime-rl source)."""

    agent: DrumsAgentConfig = DrumsAgentConfig()
    """The one seat: the policy playing every desktop of the episode."""
    fork_n: int = Field(0, ge=0, le=64)
    """0 (default): one desktop per rollout. N >= 1: one episode plays `prefix` on a parent
    desktop, forks N children and runs one agent per child; the N traces are the comparison
    group (use group_size = 1)."""
    prefix: list[PrefixAction] = Field(default_factory=list)
    """Actions played on the parent before the fork, each pyautogui code or an action dict."""
    settle_s: float = Field(1.0, ge=0)
    """Pause after the prefix so the desktop settles before it is forked."""


class DrumsEnv(vf.Env[DrumsEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        cfg = self.config
        owner = EpisodeDesktops(task.config.daemon)
        token = CURRENT.set(owner)
        try:
            if cfg.fork_n >= 1:
                await self.run_fork_group(task, agents, owner, cfg)
            else:
                await agents.agent.run(task)
        finally:
            CURRENT.reset(token)
            await owner.aclose()

    async def run_fork_group(
        self, task: vf.Task, agents: vf.Agents, owner: EpisodeDesktops, cfg: DrumsEnvConfig
    ) -> None:
        tcfg = task.config
        parent = await owner.create(task.data.drums_task, tcfg.idle_timeout_s)
        parent_id = desktop.env_id(parent)
        try:
            report = await desktop.wait_valid(parent, tcfg.wait_valid_timeout_s)
        except Exception as exc:
            if desktop.is_invalid_episode(exc):
                raise DrumsInvalidEpisode(
                    drop_reason("parent-invalid", desktop.failed_gates(exc))
                ) from exc
            raise
        if desktop.field(report, "valid") is False:
            raise DrumsInvalidEpisode(drop_reason("parent-invalid", desktop.failed_gates(report)))
        for action in cfg.prefix:
            await desktop.step(parent, action if isinstance(action, str) else dict(action))
        if cfg.settle_s:
            await asyncio.sleep(cfg.settle_s)
        log.info("episode parent=%s prefix=%d forking %d", parent_id, len(cfg.prefix), cfg.fork_n)
        async with desktop.fork(parent, cfg.fork_n) as children:
            async with asyncio.TaskGroup() as group:
                for index, child in enumerate(children):
                    group.create_task(self.play_child(task, agents, child, parent_id, index))

    async def play_child(
        self, task: vf.Task, agents: vf.Agents, child: Any, parent: str, index: int
    ) -> None:
        # Set inside the child's own asyncio task so each rollout sees only its seat.
        SEAT.set(ForkSeat(env=child, parent=parent, index=index))
        await agents.agent.run(task)
