"""The image's app manifest, the support check that names a missing app, `drumsd tasks coverage`
over the shared OSWorld tasks, and the pinned OSWorld checkout (issue 19)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from drumsd.cli import main as drumsd_main
from drumsd.core.config import Config, ConfigError, OsworldConfig, config_from_text
from drumsd.linux.image_apps import (
    AppManifest,
    manifest_for_root,
    probe_apps,
    read_manifest,
    write_manifest,
)
from drumsd.tasks.apps import missing_app_reason, task_needs, task_schemas
from drumsd.tasks.coverage import coverage, reason_kind, render_table
from drumsd.tasks.host_support import support
from drumsd.tasks.model import MetricCatalog, Task, TaskContext, list_tasks
from drumsd.tasks.osworld_pin import (
    MARKER,
    OsworldFetchError,
    fetch_osworld,
    resolve_osworld,
    tarball_url,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "osworld"
VSCODE = "276cc624-87ea-4f08-ab93-f770e3790175"
GNOME_SETTINGS = {
    "a4d98375-215b-4a4d-aee9-3d4370fccc41": "org.gnome.desktop.screensaver",
    "bedcedc4-4d72-425e-ad62-21960b11fe0d": "org.gnome.desktop.session",
    "f9be0997-4b7c-45c5-b05c-4612b44a6118": "org.gnome.desktop.notifications",
    "3ce045a0-877b-42aa-8d2c-b4a863336ab8": "org.gnome.desktop.interface",
}
SCREENSAVER_SCHEMA = """<schemalist>
  <schema id="org.gnome.desktop.screensaver" path="/org/gnome/desktop/screensaver/">
    <key name="lock-enabled" type="b"><default>true</default></key>
  </schema>
</schemalist>
"""


def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared OSWorld tasks not found at {SHARED}")
    return SHARED


def task(**fields) -> Task:
    fields.setdefault("evaluator", {"func": "infeasible"})
    return Task.model_validate({"id": "t1", "instruction": "x", **fields})


def fake_image(root: Path, *, commands=(), files=(), schemas: dict[str, str] | None = None) -> Path:
    """An image root with these executables and files (empty), like the office image's layout."""
    for name in commands:
        path = root / "usr/bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    for name, text in (schemas or {}).items():
        path = root / "usr/share/glib-2.0/schemas" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


OFFICE_LIKE = {
    "commands": ("chromium", "gimp", "gsettings", "dconf"),
    "files": (
        "usr/lib/libreoffice/program/libsclo.so",
        "usr/lib/libreoffice/program/libswlo.so",
        "usr/lib/libreoffice/program/libsdlo.so",
        "usr/lib/x86_64-linux-gnu/gio/modules/libdconfsettings.so",
    ),
}


# ---------------------------------------------------------------- the probe and the manifest


def test_probe_finds_what_the_tree_has(tmp_path: Path) -> None:
    root = fake_image(tmp_path / "root", **OFFICE_LIKE)
    # An absolute symlink inside an image points into the image, never at the host's file.
    (root / "usr/bin/code").symlink_to("/usr/share/code/bin/code")
    manifest = probe_apps(root, "office")
    assert manifest.apps == {
        "chrome",
        "gimp",
        "image",  # GIMP opens images
        "gsettings",
        "dconf",
        "libreoffice_calc",
        "libreoffice_writer",
        "libreoffice_impress",
    }
    (root / "usr/share/code/bin").mkdir(parents=True)
    (root / "usr/share/code/bin/code").touch()
    assert "vscode" in probe_apps(root, "office").apps


def test_gsettings_needs_the_dconf_backend(tmp_path: Path) -> None:
    root = fake_image(tmp_path / "root", commands=("gsettings",))
    assert "gsettings" not in probe_apps(root).apps
    fake_image(root, files=("usr/lib/x86_64-linux-gnu/gio/modules/libdconfsettings.so",))
    assert "gsettings" in probe_apps(root).apps


def test_manifest_round_trips_next_to_the_root(tmp_path: Path) -> None:
    root = fake_image(tmp_path / "img" / "root", schemas={"s.gschema.xml": SCREENSAVER_SCHEMA})
    manifest = probe_apps(root, "img")
    assert manifest.schemas == {"org.gnome.desktop.screensaver"}
    assert read_manifest(root.parent) is None
    write_manifest(root.parent, manifest)
    data = json.loads((root.parent / "apps.json").read_text())
    assert "thunderbird" in data["missing"] and data["profile"] == "img"
    # The builder's manifest wins over a fresh probe: what was recorded at build time.
    (root / "usr/share/glib-2.0/schemas/s.gschema.xml").unlink()
    assert manifest_for_root(root).schemas == {"org.gnome.desktop.screensaver"}
    (root.parent / "apps.json").write_text('{"version": 99}')
    assert manifest_for_root(root).schemas == frozenset()


# ---------------------------------------------------------------- what a task needs


def test_related_apps_in_osworld_spellings() -> None:
    t = task(related_apps=["libreoffice calc", "vs_code", "os", "Thunderbird"])
    assert [n.app for n in task_needs(t)] == ["libreoffice_calc", "vscode", "thunderbird"]


def test_programs_in_steps_and_command_getters() -> None:
    t = task(
        config=[
            {"type": "launch", "parameters": {"command": ["libreoffice", "--calc"]}},
            {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork"]}},
            {
                "type": "execute",
                "parameters": {"command": "cd /tmp && vlc --play x.mp4", "shell": True},
            },
        ],
        evaluator={
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "timeout 10 thunderbird --version"},
            "expected": {"type": "rule", "rules": {"expected": "x"}},
        },
    )
    needs = {n.app: n.why for n in task_needs(t)}
    assert needs == {
        "libreoffice_calc": "runs `libreoffice`",
        "vlc": "runs `vlc`",
        "thunderbird": "runs `thunderbird`",
    }


def test_gsettings_schemas_from_lists_and_shell_strings() -> None:
    tasks, _ = list_tasks([shared_dir()])
    by_id = {t.id: t for t in tasks}
    for task_id, schema in GNOME_SETTINGS.items():
        assert schema in task_schemas(by_id[task_id]), task_id
    assert task_schemas(by_id["e0df059f-28a6-4169-924f-b9623e7184cc"]) == []


def test_missing_app_reason_names_the_app(tmp_path: Path) -> None:
    office = probe_apps(fake_image(tmp_path / "root", **OFFICE_LIKE), "office")
    reason = missing_app_reason(task(related_apps=["vscode"]), office)
    assert reason == "needs VS Code (related_apps lists 'vscode'), which image 'office' lacks"
    assert missing_app_reason(task(related_apps=["chrome", "gimp", "os"]), office) is None
    unknown = missing_app_reason(task(related_apps=["krita"]), office)
    assert unknown is not None and "'krita'" in unknown
    settings = task(
        config=[
            {
                "type": "execute",
                "parameters": {
                    "command": [
                        "gsettings",
                        "set",
                        "org.gnome.desktop.screensaver",
                        "lock-enabled",
                        "false",
                    ]
                },
            }
        ]
    )
    reason = missing_app_reason(settings, office)
    assert reason is not None and "org.gnome.desktop.screensaver" in reason, reason
    with_schema = AppManifest("osworld", office.apps, frozenset({"org.gnome.desktop.screensaver"}))
    assert missing_app_reason(settings, with_schema) is None


# ---------------------------------------------------------------- support() with an image


def catalog_for(tasks: list[Task]) -> MetricCatalog:
    """Every func the tasks name counts as exported: the app check alone decides here."""
    funcs = {f for t in tasks for f in t.evaluator.funcs}
    return MetricCatalog(exported={f: "m" for f in funcs})


def test_support_refuses_the_shared_tasks_the_office_image_cannot_run(tmp_path: Path) -> None:
    tasks, _ = list_tasks([shared_dir()])
    office = probe_apps(fake_image(tmp_path / "root", **OFFICE_LIKE), "office")
    ctx = TaskContext(cache_dir=tmp_path / "cache", metrics=catalog_for(tasks), apps=office)
    rows = {t.id: support(t, ctx) for t in tasks}
    assert rows[VSCODE] == (
        False,
        "needs VS Code (related_apps lists 'vscode'), which image 'office' lacks",
    )
    for task_id, schema in GNOME_SETTINGS.items():
        ok, reason = rows[task_id]
        assert not ok and reason is not None and f"GSettings schema {schema!r}" in reason, reason
    # Without a manifest (no image known) the same tasks pass the app check, as before.
    unchecked = ctx.model_copy(update={"apps": None})
    assert support(next(t for t in tasks if t.id == VSCODE), unchecked) == (True, None)


def test_support_on_base_names_each_app(tmp_path: Path) -> None:
    tasks, _ = list_tasks([shared_dir()])
    base = probe_apps(fake_image(tmp_path / "root", commands=("gsettings", "dconf")), "base")
    ctx = TaskContext(cache_dir=tmp_path / "cache", metrics=catalog_for(tasks), apps=base)
    reasons = {t.id: support(t, ctx)[1] for t in tasks}
    assert "Chromium" in (reasons["030eeff7-b492-4218-b312-701ec99ee0cc"] or "")
    assert "GIMP" in (reasons["7b7617bd-57cc-468e-9c91-40c4ec2bcb3d"] or "")
    assert "LibreOffice Impress" in (reasons["2cd43775-7085-45d8-89fa-9e35c0a915cf"] or "")
    assert reasons["e0df059f-28a6-4169-924f-b9623e7184cc"] is None
    assert reasons["c288e301-e626-4b98-a1ab-159dcb162af5"] is None


# ---------------------------------------------------------------- coverage


def test_coverage_over_the_shared_tasks(tmp_path: Path) -> None:
    tasks, _ = list_tasks([shared_dir()])
    office = probe_apps(fake_image(tmp_path / "root", **OFFICE_LIKE), "office")
    ctx = TaskContext(cache_dir=tmp_path / "empty", metrics=catalog_for(tasks), apps=office)
    passes, apps = coverage(shared_dir(), ctx, assume_downloads=True)
    offline, with_files = passes
    assert sum(offline.total.values()) == 15
    per_domain = {
        d: (offline.supported[d], with_files.supported[d], offline.total[d]) for d in offline.total
    }
    assert per_domain == {
        "chrome": (2, 2, 2),
        "gimp": (2, 2, 2),
        "libreoffice_calc": (0, 1, 1),
        "libreoffice_impress": (1, 1, 1),
        "libreoffice_writer": (0, 1, 1),
        "os": (2, 2, 7),
        "vs_code": (0, 0, 1),
    }
    assert offline.reasons["download not in the cache"] == 2
    assert with_files.reasons["download not in the cache"] == 0
    assert offline.reasons["needs VS Code, which image 'office' lacks"] == 1
    assert apps["vscode"] == 1 and apps["schema org.gnome.desktop.screensaver"] == 1
    table = render_table(passes, apps, "office")
    assert "| **all** | **7 / 15** | **9 / 15** |" in table
    assert "| vs_code | 0 / 1 | 0 / 1 |" in table
    # The stand-in cache is gone with the pass: the host's cache was never written.
    assert not (tmp_path / "empty").exists()


def test_reason_kind_drops_paths() -> None:
    assert reason_kind("download not in the cache: /c/x/a.xlsx") == "download not in the cache"
    assert reason_kind("upload_file source missing: /a/b") == "upload_file source missing"
    assert (
        reason_kind("needs VLC (runs `vlc`), which image 'office' lacks")
        == "needs VLC, which image 'office' lacks"
    )


def test_coverage_command_writes_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_image(tmp_path / "img" / "root", **OFFICE_LIKE)
    out = tmp_path / "cov.json"
    rc = drumsd_main(
        [
            "tasks",
            "coverage",
            "--osworld",
            str(shared_dir()),
            "--assume-downloads",
            "--image",
            str(root),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| domain |" in printed and "downloads assumed present" in printed
    data = json.loads(out.read_text())
    assert [p["total"] for p in data["passes"]] == [15, 15]
    assert data["missing_apps"]["vscode"] == 1
    rows = {r["id"]: r for r in data["passes"][1]["tasks"]}
    assert rows[VSCODE]["supported"] is False and "VS Code" in rows[VSCODE]["reason"]


def test_coverage_command_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert drumsd_main(["tasks", "coverage", "--osworld", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert drumsd_main(["tasks", "coverage", "--osworld", str(tmp_path), "--image", "none"]) == 1
    assert "no task files" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no image root"):
        drumsd_main(
            [
                "tasks",
                "coverage",
                "--osworld",
                str(tmp_path),
                "--image",
                "nosuch",
                "--images-dir",
                str(tmp_path),
            ]
        )


# ---------------------------------------------------------------- the pinned OSWorld checkout


def osworld_tarball(path: Path, commit: str, extra: dict[str, bytes] | None = None) -> str:
    """A tarball shaped like GitHub's archive of a commit; returns its sha256."""
    top = f"OSWorld-{commit}"
    members = {
        f"{top}/desktop_env/evaluators/metrics/__init__.py": b"code, never unpacked\n",
        f"{top}/evaluation_examples/examples/os/t1.json": json.dumps(
            {"id": "t1", "instruction": "x", "evaluator": {"func": "infeasible"}}
        ).encode(),
        f"{top}/evaluation_examples/test_all.json": b"{}",
        **(extra or {}),
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_fetch_checks_the_hash_and_keeps_only_the_task_files(tmp_path: Path) -> None:
    tarball = tmp_path / "osworld.tar.gz"
    sha = osworld_tarball(tarball, COMMIT)
    cfg = OsworldConfig(commit=COMMIT, sha256=sha, cache_dir=tmp_path / "cache")
    assert resolve_osworld(cfg).state == "not_fetched"
    where = fetch_osworld(cfg, url=tarball.as_uri())
    assert where == tmp_path / "cache" / sha / "examples"
    assert sorted(p.relative_to(where).as_posix() for p in where.rglob("*") if p.is_file()) == [
        "os/t1.json"
    ]
    assert json.loads((where.parent / MARKER).read_text())["commit"] == COMMIT
    source = resolve_osworld(cfg)
    assert source.state == "pinned" and source.tasks_dir == where
    # Cached: the tarball is not read again.
    tarball.unlink()
    assert fetch_osworld(cfg, url=tarball.as_uri()) == where


def test_fetch_refuses_a_tarball_that_is_not_the_pin(tmp_path: Path) -> None:
    tarball = tmp_path / "osworld.tar.gz"
    osworld_tarball(tarball, COMMIT)
    cfg = OsworldConfig(commit=COMMIT, sha256="0" * 64, cache_dir=tmp_path / "cache")
    with pytest.raises(OsworldFetchError, match="not the pinned"):
        fetch_osworld(cfg, url=tarball.as_uri())
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half-fetched stays
    with pytest.raises(OsworldFetchError, match="cannot fetch"):
        fetch_osworld(cfg, url=(tmp_path / "absent.tar.gz").as_uri())


def test_fetch_never_writes_outside_its_dir(tmp_path: Path) -> None:
    tarball = tmp_path / "osworld.tar.gz"
    evil = {f"OSWorld-{COMMIT}/evaluation_examples/examples/../../../../escaped.json": b"{}"}
    sha = osworld_tarball(tarball, COMMIT, evil)
    cfg = OsworldConfig(commit=COMMIT, sha256=sha, cache_dir=tmp_path / "cache")
    with pytest.raises(OsworldFetchError):
        fetch_osworld(cfg, url=tarball.as_uri())
    assert not list(tmp_path.rglob("escaped.json"))


def test_resolve_prefers_a_configured_dir(tmp_path: Path) -> None:
    checkout = tmp_path / "OSWorld"
    (checkout / "evaluation_examples/examples/os").mkdir(parents=True)
    cfg = OsworldConfig(dir=checkout, commit=COMMIT, sha256="a" * 64)
    assert resolve_osworld(cfg).state == "missing"  # an empty copy is said so, not used
    (checkout / "evaluation_examples/examples/os/t1.json").write_text("{}")
    source = resolve_osworld(cfg)
    assert source.state == "dir" and source.tasks_dir == checkout / "evaluation_examples/examples"
    assert resolve_osworld(OsworldConfig()).state == "off"
    assert tarball_url("https://github.com/o/r", COMMIT).endswith(f"/archive/{COMMIT}.tar.gz")


def test_osworld_config_refuses_half_pins_and_bad_hashes() -> None:
    def problems(osworld: dict) -> str:
        text = json.dumps({"token_file": "/t", "tasks": {"osworld": osworld}})
        with pytest.raises(ConfigError) as exc:
            config_from_text(text)
        return " ".join(exc.value.problems)

    assert "go together" in problems({"commit": COMMIT})
    assert "40 hex" in problems({"commit": "abc", "sha256": "a" * 64})
    assert "64 hex" in problems({"commit": COMMIT, "sha256": "xyz"})
    assert "https" in problems({"repository": "git@github.com:o/r"})
    ok = config_from_text(
        json.dumps(
            {
                "token_file": "/t",
                "tasks": {"osworld": {"commit": COMMIT.upper(), "sha256": "A" * 64}},
            }
        )
    )
    assert isinstance(ok, Config) and ok.tasks.osworld.commit == COMMIT


def test_terminal_and_files_mean_any_such_app(tmp_path: Path) -> None:
    """The task factory's ["os", "terminal"] tasks run on the base image's xterm."""
    base = probe_apps(fake_image(tmp_path / "root", commands=("xterm",)), "base")
    assert missing_app_reason(task(related_apps=["os", "terminal"]), base) is None
    assert "file manager" in (missing_app_reason(task(related_apps=["files"]), base) or "")
    reason = missing_app_reason(
        task(config=[{"type": "launch", "parameters": {"command": ["gnome-terminal"]}}]), base
    )
    assert reason is not None and "GNOME Terminal" in reason


def test_a_manifest_from_another_app_table_is_reprobed(tmp_path: Path) -> None:
    root = fake_image(tmp_path / "img" / "root", commands=("gimp",))
    write_manifest(tmp_path / "img", AppManifest("img", frozenset({"vlc"})))
    assert manifest_for_root(root).apps == {"vlc"}
    data = json.loads((tmp_path / "img" / "apps.json").read_text())
    data["table"] = "0" * 16
    (tmp_path / "img" / "apps.json").write_text(json.dumps(data))
    assert read_manifest(tmp_path / "img") is None
    assert manifest_for_root(root).apps == {"gimp", "image"}


def test_the_daemon_says_when_a_pinned_osworld_is_not_fetched(tmp_path: Path) -> None:
    from drumsd.serve import task_seams

    images = tmp_path / "images"
    fake_image(images / "office" / "root", **OFFICE_LIKE)
    (images / "office" / "image.json").write_text(json.dumps({"sha256": "a" * 64}))
    text = json.dumps(
        {
            "token_file": "/t",
            "images_dir": str(images),
            "default_image": "office",
            "tasks": {
                "osworld": {
                    "commit": COMMIT,
                    "sha256": "b" * 64,
                    "cache_dir": str(tmp_path / "cache"),
                }
            },
        }
    )
    bridge = task_seams(config_from_text(text), runtime=None)["tasks"]  # type: ignore[arg-type]
    status = bridge.status
    assert status["image"] == "office" and "gimp" in status["image_apps"]
    assert status["osworld"]["state"] == "not_fetched"
    assert any("fetch-osworld" in w for w in status["warnings"]), status
    assert bridge.ctx.apps is not None and "vscode" not in bridge.ctx.apps.apps


def test_coverage_command_answers_as_the_configured_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--config: the daemon's default image and its tasks block (here a 1 s setup bound, which
    the Chrome tasks' 3 s postconfig sleep exceeds)."""
    fake_image(tmp_path / "images" / "office" / "root", **OFFICE_LIKE)
    config = tmp_path / "drumsd.json"
    config.write_text(
        json.dumps(
            {
                "token_file": "/t",
                "images_dir": str(tmp_path / "images"),
                "default_image": "office",
                "tasks": {"setup_timeout_s": 1.0, "cache_dir": str(tmp_path / "cache")},
            }
        )
    )
    out = tmp_path / "cov.json"
    argv = ["tasks", "coverage", "--osworld", str(shared_dir()), "--config", str(config)]
    assert drumsd_main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["image"] == "office"
    rows = {r["id"]: r for r in data["passes"][0]["tasks"]}
    chrome = rows["030eeff7-b492-4218-b312-701ec99ee0cc"]
    assert chrome["supported"] is False and "setup_timeout_s" in chrome["reason"], chrome
    capsys.readouterr()


def test_an_open_step_needs_the_app_its_file_opens_in(tmp_path: Path) -> None:
    base = probe_apps(fake_image(tmp_path / "root", commands=("xterm",)), "base")
    opens = task(config=[{"type": "open", "parameters": {"path": "/home/user/a.XLSX"}}])
    assert task_needs(opens)[0].why == "opens a .XLSX file"
    reason = missing_app_reason(opens, base)
    assert reason == "needs LibreOffice Calc (opens a .XLSX file), which image 'base' lacks"
    plain = task(config=[{"type": "open", "parameters": {"path": "/home/user/notes.txt"}}])
    assert missing_app_reason(plain, base) is None


def test_a_slot_is_checked_against_its_own_image(tmp_path: Path) -> None:
    from drumsd.core.seams import SlotHandle
    from drumsd.tasks.bridge import TaskBridge

    office = probe_apps(fake_image(tmp_path / "office" / "root", **OFFICE_LIKE), "office")
    base_root = fake_image(tmp_path / "base" / "root", commands=("xterm",))
    bridge = TaskBridge(TaskContext(apps=office), runtime=None)  # type: ignore[arg-type]
    handle = SlotHandle(
        slot_id="s1",
        init_pid=1,
        init_starttime=1,
        root=tmp_path,
        upper=tmp_path,
        checkpoint_id="c",
        extra={"lower": [str(base_root)]},
    )
    gimp = task(related_apps=["gimp"])
    assert support(gimp, bridge.ctx) == (True, None)
    ok, reason = support(gimp, bridge.context_for(handle))
    assert not ok and reason == "needs GIMP (related_apps lists 'gimp'), which image 'base' lacks"


def test_coverage_counts_only_the_checkouts_test_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In an OSWorld checkout the task set is evaluation_examples/test_all.json: a task file the
    list does not name is left out, a listed id with no file counts as unsupported (so the total
    is the list's), and --test-list none counts every file."""
    examples = tmp_path / "OSWorld" / "evaluation_examples" / "examples"
    for domain, ids in {"os": ["a", "b", "extra"], "chrome": ["c"]}.items():
        (examples / domain).mkdir(parents=True)
        for task_id in ids:
            body = {"id": task_id, "instruction": "x", "evaluator": {"func": "infeasible"}}
            (examples / domain / f"{task_id}.json").write_text(json.dumps(body))
    listed = {"os": ["a", "b"], "chrome": ["c", "gone"]}
    (examples.parent / "test_all.json").write_text(json.dumps(listed))
    checkout = tmp_path / "OSWorld"
    base = ["tasks", "coverage", "--osworld", str(checkout), "--image", "none"]

    assert drumsd_main([*base, "--json", str(tmp_path / "a.json")]) == 0
    first = json.loads((tmp_path / "a.json").read_text())["passes"][0]
    assert (first["supported"], first["total"]) == (3, 4)
    gone = next(r for r in first["tasks"] if r["id"] == "gone")
    assert gone["domain"] == "chrome" and "no such file" in gone["reason"]
    assert "extra" not in {r["id"] for r in first["tasks"]}
    assert "the 4 of" in capsys.readouterr().out

    # The examples directory itself finds the same list; 'none' counts every file.
    assert (
        drumsd_main([*base[:3], str(examples), *base[4:], "--json", str(tmp_path / "b.json")]) == 0
    )
    assert json.loads((tmp_path / "b.json").read_text())["passes"][0]["total"] == 4
    assert drumsd_main([*base, "--test-list", "none", "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["passes"][0]["total"] == 4

    (tmp_path / "bad.json").write_text('["not", "a", "mapping"]')
    assert drumsd_main([*base, "--test-list", str(tmp_path / "bad.json")]) == 2
    assert "is not a test list" in capsys.readouterr().err


def test_osworlds_short_spellings_name_real_apps(tmp_path: Path) -> None:
    t = task(related_apps=["writer", "calc", "browser", "libreoffice", "pdf", "image", "os"])
    assert [n.app for n in task_needs(t)] == [
        "libreoffice_writer",
        "libreoffice_calc",
        "chrome",
        "libreoffice",
        "pdf",
        "image",
    ]
    office = probe_apps(
        fake_image(
            tmp_path / "office",
            commands=OFFICE_LIKE["commands"],
            files=(*OFFICE_LIKE["files"], "usr/lib/libreoffice/program/soffice.bin"),
        ),
        "office",
    )
    # No PDF viewer but LibreOffice without its PDF import: a PDF task is refused, by name.
    assert missing_app_reason(t, office) == (
        "needs a program that opens PDF files (related_apps lists 'pdf'), "
        "which image 'office' lacks"
    )
    with_import = probe_apps(
        fake_image(tmp_path / "office", files=("usr/lib/libreoffice/program/libpdfimportlo.so",)),
        "office",
    )
    assert missing_app_reason(t, with_import) is None
    opens = task(config=[{"type": "open", "parameters": {"path": "/home/user/scan.PNG"}}])
    assert [n.app for n in task_needs(opens)] == ["image"]


def test_apps_no_image_has_are_refused_by_name(tmp_path: Path) -> None:
    base = probe_apps(fake_image(tmp_path / "root", commands=("xterm", "vlc")), "base")
    player = missing_app_reason(task(related_apps=["vlc", "ubuntu_media_player"]), base)
    assert player == (
        "needs GNOME Videos (Ubuntu's media player) (related_apps lists "
        "'ubuntu_media_player'), which image 'base' lacks"
    )
    picard = missing_app_reason(task(related_apps=["os", "picard"]), base)
    assert picard == (
        "needs MusicBrainz Picard (related_apps lists 'picard'), which image 'base' lacks"
    )


def test_coverage_gives_the_features_an_images_apps_bring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the daemon's bridge does: an image with AT-SPI serves the accessibility_tree getter."""
    tree_task = {
        "id": "a11y",
        "instruction": "x",
        "related_apps": ["os"],
        "evaluator": {
            "func": "check_accessibility_tree",
            "result": {"type": "accessibility_tree"},
            "expected": {"type": "rule", "rules": {}},
        },
    }
    tasks_dir = tmp_path / "examples" / "os"
    tasks_dir.mkdir(parents=True)
    (tasks_dir / "a11y.json").write_text(json.dumps(tree_task))
    files = (
        "usr/libexec/at-spi-bus-launcher",
        "usr/lib/python3/dist-packages/pyatspi/__init__.py",
    )
    answers = {}
    for name, extra in (("plain", ()), ("a11y", files)):
        root = fake_image(tmp_path / name / "root", commands=("xterm",), files=extra)
        out = tmp_path / f"{name}.json"
        args = ["tasks", "coverage", "--osworld", str(tmp_path / "examples"), "--image", str(root)]
        rc = drumsd_main([*args, "--test-list", "none", "--json", str(out)])
        assert rc == 0
        answers[name] = json.loads(out.read_text())["passes"][0]["tasks"][0]
    capsys.readouterr()
    assert answers["a11y"]["supported"] is True, answers["a11y"]
    assert answers["plain"]["supported"] is False
    assert "accessibility_tree" in answers["plain"]["reason"]


def test_a_setup_that_installs_packages_needs_the_network() -> None:
    from drumsd.tasks.apps import network_setup_command

    apt = task(
        config=[
            {
                "type": "execute",
                "parameters": {
                    "command": "echo password | sudo -S apt-get update && sudo apt install jq -y",
                    "shell": True,
                },
            }
        ]
    )
    assert network_setup_command(apt) == "apt-get update"
    pip = task(config=[{"type": "command", "parameters": {"command": ["pip", "install", "x"]}}])
    assert network_setup_command(pip) == "pip install x"
    local = task(config=[{"type": "execute", "parameters": {"command": ["apt", "list"]}}])
    assert network_setup_command(local) is None


def test_a_task_that_runs_a_systemd_tool_is_refused_by_name(tmp_path: Path) -> None:
    """`timedatectl status` prints nothing on a slot (no systemd): the task is refused naming it,
    from a command getter as from a setup step; an ordinary command is not."""
    ctx = TaskContext(cache_dir=tmp_path)
    getter = task(
        evaluator={
            "func": "is_utc_0",
            "result": {"type": "vm_command_line", "command": "timedatectl status", "shell": True},
        }
    )
    ok, reason = support(getter, ctx)
    assert not ok and "`timedatectl status`" in (reason or "") and "systemd" in (reason or "")
    setup = task(
        config=[{"type": "execute", "parameters": {"command": ["systemctl", "stop", "x"]}}]
    )
    assert support(setup, ctx)[0] is False
    plain = task(config=[{"type": "execute", "parameters": {"command": "ls -l /tmp"}}])
    assert support(plain, ctx) == (True, None)
    assert reason_kind(reason or "").startswith("it runs a systemd tool")
