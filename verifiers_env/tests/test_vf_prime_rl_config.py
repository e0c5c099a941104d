"""The prime-rl examples' `[env]` blocks, checked the way prime-rl checks them.

prime-rl's orchestrator validates each `[[orchestrator.train.source]]`'s `env` with a before-
validator that calls verifiers' `resolve_env_field` (prime-rl's `EnvConfig._resolve_env`, from its
`prime-rl-configs` package): verifiers imports the taskset's module and narrows the block to our
`DrumsEnvConfig`. `prime-rl-configs` is not on PyPI, so CI runs that same verifiers call on the
examples and then loads our environment from the result, as prime-rl's env server does
(`load_environment`). The whole-file parse with prime-rl's own `cli(RLConfig, ...)` runs where a
Python with prime-rl-configs is named by DRUMS_PRIME_RL_PYTHON (docs/verifiers.md has its output).
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import verifiers.v1 as vf
from drums_verifiers.config import DrumsTasksetConfig
from drums_verifiers.env import DrumsEnv, DrumsEnvConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {"rl-drums-fork.toml": 8, "rl-drums.toml": 0}


def sources(name: str) -> tuple[dict, list[dict]]:
    config = tomllib.loads((REPO / "examples" / name).read_text())
    return config, config["orchestrator"]["train"]["source"]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_env_block_resolves_and_loads_our_environment(name: str) -> None:
    config, found = sources(name)
    assert len(found) == 1, found
    raw = found[0]["env"]
    # What prime-rl's source validator does with the block (a dict, before validation).
    resolved = vf.resolve_env_field({"env": raw})["env"]
    assert isinstance(resolved, DrumsEnvConfig), type(resolved)
    assert isinstance(resolved.taskset, DrumsTasksetConfig)
    assert resolved.fork_n == EXAMPLES[name]
    # Every key of the block landed in a field (pydantic_config forbids unknown keys, so a
    # misspelt or misplaced one would have failed above); spot-check the nested ones.
    assert resolved.taskset.task.tool_style == raw["taskset"]["task"]["tool_style"]
    assert resolved.taskset.task.daemon.url == raw["taskset"]["task"]["daemon"]["url"]
    assert resolved.agent.harness.id == "drums-verifiers"
    if EXAMPLES[name]:
        # The fork example: group_size 1 (the fork group is the GRPO group), a mixed prefix.
        assert config["orchestrator"]["group_size"] == 1
        assert resolved.max_concurrent_agents == resolved.fork_n
        assert {type(a) for a in resolved.prefix} == {dict, str}, resolved.prefix
    # The env server rebuilds the env from the serialized block (SerializeAsAny keeps our
    # subclass's fields): the round trip must give the same config, then our environment.
    again = vf.resolve_env_field({"env": resolved.model_dump()})["env"]
    assert again == resolved
    env = vf.load_environment(again)
    assert isinstance(env, DrumsEnv)
    assert env.config.fork_n == EXAMPLES[name] and env.config.prefix == resolved.prefix
    assert env.taskset.config.visual_window == raw["taskset"]["visual_window"]


def test_a_misplaced_key_is_refused() -> None:
    """The check can fail: fork_n under the taskset (where it used to be) is an error."""
    _, found = sources("rl-drums-fork.toml")
    raw = {**found[0]["env"], "taskset": {**found[0]["env"]["taskset"], "fork_n": 8}}
    with pytest.raises(Exception, match="fork_n"):
        vf.resolve_env_field({"env": raw})


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_parses_with_prime_rl_configs(name: str) -> None:
    """prime-rl's own parser on the whole file; needs DRUMS_PRIME_RL_PYTHON (not in CI)."""
    python = os.environ.get("DRUMS_PRIME_RL_PYTHON")
    if not python:
        pytest.skip("DRUMS_PRIME_RL_PYTHON (a Python with prime-rl-configs) is not set")
    code = (
        "from prime_rl.configs.rl import RLConfig; from prime_rl.utils.config import cli; "
        f"c = cli(RLConfig, args=['@', 'examples/{name}']); "
        "e = c.orchestrator.train.source[0].env; "
        "print('OK', c.model.name, type(e).__name__, e.fork_n)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'verifiers_env' / 'src'}:{REPO / 'sdk' / 'src'}",
    }
    proc = subprocess.run(
        [python, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().endswith(f"DrumsEnvConfig {EXAMPLES[name]}"), proc.stdout
