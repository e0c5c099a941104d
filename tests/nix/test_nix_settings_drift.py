"""The module's typed settings agree with drumsd's config model: same keys, same defaults, same
bounds. Checked three ways: the generated files are current (byte for byte), the checked-in Nix
evaluates to the model's keys and defaults, and the Nix type checks accept exactly what pydantic
accepts at every bound. Renaming a key on either side alone fails here."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import annotated_types
from drumsd.core.config import Block, Config
from nix_support import REPO, nix_env, require_tool
from pydantic import BaseModel, TypeAdapter, ValidationError, create_model
from pydantic.fields import FieldInfo

OPTIONS = REPO / "nixos-modules" / "drumsd-settings.nix"
DEFAULTS = REPO / "nixos-modules" / "drumsd-settings-defaults.nix"
MODULE = REPO / "nixos-modules" / "drumsd.nix"
EVAL = Path(__file__).with_name("settings_eval.nix")


def generator():
    spec = importlib.util.spec_from_file_location(
        "generate_settings_options", REPO / "nix" / "generate_settings_options.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def evaluate(options_file: Path, probes: list[dict] | None = None) -> dict[str, Any]:
    result = subprocess.run(
        [
            require_tool("nix-instantiate"),
            "--eval",
            "--strict",
            "--json",
            str(EVAL),
            "--arg",
            "optionsFile",
            str(options_file.resolve()),
            "--argstr",
            "probesJson",
            json.dumps(probes or []),
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=120,
    )
    assert result.returncode == 0, f"evaluating {options_file}:\n{result.stderr}"
    return json.loads(result.stdout)


def is_block(field: FieldInfo) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


def model_default(field: FieldInfo) -> Any:
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return TypeAdapter(field.annotation).dump_python(value, mode="json")


def is_float(annotation: Any) -> bool:
    return annotation is float or any(is_float(a) for a in typing.get_args(annotation))


def compare(tree: dict[str, Any], model: type[BaseModel], where: str = "") -> list[str]:
    """Every difference between the evaluated Nix options and a pydantic model."""
    problems = []
    nix_keys, model_keys = set(tree), set(model.model_fields)
    for key in sorted(model_keys - nix_keys):
        problems.append(f"{where}{key}: in the config model, missing from the Nix options")
    for key in sorted(nix_keys - model_keys):
        problems.append(f"{where}{key}: a Nix option the config model does not have")
    for key in sorted(nix_keys & model_keys):
        field, option = model.model_fields[key], tree[key]
        name = f"{where}{key}"
        if is_block(field):
            if not option["block"]:
                problems.append(f"{name}: a block in the model, a plain option in Nix")
            else:
                problems += compare(option["options"], field.annotation, name + ".")
            continue
        if option["block"]:
            problems.append(f"{name}: a plain value in the model, a block in Nix")
            continue
        if field.is_required():
            if option["hasDefault"]:
                problems.append(f"{name}: required in the model, has a default in Nix")
            continue
        if not option["hasDefault"]:
            problems.append(f"{name}: the model has a default, the Nix option none")
            continue
        expected = model_default(field)
        if option["default"] != expected:
            problems.append(f"{name}: default {option['default']!r} in Nix, {expected!r} in model")
        if expected is not None and is_float(field.annotation) and option["defaultType"] != "float":
            problems.append(f"{name}: float in the model, {option['defaultType']} in Nix")
        if not option["defaultPasses"]:
            problems.append(f"{name}: the Nix type rejects its own default")
    return problems


def bounds(field: FieldInfo) -> dict[str, float]:
    found: dict[str, float] = {}

    def visit(items: list[Any]) -> None:
        for item in items:
            if isinstance(item, FieldInfo):
                visit(item.metadata)
            for name, cls in (
                ("gt", annotated_types.Gt),
                ("ge", annotated_types.Ge),
                ("lt", annotated_types.Lt),
                ("le", annotated_types.Le),
            ):
                if isinstance(item, cls):
                    found[name] = getattr(item, name)

    visit(list(field.metadata))
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            visit(list(typing.get_args(arg)[1:]))
    return found


def probes_for(model: type[BaseModel], path: list[str]) -> list[dict[str, Any]]:
    """Values at and just past every bound, and outside every enum."""
    out = []
    for key, field in model.model_fields.items():
        here = [*path, key]
        if is_block(field):
            out += probes_for(field.annotation, here)
            continue
        step = 0.5 if is_float(field.annotation) else 1
        for bound in bounds(field).values():
            for value in (bound - step, bound, bound + step):
                out.append({"path": here, "value": value})
        if typing.get_origin(field.annotation) is typing.Literal:
            out += [{"path": here, "value": v} for v in typing.get_args(field.annotation)]
            out.append({"path": here, "value": "not-a-choice"})
    return out


def pydantic_accepts(path: list[str], value: Any) -> bool:
    raw: dict[str, Any] = {"token_file": "/etc/drums/token"}
    node = raw
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    try:
        Config.model_validate(raw)
    except ValidationError as exc:
        return not any(tuple(err["loc"][: len(path)]) == tuple(path) for err in exc.errors())
    return True


# ------------------------------------------------------------------------------------------------


def test_generated_files_are_current() -> None:
    gen = generator()
    options_text, defaults_text = gen.render(*gen.model_and_defaults())
    assert OPTIONS.read_text() == options_text, (
        "nixos-modules/drumsd-settings.nix is stale: run "
        "PYTHONPATH=drumsd/src .venv/bin/python nix/generate_settings_options.py"
    )
    assert DEFAULTS.read_text() == defaults_text, "drumsd-settings-defaults.nix is stale (same fix)"


def test_generator_check_mode_reports_current_files() -> None:
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO / "drumsd" / "src")}
    result = subprocess.run(
        [sys.executable, str(REPO / "nix" / "generate_settings_options.py"), "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_defaults_file_evaluates_to_the_models_defaults() -> None:
    result = subprocess.run(
        [require_tool("nix-instantiate"), "--eval", "--strict", "--json", str(DEFAULTS)],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    from drumsd.core.config import defaults_json

    assert json.loads(result.stdout) == json.loads(defaults_json())


def test_nix_options_match_the_config_model() -> None:
    tree = evaluate(OPTIONS)["tree"]
    assert compare(tree, Config) == []


def test_nix_type_checks_accept_what_pydantic_accepts_at_every_bound() -> None:
    probes = probes_for(Config, [])
    assert len(probes) > 100, "too few probes: the bound extraction broke"
    results = evaluate(OPTIONS, probes)["probes"]
    assert len(results) == len(probes)
    # Pair by position: Nix 2.8 prints floats with 6 significant digits, so its echo of a value
    # like 2592000.5 is not the value it checked.
    disagreements = [
        f"{'.'.join(p['path'])} = {p['value']!r}: Nix {'accepts' if r['accepted'] else 'rejects'}"
        for p, r in zip(probes, results, strict=True)
        if r["accepted"] != pydantic_accepts(p["path"], p["value"])
    ]
    assert disagreements == []


def test_every_settings_key_the_module_reads_exists_in_the_model() -> None:
    text = MODULE.read_text()
    used = set(re.findall(r"cfg\.settings\.([a-z_]+(?:\.[a-z_]+)*)", text))
    assert used, "the module reads no settings: the pattern broke"
    for dotted in sorted(used):
        model: type[BaseModel] = Config
        for part in dotted.split("."):
            assert part in model.model_fields, f"drumsd.nix reads settings.{dotted}: no such key"
            annotation = model.model_fields[part].annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                model = annotation


# --- the checks bite: a rename on one side only fails them ------------------------------------


def test_a_key_renamed_in_the_nix_file_only_is_caught(tmp_path: Path) -> None:
    text = OPTIONS.read_text()
    assert "      window_s = mkOption {" in text
    renamed = tmp_path / "drumsd-settings.nix"
    renamed.write_text(
        text.replace("      window_s = mkOption {", "      window_secs = mkOption {")
    )
    (tmp_path / "drumsd-settings-defaults.nix").write_text(DEFAULTS.read_text())
    problems = compare(evaluate(renamed)["tree"], Config)
    assert any("quiesce.window_s" in p for p in problems), problems
    assert any("quiesce.window_secs" in p for p in problems), problems
    gen = generator()
    assert gen.render(*gen.model_and_defaults())[0] != renamed.read_text()


def test_a_key_renamed_in_the_model_only_is_caught() -> None:
    fields = {name: (f.annotation, f) for name, f in Config.model_fields.items()}
    fields["listen_on"] = fields.pop("listen")
    renamed_model = create_model("RenamedConfig", __base__=Block, **fields)
    problems = compare(evaluate(OPTIONS)["tree"], renamed_model)
    assert any(p.startswith("listen_on:") for p in problems), problems
    assert any(p.startswith("listen:") for p in problems), problems
    # Regenerating from the renamed model gives other bytes: the staleness check fails too.
    gen = generator()
    defaults = json.loads(json.dumps(gen.model_and_defaults()[1]))
    defaults["listen_on"] = defaults.pop("listen")
    options_text, defaults_text = gen.render(
        renamed_model, gen.restore_floats(renamed_model, defaults)
    )
    assert options_text != OPTIONS.read_text()
    assert defaults_text != DEFAULTS.read_text()


def test_the_real_check_config_accepts_the_nix_defaults(tmp_path: Path) -> None:
    """What the module renders with no user settings (the generated defaults plus the keys it
    sets itself) passes `drumsd check-config`, as the build-time check will."""
    import os

    result = subprocess.run(
        [require_tool("nix-instantiate"), "--eval", "--strict", "--json", str(DEFAULTS)],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout)
    settings.update(
        token_file="/var/lib/drums/token",
        criu="/nix/store/00000000000000000000000000000000-criu-4.2.1/bin/criu",
        images_dir="/var/lib/drums/nix-images",
    )
    path = tmp_path / "drumsd.json"
    path.write_text(json.dumps(settings))
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'drumsd' / 'src'}:{REPO / 'sdk' / 'src'}"}
    launcher = "import sys\nfrom drumsd.cli import main\nsys.exit(main())"
    checked = subprocess.run(
        [sys.executable, "-c", launcher, "check-config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
