"""Unit tests of the pure parts: actions, the verifier contract, the visual window, sources."""

from __future__ import annotations

import json

import drums_verifiers
import pytest
import verifiers.v1 as vf
from drums_verifiers import actions, sources, verdict
from drums_verifiers.visual_window import PLACEHOLDER, apply_visual_window, count_images

# --- public names -------------------------------------------------------------------------------


def test_exports_one_taskset_one_env_one_harness():
    exported = [getattr(drums_verifiers, n) for n in drums_verifiers.__all__]
    kinds = [
        b
        for obj in exported
        for b in (vf.Taskset, vf.Env, vf.Harness)
        if isinstance(obj, type) and issubclass(obj, b)
    ]
    assert sorted(k.__name__ for k in kinds) == ["Env", "Harness", "Taskset"]


def test_cli_discovers_the_taskset_env_and_harness():
    from verifiers.v1.utils.loaders import default_harness_id, environment_class, taskset_class

    assert taskset_class("drums-verifiers") is drums_verifiers.DrumsTaskset
    assert environment_class("drums-verifiers") is drums_verifiers.DrumsEnv
    assert default_harness_id("drums-verifiers") == "drums-verifiers"


# --- actions ------------------------------------------------------------------------------------


def test_coordinates_are_scaled_back_to_screen_pixels():
    screen = actions.Screen(1920, 1080, scale=0.5)
    assert actions.click(screen, 100, 50) == {"type": "click", "x": 200, "y": 100}
    with pytest.raises(actions.BadAction, match="outside the screenshot; use 0 <= x < 960"):
        actions.click(screen, 960, 10)
    with pytest.raises(actions.BadAction, match="must be numbers"):
        actions.click(screen, "left", 10)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("enter", {"type": "key", "key": "enter"}),
        ("Return", {"type": "key", "key": "enter"}),
        ("ctrl+s", {"type": "hotkey", "keys": ["ctrl", "s"]}),
        (["Control", "shift", "t"], {"type": "hotkey", "keys": ["ctrl", "shift", "t"]}),
    ],
)
def test_keys_accept_every_spelling(given, expected):
    action = actions.key(given) if isinstance(given, str) else actions.hotkey(given)
    assert action == expected


def test_bad_arguments_say_how_to_fix_them():
    with pytest.raises(actions.BadAction, match="not 0"):
        actions.scroll(actions.Screen(), 1, 1, 0)
    with pytest.raises(actions.BadAction, match="non-empty"):
        actions.type_text("")
    with pytest.raises(actions.BadAction, match="between 0 and 60"):
        actions.wait(120)
    with pytest.raises(actions.BadAction, match="shell syntax"):
        actions.launch_app("gedit; rm -rf /")


def test_scalecua_vocabulary_maps_to_drums_actions():
    screen = actions.Screen(1920, 1080)
    act = actions.scalecua_action
    assert act(screen, None, {"action": "click", "x": 5, "y": 6, "clicks": 2}) == {
        "type": "double_click",
        "x": 5,
        "y": 6,
    }
    assert act(screen, None, {"action": "click", "x": 5, "y": 6, "button": "right"}) == {
        "type": "right_click",
        "x": 5,
        "y": 6,
    }
    assert act(screen, (10, 20), {"action": "dragTo", "x": 30, "y": 40}) == {
        "type": "drag",
        "x": 10,
        "y": 20,
        "to_x": 30,
        "to_y": 40,
    }
    assert act(screen, (10, 20), {"action": "scroll", "clicks": -3}) == {
        "type": "scroll",
        "x": 10,
        "y": 20,
        "clicks": -3,
    }
    assert act(screen, None, {"action": "write", "message": "hi"}) == {"type": "type", "text": "hi"}
    assert act(screen, None, {"action": "press", "keys": "ctrl+c"}) == {
        "type": "hotkey",
        "keys": ["ctrl", "c"],
    }
    assert act(screen, None, {"action": "terminate", "status": "failure"}) == {"type": "fail"}
    with pytest.raises(actions.BadAction, match="call moveTo first"):
        act(screen, None, {"action": "dragTo", "x": 1, "y": 1})
    with pytest.raises(actions.BadAction, match="unknown action"):
        act(screen, None, {"action": "teleport"})


def test_write_file_never_goes_through_a_shell():
    action = actions.write_file("/tmp/a b.txt", "x'; rm -rf / #")
    assert action["command"][:2] == ["python3", "-c"]
    assert action["command"][-2:] == ["/tmp/a b.txt", "x'; rm -rf / #"]


def test_scale_png_resizes_only_when_asked(tmp_path):
    from drums_verifiers.desktop import png_size
    from drums_verifiers.testing.fake_drumsd import canned_png

    png = canned_png(1, (200, 100))
    assert actions.scale_png(png, 1.0) is png
    assert png_size(actions.scale_png(png, 0.5)) == (100, 50)


# --- the verifier contract ----------------------------------------------------------------------


def result(**kw):
    base = {
        "valid": True,
        "verdict": "valid",
        "score": 1.0,
        "failed_gates": [],
        "audit": {"flags": []},
        "trusted": True,
    }
    return {**base, **kw}


def test_valid_episode_gives_its_score():
    v = verdict.judge(result(score=0.25), verdict.Verdict(env="s1"))
    assert verdict.enforce(v) == 0.25 and v.env == "s1" and v.trusted is True


def test_invalid_episode_is_dropped_with_its_gates():
    v = verdict.judge(
        result(
            valid=False, verdict="invalid", score=None, failed_gates=["no_oom_kill", "no_app_crash"]
        ),
        verdict.Verdict(),
    )
    with pytest.raises(
        verdict.DrumsInvalidEpisode, match=r"^drums_invalid:invalid:no_oom_kill,no_app_crash$"
    ):
        verdict.enforce(v)


def test_checker_failure_and_missing_verdict_are_errors():
    with pytest.raises(verdict.DrumsCheckerError):
        verdict.enforce(
            verdict.judge(result(score=None, checker_error="Timeout"), verdict.Verdict())
        )
    with pytest.raises(verdict.DrumsEnvFailure, match="no validity verdict"):
        verdict.enforce(verdict.judge(result(valid=None, verdict="pending"), verdict.Verdict()))


def test_trusted_is_never_true_by_default():
    v = verdict.judge(result(trusted=None), verdict.Verdict())
    assert v.trusted is None
    v = verdict.judge(
        result(audit={"flags": ["scope_violation"]}, trusted=False), verdict.Verdict()
    )
    assert v.trusted is False and v.audit_flags == ["scope_violation"]
    assert verdict.enforce(v) == 1.0, "the audit never changes the score"


# --- visual window ------------------------------------------------------------------------------


def shot(n):
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{n}"}}


def test_visual_window_keeps_the_last_k_images():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "go"}, shot(0)]},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": [{"type": "text", "text": "a"}, shot(1)]},
        {"role": "tool", "content": [{"type": "text", "text": "b"}, shot(2)]},
    ]
    out = apply_visual_window(messages, 2)
    assert count_images(out) == 2 and count_images(messages) == 3, "input is not changed"
    assert out[1]["content"][1] == {"type": "text", "text": PLACEHOLDER.format(k=2)}
    assert out[4]["content"][1] == shot(2) and out[3]["content"][1] == shot(1)
    assert apply_visual_window(messages, 5) == messages


# --- task sources -------------------------------------------------------------------------------


def test_osworld_dir_and_factory_jsonl(tmp_path):
    (tmp_path / "d" / "calc").mkdir(parents=True)
    (tmp_path / "d" / "calc" / "t1.json").write_text(json.dumps({"id": "t1", "instruction": "i"}))
    refs = list(sources.read_task_dir(tmp_path / "d"))
    assert [(r.id, r.instruction, r.ref["id"]) for r in refs] == [("t1", "i", "t1")]
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text(
        json.dumps({"task": {"id": "f1", "instruction": "x"}, "seed": 3})
        + "\n\n"
        + json.dumps({"id": "f2"})
        + "\n"
    )
    assert [r.id for r in sources.read_tasks_jsonl(jsonl)] == ["f1", "f2"]
    (tmp_path / "bad.jsonl").write_text('{"no_id": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        list(sources.read_tasks_jsonl(tmp_path / "bad.jsonl"))


def test_daemon_ids_star_takes_supported_tasks():
    known = [
        {"id": "a", "supported": True, "instruction": "A"},
        {"id": "b", "supported": False, "reason": "no chrome"},
    ]
    assert [r.ref for r in sources.from_daemon_ids(["*"], known)] == ["a"]
    with pytest.raises(ValueError, match="no chrome"):
        list(sources.from_daemon_ids(["b"], known))
    with pytest.raises(KeyError, match="GET /v1/tasks"):
        list(sources.from_daemon_ids(["zz"], known))


def test_taskset_loads_tasks_from_the_daemon(fake_host):
    from drums_verifiers.config import DaemonConfig, DrumsTaskConfig, DrumsTasksetConfig

    cfg = DrumsTasksetConfig(
        id="drums-verifiers",
        task_ids=["solve", "probe"],
        visual_window=4,
        task=DrumsTaskConfig(
            daemon=DaemonConfig(url=fake_host.url, token_file=fake_host.token_file)
        ),
    )
    tasks = list(drums_verifiers.DrumsTaskset(cfg))
    assert [t.data.drums_task for t in tasks] == ["solve", "probe"]
    assert tasks[0].data.visual_window == 4 and "[policy:solve]" in tasks[0].data.prompt
    assert tasks[0].key == "solve"


def test_taskset_without_a_source_says_what_to_set():
    from drums_verifiers.config import DrumsTasksetConfig
    from drums_verifiers.taskset import TasksetLoadError

    with pytest.raises(TasksetLoadError, match=r"--env\.taskset\.task-dir"):
        list(drums_verifiers.DrumsTaskset(DrumsTasksetConfig(id="drums-verifiers")))


def test_shot_options_ask_the_daemon_for_what_the_model_sees():
    assert actions.shot_options([1920, 1080], 1.0) is True  # a full PNG: nothing to ask
    assert actions.shot_options([1920, 1080], 0.5) == {"width": 960, "height": 540}
    assert actions.shot_options([1920, 1080], 1.0, "jpeg", 70) == {"format": "jpeg", "quality": 70}
    assert actions.shot_options((192, 108), 0.33, "webp") == {
        "width": 63,
        "height": 36,
        "format": "webp",
    }


def test_the_tool_servers_listening_socket_gets_tcp_nodelay(tmp_path):
    """verifiers binds the MCP socket with protocol 0, so asyncio leaves Nagle on for what it
    accepts (a 40 ms wait per tool call). The bound socket of MCP_PORT_FILE's port gets
    TCP_NODELAY, which Linux copies to every connection accepted from it; a socket on another
    port and a connected one are left alone."""
    import socket

    from drums_verifiers.tools.nodelay import bound_port, set_nodelay_on_listener

    def nodelay(s: socket.socket) -> int:
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    mcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # as verifiers' _serve makes it
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with mcp, other:
        mcp.bind(("127.0.0.1", 0))
        other.bind(("127.0.0.1", 0))
        port = mcp.getsockname()[1]
        (tmp_path / "port").write_text(str(port))
        assert bound_port({"MCP_PORT": "0", "MCP_PORT_FILE": str(tmp_path / "port")}) == port
        assert bound_port({"MCP_PORT": "7301"}) == 7301
        assert bound_port({"MCP_PORT_FILE": str(tmp_path / "missing")}) is None
        assert nodelay(mcp) == 0

        assert set_nodelay_on_listener(port) == 1
        assert nodelay(mcp) != 0 and nodelay(other) == 0
        mcp.listen()
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = mcp.accept()
            with accepted:
                assert nodelay(accepted) != 0  # inherited from the listener

    # A connected socket on the port is not a listener: left as it is.
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as outgoing:
            outgoing.bind(("127.0.0.1", 0))
            outgoing.connect(plain.getsockname())
            assert set_nodelay_on_listener(outgoing.getsockname()[1]) == 0
            assert nodelay(outgoing) == 0
