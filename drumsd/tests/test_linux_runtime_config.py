"""The Linux runtime's config holds no defaults of its own: each is the config model's, and every
key of the model's `linux` block reaches the runtime through `from_config`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

from drumsd.core.config import Config, LinuxConfig
from drumsd.runtime.linux import LinuxRuntimeConfig, base
from pydantic.fields import FieldInfo


def test_a_runtime_config_built_directly_has_the_config_models_defaults(tmp_path: Path) -> None:
    model = Config(token_file=tmp_path / "token", state_dir=tmp_path)
    assert LinuxRuntimeConfig(state_dir=tmp_path) == LinuxRuntimeConfig.from_config(model)


def test_no_default_is_written_in_the_runtime_config() -> None:
    tree = ast.parse(inspect.getsource(base.LinuxRuntimeConfig))
    literal = [
        node.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.value is not None
        and not any(isinstance(n, ast.Name) and n.id == "_MODEL" for n in ast.walk(node.value))
    ]
    assert not literal, f"LinuxRuntimeConfig writes defaults of its own: {literal}"


def test_every_key_of_the_linux_block_reaches_the_runtime(tmp_path: Path) -> None:
    def other(info: FieldInfo) -> object:
        if typing.get_origin(info.annotation) is typing.Literal:  # another of its values
            return next(v for v in typing.get_args(info.annotation) if v != info.default)
        return info.default * 2 if not isinstance(info.default, bool) else not info.default

    changed = {name: other(info) for name, info in LinuxConfig.model_fields.items()}
    model = Config(token_file=tmp_path / "t", linux=changed)
    rt = dataclasses.asdict(LinuxRuntimeConfig.from_config(model))
    assert {name: rt[name] for name in changed} == changed
