"""The trainer adapters' episodes in ray mode (`daemon_url: ray://` and nothing else), for
tests/live/test_pool_ray.py. Imports only the adapters and the SDK, so the test's own process,
a Ray worker and a driver in verl's venv can all run them. Each plays the OSWorld infeasible
task: the opening screenshot, one step, a final FAIL (which the checker scores 1), the desktop
closed at the end; each returns what it saw for the test to check."""

from __future__ import annotations

import json
import sys
from typing import Any

COMPUTER = '<tool_call>{"name": "computer", "arguments": %s}</tool_call>'


def skyrl_episode(task: str) -> dict[str, Any]:
    from drums_verifiers.adapters.skyrl import DrumsSkyRLEnv

    env = DrumsSkyRLEnv({"daemon_url": "ray://"}, {"drums_task": task, "max_turns": 3})
    prompt, _ = env.init([])
    made = {"id": env.env.id, "host": env.env.host, "image": len(prompt[-1]["content"]) == 2}
    first = env.step(COMPUTER % '{"action": "wait", "seconds": 0}')
    last = env.step(COMPUTER % '{"action": "fail"}')
    return {
        **made,
        "first_done": first["done"],
        "reward": last["reward"],
        "done": last["done"],
        "valid": last["metadata"]["drums_valid"],
        "released": env.client is None,
    }


async def verl_episode(task: str) -> dict[str, Any]:
    from drums_verifiers.adapters.verl import DrumsComputerTool

    tool = DrumsComputerTool({"type": "native", "daemon_url": "ray://"})
    handle, _ = await tool.create(create_kwargs={"drums_task": task})
    shot, _, _ = await tool.execute(handle, {"action": "wait", "seconds": 0})
    env = next(iter(tool.trajectories.values())).env
    made = {"id": env.id, "host": env.host, "image": bool(shot.image)}
    said, reward, _ = await tool.execute(handle, {"action": "fail"})
    await tool.release(handle)
    return {**made, "said": said.text, "reward": reward, "released": not tool.trajectories}


def main(argv: list[str]) -> None:
    """`python pool_episodes.py ADDRESS TASK verl|skyrl-worker`: join the cluster as a driver and
    print `RESULT <json>` (the verl tool in this driver, or a SkyRL env in a Ray worker)."""
    import time

    import ray

    address, task, which = argv
    ray.init(address=address, log_to_driver=False)
    started = time.monotonic()
    if which == "verl":
        import asyncio

        result = asyncio.run(verl_episode(task))
    else:
        here = str(__import__("pathlib").Path(__file__).parent)

        @ray.remote(num_cpus=0)
        def in_worker() -> dict[str, Any]:  # as skyrl-train's generator runs its envs
            sys.path.insert(0, here)
            from pool_episodes import skyrl_episode

            return skyrl_episode(task)

        result = ray.get(in_worker.remote())
    result["episode_s"] = round(time.monotonic() - started, 1)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
