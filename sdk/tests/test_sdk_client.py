"""Every method of the sync client and env, against the in-process daemon app."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from sdk_harness import Daemon

import drums
from drums import models as m

TASK_FILE = {"id": "inline-1", "instruction": "Rename the folder.", "config": [], "evaluator": {}}


def test_daemon_level_calls(client: drums.Client) -> None:
    assert client.ping() is True
    health = client.health()
    assert health.status in ("ok", "degraded") and health.version
    tasks = client.tasks()
    assert tasks and all(isinstance(t, m.TaskInfo) for t in tasks)
    assert client.task(tasks[0].id).id == tasks[0].id
    metrics = client.metrics()
    assert metrics.window_s >= 0
    # a mapping view of the JSON as well: metrics()["cost"], ["latencies"], ...
    assert metrics["cost"] == metrics.model_dump(mode="json")["cost"]
    assert metrics["window_s"] == metrics.window_s and "latencies" in metrics.keys()
    assert metrics.get("nope", 7) == 7 and dict(metrics.items())["counters"] == metrics.counters
    with pytest.raises(KeyError, match="not a field of Metrics"):
        metrics["nope"]
    ended = client.reset_metrics()
    assert ended.window_started_at <= client.metrics().window_started_at
    assert isinstance(client.list_states(), list)


def test_create_observe_step_reset_and_gates(client: drums.Client) -> None:
    env = client.create(task="task-ok", idle_timeout_s=600, ttl_s=3600, labels={"run": "t"})
    assert env.id in [s.id for s in client.list_envs()]
    report = env.wait_valid(timeout=10)
    assert report.valid is True and not report.failed
    assert env.gates().episode == env.episode == 1

    obs = env.observe()
    assert obs.png.startswith(b"\x89PNG")
    assert obs.image.size[0] > 0  # decoded lazily with Pillow
    assert obs.instruction == "Type hello into the terminal."
    assert obs.meta["env_id"] == env.id and obs.meta["task_id"] == "task-ok"

    first = env.step("pyautogui.click(10, 20)")
    assert (first.action_type, first.actions) == ("pyautogui", 1)
    second = env.step({"type": "execute", "command": ["ls", "/"]})
    assert second.output is not None and second.output.returncode == 0
    third = env.step(m.Action(type="done"))
    assert third.terminal == "done" and env.actions == 3

    slot = env.reset()
    assert slot.episode == env.episode == 2
    assert env.refresh().episode == 2
    assert env.metrics().episode == 2
    assert env.wait_quiescent(timeout=5).quiescent is True


def test_step_can_return_a_screenshot(daemon: Daemon, client: drums.Client) -> None:
    env = client.create()
    png = m.StepResult(slot=env.id, episode=1, action_type="wait", elapsed_s=0, actions=1,
                       screenshot_png_b64=base64.b64encode(b"\x89PNG-ish").decode())  # fmt: skip
    daemon.faults.respond("POST", f"/v1/slots/{env.id}/step", 200, png.model_dump(mode="json"))
    result = env.step({"type": "wait", "seconds": 0.1}, screenshot=True)
    assert base64.b64decode(result.screenshot_png_b64 or "") == b"\x89PNG-ish"


def test_task_as_dict_as_local_json_path_and_loaded_later(
    client: drums.Client, tmp_path: Path
) -> None:
    env = client.create(task=TASK_FILE)
    assert env.observe().instruction == "Rename the folder."
    path = tmp_path / "task.json"
    path.write_text(json.dumps(dict(TASK_FILE, id="inline-2")))
    from_file = client.create(task=str(path))  # exists here: sent inline
    assert from_file.slot.task_id == "inline-2"
    assert client.create(task=path).slot.task_id == "inline-2"  # a Path works too
    with pytest.raises(drums.InvalidRequest, match="does not exist"):
        client.create(task=tmp_path / "absent.json")

    bare = client.create()
    info = bare.load_task("task-ok")
    assert info.id == "task-ok" and bare.observe().instruction == info.instruction


def test_verify_returns_a_trainable_reward(client: drums.Client) -> None:
    with client.create(task="task-ok") as env:
        env.step({"type": "key", "key": "enter"})
        result = env.verify()
        assert result.valid and result.score == 1.0
        assert isinstance(result.audit, m.Audit) and result.task_id == "task-ok"
        assert env.verify(strict=False, timeout=30).score == 1.0


def test_fork_yields_children_and_removes_them_and_the_state(
    daemon: Daemon, client: drums.Client
) -> None:
    env = client.create(task="task-ok")
    with env.fork(4) as children:
        assert len(children) == 4 and len(set(c.id for c in children)) == 4
        assert all(c.slot.parent == env.id for c in children)
        assert children[0].observe().instruction == "Type hello into the terminal."
        state = children.state
        assert state.kind == m.CheckpointKind.prefork
        assert state.id in [s.id for s in client.list_states()]
    live = [s.id for s in client.list_envs()]
    assert live == [env.id]
    assert state.id not in [s.id for s in client.list_states()]
    assert all(c.closed for c in children)


def test_fork_keep_state_keeps_it_until_the_client_closes(daemon: Daemon) -> None:
    with daemon.client() as client:
        env = client.create()
        with env.fork(2, keep_state=True) as children:
            state = children.state
        assert state.id in [s.id for s in client.list_states()]
        restored = client.create(from_state=state)
        assert restored.slot.checkpoint == state.id
        with env.fork(1):  # drumsd reuses the kept prefork here: this block must not delete it
            pass
        assert state.id in [s.id for s in client.list_states()]
    assert daemon.leftovers() == ([], [])


def test_save_get_delete_and_keep(daemon: Daemon) -> None:
    with daemon.client() as client:
        env = client.create()
        temporary = env.save(keep=False)
        assert client.get_state(temporary).id == temporary.id
        kept = env.save(idle_timeout_s=60)  # by default a state lives until its lease runs out
        doomed = env.save()
        client.delete_state(doomed)
        with pytest.raises(drums.NotFound):
            client.get_state(doomed.id)
    envs, states = daemon.leftovers()
    assert envs == [] and states == [kept.id]  # the state saved with keep=False went with it
    with daemon.client() as client:
        client.delete_state(kept.id)
    assert daemon.leftovers() == ([], [])


def test_quarantine_release_attach_and_close(daemon: Daemon, client: drums.Client) -> None:
    env = client.create(task="task-ok")
    slot = env.quarantine("looks wrong")
    assert slot.state == m.SlotState.quarantined and "looks wrong" in (slot.quarantine_reason or "")
    with pytest.raises(drums.Quarantined):
        env.step("pyautogui.press('a')")
    assert env.release().state == m.SlotState.ready
    env.reset()

    other = client.attach(env.id)  # not owned by the client, but the same env
    assert other.id == env.id and not other.owned
    env.close()
    env.close()  # idempotent
    assert env.closed
    with pytest.raises(drums.EnvGone) as gone:
        other.step("pyautogui.press('a')")
    assert gone.value.env_id == env.id
    assert env.id in [s.id for s in client.list_envs(include_destroyed=True)]
    assert env.id not in [s.id for s in client.list_envs()]


def test_client_exit_destroys_what_it_created_only(daemon: Daemon) -> None:
    with daemon.client() as outsider:
        foreign = outsider.create()
        foreign_id = foreign.id
        # let it survive this client's exit by forgetting ownership (as if created elsewhere)
        outsider._forget_env(foreign_id)
    with daemon.client() as client:
        for _ in range(3):
            client.create()
        client.attach(foreign_id)
    envs, _ = daemon.leftovers()
    assert envs == [foreign_id]


def test_any_existing_local_file_is_sent_inline(client: drums.Client, tmp_path: Path) -> None:
    path = tmp_path / "my-task"  # no .json suffix: still a local file
    path.write_text(json.dumps(dict(TASK_FILE, id="inline-3")))
    assert client.create(task=str(path)).slot.task_id == "inline-3"
    path.write_text("[1, 2]")
    with pytest.raises(drums.InvalidRequest, match="not an object"):
        client.create(task=str(path))


def test_observe_tolerates_a_task_the_daemon_does_not_list(
    daemon: Daemon, client: drums.Client
) -> None:
    env = client.create(task="task-ok")
    daemon.faults.error("GET", "/v1/tasks/task-ok", "not_found")
    obs = env.observe()
    assert obs.instruction == "" and obs.meta["task_id"] == "task-ok"
