"""A loop of episodes on one env that leaks nothing, whatever happens (exception or Ctrl-C).

    python examples/rl_loop.py [--task ID_OR_JSON_PATH] [--episodes N] [--max-steps N]

The env is reset between episodes (a CRIU restore, a fraction of a second); an episode whose gates
fail is dropped, never trained on; the `with` blocks destroy the env on any exit.
"""

from __future__ import annotations

import argparse
import logging
import random
from collections.abc import Callable
from typing import Any, Dict, Union  # noqa: UP035 (Policy must run on 3.9)

import drums

log = logging.getLogger("rl_loop")
Policy = Callable[[drums.Observation], Union[str, Dict[str, Any]]]  # noqa: UP006, UP007 (3.9)


def random_policy(obs: drums.Observation) -> dict[str, Any]:
    """Stands in for the agent: a random click, now and then the terminal `done`."""
    if random.random() < 0.1:
        return {"type": "done"}
    return {"type": "click", "x": random.randrange(1920), "y": random.randrange(1080)}


def run_episodes(
    client: drums.Client,
    task: str,
    episodes: int,
    policy: Policy = random_policy,
    max_steps: int = 20,
) -> list[float | None]:
    """Rewards per episode (None for a dropped one)."""
    rewards: list[float | None] = []
    with client.create(task=task) as env:
        for episode in range(episodes):
            if episode:
                env.reset()  # a new episode from the same checkpoint
            try:
                env.wait_valid(timeout=60)
                for _ in range(max_steps):
                    result = env.step(policy(env.observe()))
                    if result.terminal:
                        break
                reward = env.verify().score  # strict: raises rather than return a bad reward
            except drums.InvalidEpisode as err:  # a gate failed (the env is quarantined)
                log.warning("env %s episode %d dropped: %s", env.id, env.episode, err)
                rewards.append(None)
                env.release()  # the next reset() restores a sound desktop
                continue
            log.info("env %s episode %d reward %s", env.id, env.episode, reward)
            rewards.append(reward)
    return rewards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="e0df059f-28a6-4169-924f-b9623e7184cc")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=20)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        with drums.connect() as client:
            rewards = run_episodes(client, args.task, args.episodes, max_steps=args.max_steps)
    except KeyboardInterrupt:
        log.warning("interrupted: every env of this run was destroyed")
        return 130
    print(f"rewards: {rewards}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
