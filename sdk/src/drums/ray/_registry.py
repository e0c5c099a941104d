"""Files on each drums host that the pool's actors on that node read: where its drumsd listens
and its token file (`<pool dir>/<label>.json`, written by `drums pool join`), and the env
leases the keeper sweeps (`<pool dir>/<label>.leases/<pid>-<starttime>.json`).

Nothing secret crosses Ray: an actor reads the token from its own node's disk.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set

DEFAULT_POOL_DIR = "/run/drums-pool"


def pool_dir() -> Path:
    return Path(os.environ.get("DRUMS_POOL_DIR") or DEFAULT_POOL_DIR)


@dataclass(frozen=True)
class HostEntry:
    label: str
    url: str
    token_file: str


def write_host(entry: HostEntry, root: Optional[Path] = None) -> Path:
    root = root or pool_dir()
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = root / f"{entry.label}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": entry.url, "token_file": entry.token_file}))
    tmp.chmod(0o644)  # the token file keeps its own 0600; this only names it
    tmp.replace(path)
    return path


def read_host(label: str, root: Optional[Path] = None) -> HostEntry:
    root = root or pool_dir()
    path = root / f"{label}.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LookupError(
            f"drums host {label!r} is not registered on this node ({path}: {exc}); run "
            f"`drums pool join --node-label {label} ...` here"
        ) from None
    return HostEntry(label, str(raw["url"]), str(raw["token_file"]))


def _starttime(pid: int) -> Optional[int]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def lease_dir(label: str, root: Optional[Path] = None) -> Path:
    return (root or pool_dir()) / f"{label}.leases"


def write_lease(label: str, env_ids: List[str], root: Optional[Path] = None) -> Path:
    """This process holds `env_ids` on host `label`; the keeper destroys them once it is gone."""
    d = lease_dir(label, root)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / f"{process_key()}.json"
    if not env_ids:
        path.unlink(missing_ok=True)
        return path
    tmp = d / f".{path.name}.tmp"
    tmp.write_text(json.dumps(sorted(env_ids)))
    tmp.replace(path)
    return path


def orphaned_leases(label: str, root: Optional[Path] = None) -> Dict[Path, List[str]]:
    """Leases whose process is gone (or its pid reused): their envs are nobody's."""
    d = lease_dir(label, root)
    out: Dict[Path, List[str]] = {}
    if not d.is_dir():
        return out
    for path in d.glob("*.json"):
        pid_text, _, start_text = path.stem.partition("-")
        if not pid_text.isdigit():
            continue
        if str(_starttime(int(pid_text))) == start_text:
            continue  # still alive
        try:
            out[path] = list(json.loads(path.read_text()))
        except (OSError, ValueError):
            out[path] = []
    return out


POOL_LABEL = "drums.pool"  # on every slot a pool agent makes: "<pid>-<starttime>" of that agent


def process_key(pid: Optional[int] = None) -> str:
    """This process's (or `pid`'s) identity on this node: pid and start time, as leases use."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_starttime(pid)}"


def key_alive(key: str) -> bool:
    pid_text, _, start_text = key.partition("-")
    return pid_text.isdigit() and str(_starttime(int(pid_text))) == start_text


def held_env_ids(label: str, root: Optional[Path] = None) -> Set[str]:
    """Env ids that live pool processes hold on host `label` (their seats are Ray's own)."""
    d = lease_dir(label, root)
    held: Set[str] = set()
    if not d.is_dir():
        return held
    for path in d.glob("*.json"):
        pid_text, _, start_text = path.stem.partition("-")
        if not pid_text.isdigit() or str(_starttime(int(pid_text))) != start_text:
            continue  # a dead process's lease: the keeper's sweep destroys its envs
        try:
            held.update(str(i) for i in json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return held


def tombstone_dir(label: str, root: Optional[Path] = None) -> Path:
    return (root or pool_dir()) / f"{label}.tombstones"


def write_tombstone(label: str, env_id: str, root: Optional[Path] = None) -> Path:
    """A close that could not reach host `label`'s drumsd: the keeper destroys `env_id` as soon
    as the daemon answers again (a restarted daemon adopts its slots; this one must not live)."""
    d = tombstone_dir(label, root)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / env_id
    path.touch()
    return path


def tombstones(label: str, root: Optional[Path] = None) -> List[str]:
    d = tombstone_dir(label, root)
    return sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


def clear_tombstone(label: str, env_id: str, root: Optional[Path] = None) -> None:
    (tombstone_dir(label, root) / env_id).unlink(missing_ok=True)
