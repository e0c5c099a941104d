"""The drums quickstart: one episode on an OSWorld-format task, forked into 4 copies.

    python examples/first_episode.py [--task ID_OR_JSON_PATH] [--out DIR]

Needs a running `drumsd serve` (DRUMS_URL, default http://127.0.0.1:7070) and its token
(DRUMS_TOKEN, or DRUMS_TOKEN_FILE, default /etc/drums/token). Everything it creates is destroyed
when it ends, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import drums

# examples/tasks/files.json, named by a prefix of its id as OSWorld users write them; the main
# job's daemon reads examples/tasks/. An OSWorld checkout's tasks are named the same way.
TASK = "0f2c5a61"  # rename ~/Desktop/drafts to ~/Desktop/final
TERMINAL = {"type": "click", "x": 480, "y": 300}  # the xterm of the desktop
SOLUTION = "mv ~/Desktop/drafts ~/Desktop/final; ls ~/Desktop\n"
NOT_A_SOLUTION = "ls ~/Desktop; echo not today\n"
CALC = "setsid libreoffice --calc --norestore >/dev/null 2>&1 &"  # office image: a spreadsheet


def first_episode(client: drums.Client, task: str, out: Path) -> dict[str, float | None]:
    """Create, observe, act, fork into 4, verify each copy, save a state, restore and delete it.
    Returns the scores."""
    out.mkdir(parents=True, exist_ok=True)
    with client.create(task=task) as env:
        env.wait_valid(timeout=60)  # every gate passed: the desktop is sound
        obs = env.observe()
        (out / "start.png").write_bytes(obs.png)
        print(f"env {env.id}: {obs.instruction}")

        env.step("pyautogui.click(480, 300)")  # pyautogui code: focus the terminal ...
        env.step({"type": "type", "text": "ls ~/Desktop\n"})  # ... or an action dict
        (out / "parent.png").write_bytes(env.observe().png)

        scores: dict[str, float | None] = {}
        with env.fork(4) as children:  # 4 copies of this desktop, as it is now
            for i, child in enumerate(children):
                child.step(TERMINAL)  # focus follows the map order at dump time: click first
                if i % 2 == 0:  # half of them solve the task, typing as an agent would
                    child.step({"type": "type", "text": SOLUTION})
                else:
                    child.step({"type": "type", "text": NOT_A_SOLUTION})
                if i == 3:  # one opens a spreadsheet (where the image has one)
                    child.step({"type": "execute", "command": CALC})
                    child.step({"type": "wait", "seconds": 3})
                child.step({"type": "wait", "seconds": 0.5})
                (out / f"child{i}.png").write_bytes(child.observe().png)
                try:
                    scores[child.id] = child.verify().score  # strict: a reward you may train on
                except drums.InvalidEpisode as err:  # a gate failed: drop, never train on it
                    print(f"  {child.id}: dropped ({err})")
                    scores[child.id] = None
                print(f"  {child.id}: score {scores[child.id]}")
        # the children and their prefork state are gone here
        cost = client.metrics()["cost"]  # a mapping view of GET /v1/metrics as well
        print(f"cost: {cost}")

        state = env.save()  # lives until its lease runs out; save(keep=False) goes with the client
        with client.create(from_state=state) as copy:
            print(f"saved {state.id} ({state.size_mib:.0f} MiB); restored it as {copy.id}")
        client.delete_state(state)  # or leave it to its lease
    print(f"screenshots in {out}")
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=TASK, help="task id or id prefix, or a JSON file")
    parser.add_argument("--out", type=Path, default=Path("out/first_episode"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with drums.connect() as client:
        first_episode(client, args.task, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
