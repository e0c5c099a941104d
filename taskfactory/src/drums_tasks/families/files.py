"""Files and terminal families: rename, move, copy, delete, and text processing in a shell.

Setup opens an xterm; the oracle types its command into it, as an agent would.
"""

from __future__ import annotations

import hashlib
import random
import shlex

from ..actions import terminal
from ..spec import Solution, TaskSpec, sha256
from . import content
from .registry import family

HOME = "/home/user"
WORKDIRS = ["inbox", "projects", "data", "archive_2024", "scratch", "shared"]


def _workdir(rng: random.Random) -> str:
    return f"{HOME}/{rng.choice(WORKDIRS)}"


def _text(rng: random.Random, lines: int = 3) -> bytes:
    return ("\n".join(content.sentences(rng, lines)) + "\n").encode()


def run(name: str, cmd: str, effects, why: str = "") -> Solution:
    """A shell command typed into the xterm; `effects` maps inputs to the changed files."""
    return Solution(name, terminal(cmd), effects, why)


def files_options(present: dict[str, bytes], absent: list[str]) -> dict:
    return {
        "present": {d: hashlib.sha256(b).hexdigest() for d, b in present.items()},
        "blake2b": {d: hashlib.blake2b(b).hexdigest() for d, b in present.items()},
        "sizes": {d: len(b) for d, b in present.items()},
        "absent": absent,
    }


def terminal_spec(
    rng: random.Random,
    instruction: str,
    workdir: str,
    files: dict[str, bytes],
    results: list[tuple[str, str]],
    check: str,
    check_alt: str,
    options: dict,
    allow: list[str],
    oracle: Solution,
    near: list[Solution],
    dirs: list[str] | None = None,
) -> TaskSpec:
    decoy = f"{workdir}/README.txt"
    return TaskSpec(
        family="",
        app="os",
        instruction=instruction,
        files={**files, decoy: ("Do not edit.\n" + content.sentence(rng) + "\n").encode()},
        launch=[
            {"type": "launch", "parameters": {"command": ["xterm"]}},
            {"type": "sleep", "parameters": {"seconds": 2}},
        ],
        results=results,
        check=check,
        check_alt=check_alt,
        options=options,
        roots=[workdir],
        allow=allow,
        oracle=oracle,
        near_misses=near,
        decoy=decoy,
        related_apps=["os", "terminal"],
        dirs=dirs or [],
    )


def _q(p: str) -> str:
    return shlex.quote(p)


# ------------------------------------------------------------------------------------------------


@family("files_rename", "os")
def rename(rng: random.Random) -> TaskSpec:
    wd = _workdir(rng)
    old = f"{wd}/{content.filename(rng, ['draft', 'scan', 'notes', 'todo'], 'txt')}"
    new = f"{wd}/{rng.choice(['final', 'done', 'keep', 'ready'])}_{rng.randint(100, 999)}.txt"
    data = _text(rng)
    instr = f"Rename the file {old} to {new}."
    opts = files_options({"new": data}, ["old"])
    results = [(new, "new"), (old, "old")]
    oracle = run("oracle", f"mv {_q(old)} {_q(new)}", lambda i: {old: None, new: i[old]})
    near = [
        run("copied", f"cp {_q(old)} {_q(new)}", lambda i: {new: i[old]}, "copy, original kept"),
        run(
            "wrong_extension",
            f"mv {_q(old)} {_q(new[:-4] + '.text')}",
            lambda i: {old: None, new[:-4] + ".text": i[old]},
            ".text instead of .txt",
        ),
        run(
            "moved_to_desktop",
            f"mv {_q(old)} {HOME}/Desktop/{new.rsplit('/', 1)[1]}",
            lambda i: {old: None, f"{HOME}/Desktop/{new.rsplit('/', 1)[1]}": i[old]},
            "right name, wrong folder",
        ),
        run(
            "emptied",
            f"mv {_q(old)} {_q(new)} && : > {_q(new)}",
            lambda i: {old: None, new: b""},
            "renamed but truncated",
        ),
    ]
    return terminal_spec(
        rng,
        instr,
        wd,
        {old: data},
        results,
        "files_state",
        "files_state_raw",
        opts,
        [old, new],
        oracle,
        near,
    )


@family("files_move_into_folder", "os")
def move_into_folder(rng: random.Random) -> TaskSpec:
    wd = _workdir(rng)
    sub = f"{wd}/{rng.choice(['done', 'sorted', 'old', 'reports'])}"
    names = [
        f"{s}_{rng.randint(10, 99)}.txt"
        for s in content.pick(rng, ["alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar"], 4)
    ]
    datas = {n: _text(rng, 2) for n in names}
    move = names[: rng.randint(2, 3)]
    stay = [n for n in names if n not in move]
    instr = (
        f"Move the files {', '.join(move)} from {wd} into the folder {sub} (it exists). "
        "Leave the other files where they are."
    )
    results = [(f"{sub}/{n}", f"moved:{n}") for n in move] + [
        (f"{wd}/{n}", f"old:{n}") for n in move
    ]
    results += [(f"{wd}/{n}", f"stay:{n}") for n in stay]
    present = {f"moved:{n}": datas[n] for n in move} | {f"stay:{n}": datas[n] for n in stay}
    opts = files_options(present, [f"old:{n}" for n in move])

    def moving(which: list[str], keep: bool = False):
        def eff(i: dict[str, bytes]) -> dict[str, bytes | None]:
            out: dict[str, bytes | None] = {f"{sub}/{n}": i[f"{wd}/{n}"] for n in which}
            if not keep:
                out |= {f"{wd}/{n}": None for n in which}
            return out

        return eff

    def cmd(which: list[str], verb: str = "mv") -> str:
        return f"cd {_q(wd)} && {verb} {' '.join(_q(n) for n in which)} {_q(sub)}/"

    oracle = run("oracle", cmd(move), moving(move))
    near = [
        run("one_missing", cmd(move[:-1]), moving(move[:-1]), "leaves one file behind"),
        run("copied", cmd(move, "cp"), moving(move, keep=True), "copies instead of moving"),
        run("extra_file", cmd([*move, stay[0]]), moving([*move, stay[0]]), "moves one too many"),
    ]
    # setup creates `sub`, which the image lacks: the scope scan lists it as a changed directory
    allow = [sub, *(f"{sub}/{n}" for n in move), *(f"{wd}/{n}" for n in move)]
    files = {f"{wd}/{n}": d for n, d in datas.items()}
    keep = f"{sub}/.keep"
    files[keep] = b""
    return terminal_spec(
        rng, instr, wd, files, results, "files_state", "files_state_raw", opts, allow, oracle, near
    )


@family("files_delete_by_extension", "os")
def delete_by_extension(rng: random.Random) -> TaskSpec:
    wd = _workdir(rng)
    ext = rng.choice(["tmp", "bak", "old"])
    stems = content.pick(rng, ["cache", "build", "report", "photo", "index", "notes", "list"], 6)
    targets = [f"{s}.{ext}" for s in stems[:3]]
    tricky = f"{stems[3]}.{ext}.txt"  # contains the extension, does not end with it
    others = [tricky, f"{stems[4]}.txt", f"{stems[5]}.log"]
    datas = {n: _text(rng, 1) for n in targets + others}
    instr = f"Delete every file whose name ends in .{ext} in {wd}. Keep all other files."
    results = [(f"{wd}/{n}", n) for n in targets + others]
    opts = files_options({n: datas[n] for n in others}, targets)

    def deleting(names: list[str]):
        return lambda _i: {f"{wd}/{n}": None for n in names}

    oracle = run("oracle", f"rm {_q(wd)}/*.{ext}", deleting(targets))
    near = [
        run(
            "one_left",
            f"rm {' '.join(_q(f'{wd}/{n}') for n in targets[:-1])}",
            deleting(targets[:-1]),
            "misses one file",
        ),
        run(
            "too_greedy",
            f"rm {_q(wd)}/*.{ext}*",
            deleting([*targets, tricky]),
            f"also deletes {tricky}",
        ),
        run(
            "deleted_log_too",
            f"rm {_q(wd)}/*.{ext} {_q(wd)}/*.log",
            deleting([*targets, others[2]]),
            "also deletes the log",
        ),
    ]
    return terminal_spec(
        rng,
        instr,
        wd,
        {f"{wd}/{n}": d for n, d in datas.items()},
        results,
        "files_state",
        "files_state_raw",
        opts,
        [f"{wd}/{n}" for n in targets],
        oracle,
        near,
    )


@family("files_copy_to_backup", "os")
def copy_to_backup(rng: random.Random) -> TaskSpec:
    wd = _workdir(rng)
    src = f"{wd}/{content.filename(rng, ['contract', 'thesis', 'budget', 'plan'], 'txt')}"
    bdir = f"{wd}/backup"
    dst = f"{bdir}/{src.rsplit('/', 1)[1]}"
    data = _text(rng, 4)
    instr = (
        f"Make a backup copy of {src} inside the folder {bdir} (same file name); keep the original."
    )
    results = [(src, "src"), (dst, "dst")]
    opts = files_options({"src": data, "dst": data}, [])
    oracle = run("oracle", f"cp {_q(src)} {_q(bdir)}/", lambda i: {dst: i[src]})
    near = [
        run(
            "moved",
            f"mv {_q(src)} {_q(bdir)}/",
            lambda i: {dst: i[src], src: None},
            "moves the original",
        ),
        run(
            "wrong_folder",
            f"mkdir -p {_q(wd)}/backups && cp {_q(src)} {_q(wd)}/backups/",
            lambda i: {f"{wd}/backups/{src.rsplit('/', 1)[1]}": i[src]},
            "backups/ not backup/",
        ),
        run(
            "renamed_copy",
            f"cp {_q(src)} {_q(dst)}.bak",
            lambda i: {dst + ".bak": i[src]},
            "different file name",
        ),
    ]
    files = {src: data, f"{bdir}/.keep": b""}
    return terminal_spec(
        rng,
        instr,
        wd,
        files,
        results,
        "files_state",
        "files_state_raw",
        opts,
        [bdir, dst],
        oracle,
        near,
    )


# ---- text processing ---------------------------------------------------------------------------


def _output_spec(
    rng: random.Random,
    instr: str,
    wd: str,
    files: dict[str, bytes],
    out: str,
    check: str,
    want: dict,
    oracle: Solution,
    near: list[Solution],
) -> TaskSpec:
    """A task judged on the one file it may write, `out`, by `check` and its `_raw` twin;
    `want` is the rest of the checker's options (`expected` text, or `lines`)."""
    return terminal_spec(
        rng,
        instr,
        wd,
        files,
        [(out, "out")],
        check,
        f"{check}_raw",
        {"file": "out", **want},
        [out],
        oracle,
        near,
    )


def _writes(out: str, lines: list[str]):
    data = ("\n".join(lines) + "\n").encode() if lines else b""
    return lambda _i: {out: data}


@family("term_count_errors", "os")
def count_errors(rng: random.Random) -> TaskSpec:
    wd = _workdir(rng)
    log = f"{wd}/service.log"
    out = f"{wd}/error_count.txt"
    lines = []
    for i in range(rng.randint(20, 40)):
        level = rng.choice(["INFO", "INFO", "WARN", "ERROR"])
        msg = rng.choice(
            [
                "request served",
                "cache miss",
                "retrying upload",
                "disk at 80%",
                "no error in batch",
                "user login",
                "timeout talking to db",
            ]
        )
        lines.append(f"2024-05-{1 + i % 28:02d} 10:{i % 60:02d} {level} {msg}")
    lines.append("2024-05-29 11:00 ERROR lost connection")
    data = ("\n".join(lines) + "\n").encode()
    n_err = sum(" ERROR " in ln for ln in lines)
    n_ci = sum("error" in ln.lower() for ln in lines)
    n_warn = sum(" WARN " in ln for ln in lines)
    instr = (
        f"Count the lines of {log} whose level is ERROR (the upper-case word ERROR) and "
        f"write just that number into {out}."
    )
    oracle = run("oracle", f"grep -c ' ERROR ' {_q(log)} > {_q(out)}", _writes(out, [str(n_err)]))
    cands = [
        ("case_insensitive", n_ci, f"grep -ci error {_q(log)}"),
        ("warn_lines", n_warn, f"grep -c ' WARN ' {_q(log)}"),
        ("off_by_one", n_err - 1, f"echo {n_err - 1}"),
    ]
    near = [
        run(nm, f"{c} > {_q(out)}", _writes(out, [str(v)]), nm) for nm, v, c in cands if v != n_err
    ]
    if len(near) < 3:
        near.append(
            run(
                "all_lines",
                f"grep -c '' {_q(log)} > {_q(out)}",
                _writes(out, [str(len(lines))]),
                "counts every line",
            )
        )
    # The count is worked out from the log read back (its hash checked), not carried in the task.
    options = {
        "file": "out",
        "source": "source.text",
        "source_type": "text",
        "source_sha256": sha256(data),
        "question": {"kind": "line_count", "contains": " ERROR "},
    }
    return terminal_spec(
        rng,
        instr,
        wd,
        {log: data},
        [(out, "out"), (log, "source.text")],
        "answer_from_source",
        "answer_from_source_raw",
        options,
        [out],
        oracle,
        near,
    )


@family("term_sort_unique", "os")
def sort_unique(rng: random.Random) -> TaskSpec:
    wd = _workdir(rng)
    src = f"{wd}/names.txt"
    out = f"{wd}/names_sorted.txt"
    base = content.pick(rng, content.PEOPLE, rng.randint(6, 9))
    names = base + rng.sample(base, 3)
    rng.shuffle(names)
    while all(names[i] != names[i + 1] for i in range(len(names) - 1)):
        names.insert(1, names[0])  # at least one adjacent duplicate for the uniq-only near miss
    data = ("\n".join(names) + "\n").encode()
    want = sorted(set(names))
    instr = (
        f"Write the names of {src}, sorted alphabetically and without duplicates (one per "
        f"line), into {out}."
    )
    q, o = _q(src), _q(out)
    oracle = run("oracle", f"sort -u {q} > {o}", _writes(out, want))
    adjacent_uniq = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    near = [
        run("duplicates_kept", f"sort {q} > {o}", _writes(out, sorted(names)), "sort without -u"),
        run("reverse_order", f"sort -ru {q} > {o}", _writes(out, want[::-1]), "reversed"),
        run("uniq_unsorted", f"uniq {q} > {o}", _writes(out, adjacent_uniq), "uniq without sort"),
    ]
    return _output_spec(
        rng, instr, wd, {src: data}, out, "lines_equal", {"lines": want}, oracle, near
    )


@family("term_head_lines", "os")
def head_lines(rng: random.Random) -> TaskSpec:
    wd = _workdir(rng)
    src = f"{wd}/measurements.csv"
    out = f"{wd}/first_rows.csv"
    rows = ["date,value"] + [f"2024-06-{d:02d},{rng.randint(100, 999)}" for d in range(1, 21)]
    n = rng.randint(4, 9)
    data = ("\n".join(rows) + "\n").encode()
    instr = f"Save the first {n} lines of {src} (including its header line) into {out}."
    q, o = _q(src), _q(out)
    oracle = run("oracle", f"head -n {n} {q} > {o}", _writes(out, rows[:n]))
    near = [
        run("one_short", f"head -n {n - 1} {q} > {o}", _writes(out, rows[: n - 1]), "n-1 lines"),
        run("one_extra", f"head -n {n + 1} {q} > {o}", _writes(out, rows[: n + 1]), "n+1 lines"),
        run("last_lines", f"tail -n {n} {q} > {o}", _writes(out, rows[-n:]), "the last lines"),
        run(
            "header_skipped",
            f"tail -n +2 {q} | head -n {n} > {o}",
            _writes(out, rows[1 : n + 1]),
            "without the header",
        ),
    ]
    return _output_spec(
        rng, instr, wd, {src: data}, out, "lines_equal", {"lines": rows[:n]}, oracle, near
    )


@family("term_edit_config", "os")
def edit_config(rng: random.Random) -> TaskSpec:
    wd = _workdir(rng)
    path = f"{wd}/app.ini"
    old = rng.choice([8080, 8000, 5000, 3000])
    new = rng.choice([9090, 8443, 7000, 6060])
    keys = [
        ("host", "localhost"),
        ("port", str(old)),
        ("backup_port", str(old)),
        ("workers", str(rng.randint(2, 8))),
        ("log_level", rng.choice(["info", "debug"])),
    ]
    lines = ["[server]"] + [f"{k} = {v}" for k, v in keys]
    data = ("\n".join(lines) + "\n").encode()
    want = [
        ln.replace(f"port = {old}", f"port = {new}") if ln.startswith("port ") else ln
        for ln in lines
    ]
    instr = (
        f"In {path}, change the value of the key 'port' (not 'backup_port') from {old} to "
        f"{new}. Change nothing else."
    )
    q = _q(path)
    oracle = run("oracle", f"sed -i 's/^port = {old}$/port = {new}/' {q}", _writes(path, want))
    near = [
        run(
            "both_ports",
            f"sed -i 's/{old}/{new}/' {q}",
            _writes(path, [ln.replace(str(old), str(new)) for ln in lines]),
            "also changes backup_port",
        ),
        run(
            "duplicate_key",
            f"echo 'port = {new}' >> {q}",
            _writes(path, [*lines, f"port = {new}"]),
            "adds a second port line",
        ),
        run(
            "wrong_key",
            f"sed -i 's/^backup_port = {old}$/backup_port = {new}/' {q}",
            _writes(
                path, [ln.replace(f"backup_port = {old}", f"backup_port = {new}") for ln in lines]
            ),
            "changes backup_port only",
        ),
    ]
    spec = _output_spec(
        rng, instr, wd, {path: data}, path, "lines_equal", {"lines": want}, oracle, near
    )
    return spec
