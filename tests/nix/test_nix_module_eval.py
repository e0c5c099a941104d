"""services.drumsd evaluated with nixpkgs' real module system (lib.evalModules from nixpkgs 25.11's
`lib`: DRUMS_NIXPKGS_LIB, else the one in ../shared/nixpkgs-snapshot) and stand-in packages: its
option types, defaults, assertions and unit wiring, and the generated config checked by the real
`drumsd check-config`. A clone without ../shared and without DRUMS_NIXPKGS_LIB skips these.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nix_support import REPO, nix_env, require_tool
from nixos_tree import unpack_tree

EVAL = Path(__file__).with_name("module_eval.nix")
LIB = os.environ.get("DRUMS_NIXPKGS_LIB")


@pytest.fixture(scope="module", autouse=True)
def _nixpkgs_lib(tmp_path_factory: pytest.TempPathFactory) -> None:
    global LIB
    if not LIB:
        LIB = str(unpack_tree(tmp_path_factory.mktemp("nixpkgs-snapshot"))[0] / "lib")


def evaluate(user: dict[str, Any], module: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            require_tool("nix-instantiate"),
            "--eval",
            "--strict",
            "--json",
            str(EVAL),
            "--argstr",
            "libPath",
            str(LIB),
            "--argstr",
            "userJson",
            json.dumps(user),
            *(["--arg", "modulePath", str(module)] if module else []),
        ],
        capture_output=True,
        text=True,
        env=nix_env(),
        timeout=120,
    )


def evaluated(user: dict[str, Any]) -> dict[str, Any]:
    result = evaluate(user)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def check_config(settings_json: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "drumsd.json"
    path.write_text(settings_json)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'drumsd' / 'src'}:{REPO / 'sdk' / 'src'}"}
    launcher = "import sys\nfrom drumsd.cli import main\nsys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", launcher, "check-config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_defaults_evaluate_and_the_real_check_config_accepts_them(tmp_path: Path) -> None:
    out = evaluated({"enable": True})
    assert out["failedAssertions"] == []
    settings = out["settings"]
    assert settings["token_file"] == "/var/lib/drums/token"
    assert settings["criu"].endswith("-criu-4.2.1/bin/criu")
    assert settings["lower"] is None
    assert settings["images_dir"] == "/var/lib/drums/nix-images"
    assert settings["default_image"] == "base"
    unpack = out["imageService"]["serviceConfig"]["ExecStart"]
    assert "image unpack" in unpack and "--images-dir /var/lib/drums/nix-images" in unpack
    # The default image is the locked one (nix/debian-image.nix), not a nixpkgs-built root.
    assert "-drums-image-base-0/root.tar" in unpack, unpack
    unit = out["service"]["serviceConfig"]
    assert unit["Delegate"] == "yes" and unit["KillMode"] == "process"
    assert unit["DelegateSubgroup"] == "daemon"
    assert unit["ExecStart"].endswith(" serve --config " + out["service"]["restartTriggers"][0])
    assert "umask 077" in out["tokenScript"]
    assert out["mounts"][0]["where"] == settings["state_dir"]
    assert out["kernel"]["features"] == {"criu": True}
    assert out["ksm"] == {"enable": True, "sleep": 20}
    assert out["firewall"] == []
    result = check_config(out["settingsJson"], tmp_path)
    assert result.returncode == 0, result.stderr


def test_user_settings_override_and_reach_the_file(tmp_path: Path) -> None:
    out = evaluated(
        {
            "enable": True,
            "openFirewall": True,
            "stateTmpfsSize": "16G",
            "settings": {
                "listen": "0.0.0.0:7443",
                "allow_remote": True,
                "memory_mib": 3072,
                "quiesce": {"window_s": 0.5},
                "ksm": {"enabled": False},
                "criu": "/opt/criu/bin/criu",
            },
        }
    )
    assert out["failedAssertions"] == []
    assert out["firewall"] == [7443]
    assert out["mounts"][0]["options"] == "mode=0700,size=16G"
    assert out["ksm"]["enable"] is False
    settings = json.loads(out["settingsJson"])
    assert settings["memory_mib"] == 3072 and settings["quiesce"]["window_s"] == 0.5
    assert settings["quiesce"]["timeout_s"] == 30, "a sibling's default was lost"
    assert settings["criu"] == "/opt/criu/bin/criu", "mkDefault let the module win"
    assert check_config(out["settingsJson"], tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"settings": {"listen": "0.0.0.0:7070"}}, "set services.drumsd.settings.allow_remote"),
        ({"openFirewall": True}, "but settings.listen (127.0.0.1:7070) is loopback"),
        ({"criuPackage": "criu_4_1"}, "drums needs >= 4.2"),
        ({"settings": {"journal_dir": "/run/drums/journal"}}, "is inside state_dir"),
        # Not a valid store path name, so the type lets it through; the assertion does not.
        ({"tokenFile": "/nix/store/not-a-hash/token"}, "is in the Nix store"),
    ],
)
def test_assertions_fire_with_clear_messages(user: dict[str, Any], message: str) -> None:
    failed = evaluated({"enable": True, **user})["failedAssertions"]
    assert any(message in m for m in failed), failed


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"tokenFile": "/nix/store/" + "a" * 32 + "-token"}, "tokenFile"),
        ({"tokenFile": "relative/token"}, "tokenFile"),
        ({"settings": {"quiesce": {"window_s": 0}}}, "window_s"),
        ({"settings": {"profile": "bogus"}}, "profile"),
        ({"settings": {"natural_exits": "xterm"}}, "natural_exits"),
        ({"stateTmpfsSize": "lots"}, "stateTmpfsSize"),
    ],
)
def test_bad_values_fail_evaluation_naming_the_option(user: dict[str, Any], message: str) -> None:
    result = evaluate({"enable": True, **user})
    assert result.returncode != 0, f"{user} evaluated"
    assert message in result.stderr, result.stderr[-2000:]


def test_an_unknown_key_passes_the_freeform_type_and_fails_check_config(tmp_path: Path) -> None:
    out = evaluated({"enable": True, "settings": {"quiesce": {"windw_s": 2}}})
    result = check_config(out["settingsJson"], tmp_path)
    assert result.returncode != 0
    assert "quiesce.windw_s" in result.stdout + result.stderr


def build_root_tar(tmp_path: Path) -> Path:
    """A tiny image tarball with numeric owners, as nix/debian-image.nix makes it."""
    root = tmp_path / "build" / "root"
    for d in ("etc", "home/user/Desktop", "tmp", "var/tmp", "opt/drums/guest"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "passwd").write_text(
        "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"
    )
    (root / "opt/drums/guest/desktop-init").write_text("#!/usr/bin/python3 -I\n")
    (root / "bin").symlink_to("/nix/store/x-env/bin")
    out = tmp_path / "image"
    out.mkdir()
    tar = out / "root.tar"
    common = ["--sort=name", "--mtime=@1", "--numeric-owner", "--format=gnu"]
    run = lambda *a: subprocess.run(["tar", "-C", str(root), *common, *a], check=True)  # noqa: E731
    run(
        "--owner=0",
        "--group=0",
        "--mode=go-w",
        "--exclude=./home/user",
        "--exclude=./tmp",
        "--exclude=./var/tmp",
        "-cf",
        str(tar),
        ".",
    )
    run("--owner=1000", "--group=1000", "--mode=u+rwX,go-w", "-rf", str(tar), "./home/user")
    run(
        "--owner=0",
        "--group=0",
        "--mode=1777",
        "--no-recursion",
        "-rf",
        str(tar),
        "./tmp",
        "./var/tmp",
    )
    return out


def test_sysctls_merge_with_nixos_definitions_under_nixos_types() -> None:
    sysctl = evaluated({"enable": True})["kernel"]["sysctl"]
    assert sysctl["kernel.pid_max"] == 4194304
    assert sysctl["fs.inotify.max_user_instances"] == 524288
    assert sysctl["kernel.kptr_restrict"] == 1


def test_the_sysctl_lines_before_issue_20_fail_under_nixos_types(tmp_path: Path) -> None:
    from test_nix_sysctl import OLD_LINES, with_sysctl_block

    result = evaluate({"enable": True}, with_sysctl_block(tmp_path, OLD_LINES.read_text()))
    assert result.returncode != 0
    assert "is defined multiple times while it's expected to be unique" in result.stderr


def test_ray_adds_a_pool_join_unit_after_drumsd() -> None:
    out = evaluated({"enable": True, "ray": {"enable": True, "address": "10.0.0.1:6379"}})
    assert out["failedAssertions"] == []
    unit = out["rayService"]
    assert "drumsd.service" in unit["after"] and unit["requires"] == ["drumsd.service"]
    assert unit["serviceConfig"]["ExecStart"].endswith(
        "-drums-sdk-0.1.0/bin/drums pool join --address 10.0.0.1:6379"
        " --node-label desktops-1 --block"
    )
    out = evaluated(
        {
            "enable": True,
            "ray": {
                "enable": True,
                "address": "head:6379",
                "nodeLabel": "rack-2",
                "extraArgs": ["--log-level", "debug"],
            },
        }
    )
    assert out["rayService"]["serviceConfig"]["ExecStart"].endswith(
        " --address head:6379 --node-label rack-2 --block --log-level debug"
    )
    assert evaluated({"enable": True})["rayService"] is None


@pytest.mark.parametrize(
    "ray",
    [
        {"enable": True},
        {"enable": True, "address": "no-port"},
        {"enable": True, "address": "h:1", "nodeLabel": "a b"},
    ],
)
def test_bad_ray_options_fail_naming_the_option(ray: dict[str, Any]) -> None:
    result = evaluate({"enable": True, "ray": ray})
    assert result.returncode != 0
    assert "services.drumsd.ray." in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("line", "broken"),
    [
        ('        RestartSec = "2s";\n', "        RestartSec = 2.5;\n"),  # not a unit file value
        ('        type = "tmpfs";\n', '        fstype = "tmpfs";\n'),  # no such mount field
    ],
)
def test_the_stub_types_units_as_nixos_does(tmp_path: Path, line: str, broken: str) -> None:
    from test_nix_sysctl import MODULE

    copy = tmp_path / "nixos-modules"
    shutil.copytree(MODULE.parent, copy)
    text = MODULE.read_text()
    assert text.count(line) == 1, line
    (copy / MODULE.name).write_text(text.replace(line, broken))
    result = evaluate({"enable": True}, copy / MODULE.name)
    assert result.returncode != 0
    assert "systemd." in result.stderr, result.stderr[-2000:]


def test_lxcfs_is_on_drumsds_path_when_procview_dir_is_set() -> None:
    """The per-slot /proc view starts `lxcfs` from the daemon's PATH and compiles its sysinfo()
    library with `cc` (issue 38): with procview_dir set the unit has both; without, the closure
    carries neither."""
    names = lambda out: [str(p).rsplit("-", 1)[0] for p in out["service"]["path"]]  # noqa: E731
    off = evaluated({"enable": True})
    on = evaluated({"enable": True, "settings": {"procview_dir": "/run/drums/procview"}})
    for tool in ("lxcfs", "gcc-wrapper"):
        assert not any(tool in str(p) for p in off["service"]["path"]), names(off)
        assert any(tool in str(p) for p in on["service"]["path"]), names(on)
