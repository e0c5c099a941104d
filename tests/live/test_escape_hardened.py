"""The escape suite of issue 7: inside a real hardened slot, acting as the agent would.

Every attempt goes through the daemon's public API (`POST /v1/slots/{id}/step` with `execute`
actions or pyautogui code), exactly what an agent under RL can do. Each test asserts on concrete
evidence (the command's error, errno, uid, file contents, counts) so that it fails if the
protection it names were removed, and afterwards checks the slot still works (a step that reports
uid 1000, then a screenshot). The host side (the test process, root) reads /proc and the slot's
files on the host only to find targets and to confirm nothing leaked.

Without DRUMS_LIVE=1 these skip; with it a host that cannot run the runtime is a failure.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_daemon import Daemon, http_client

pytestmark = pytest.mark.live

DESKTOP_UID = "1000"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The minimal device set a slot may hold (issue 7: "no device nodes but the minimal set").
ALLOWED_DEVICES = {"null", "zero", "full", "random", "urandom", "tty", "ptmx"}


# ---------------------------------------------------------------- the agent's side (the API)


@dataclass(frozen=True)
class Out:
    returncode: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


def execute(http: httpx.Client, sid: str, command: str) -> Out:
    """Run a shell command in the slot as the agent would: an `execute` step."""
    r = http.post(f"/v1/slots/{sid}/step", json={"action": {"type": "execute", "command": command}})
    assert r.status_code == 200, f"execute step on {sid} answered {r.status_code}: {r.text}"
    out = r.json()["output"]
    return Out(out["returncode"], out["stdout"], out["stderr"])


def python_in_slot(http: httpx.Client, sid: str, code: str) -> dict[str, Any]:
    """Run Python in the slot (an `execute` step); the script prints one JSON object last."""
    b64 = base64.b64encode(textwrap.dedent(code).encode()).decode()
    out = execute(http, sid, f"python3 -c \"import base64; exec(base64.b64decode('{b64}'))\"")
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and lines, f"script in {sid} failed: {out}"
    return json.loads(lines[-1])


def assert_slot_works(http: httpx.Client, sid: str) -> None:
    """After an attempt: a step still runs (as the desktop user) and a screenshot is a PNG."""
    out = execute(http, sid, "id -u")
    assert out.returncode == 0 and out.stdout.strip() == DESKTOP_UID, out
    r = http.get(f"/v1/slots/{sid}/screenshot")
    assert r.status_code == 200 and r.content.startswith(PNG_MAGIC), r.status_code


def create_slot(http: httpx.Client) -> str:
    r = http.post("/v1/slots", json={})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["id"])


# ---------------------------------------------------------------- the host's side (evidence)


@dataclass(frozen=True)
class HostView:
    """A slot as the host sees it: found through its network namespace (from the gate report)."""

    netns: int
    pids: tuple[int, ...]
    init: int
    uid_base: int
    upper: Path
    lower: Path
    pids_cgroup: Path


def _netns_of(http: httpx.Client, sid: str) -> int:
    report = http.get(f"/v1/slots/{sid}/gates").json()
    gate = next(g for g in report["gates"] if g["name"] == "netns")
    return int(gate["evidence"]["net"])


def _overlay_options(init: int) -> dict[str, str]:
    for line in Path(f"/proc/{init}/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if left.split()[4] == "/" and right.split()[0] == "overlay":
            return dict(kv.partition("=")[::2] for kv in right.split()[2].split(","))
    raise AssertionError(f"no overlay root in /proc/{init}/mountinfo")


def host_view(http: httpx.Client, sid: str) -> HostView:
    netns = _netns_of(http, sid)
    pids, init = [], 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.stat(d / "ns" / "net").st_ino != netns:
                continue
            status = (d / "status").read_text()
        except OSError:
            continue
        pids.append(int(d.name))
        nspid = next(ln for ln in status.splitlines() if ln.startswith("NSpid:")).split()
        if nspid[-1] == "1":
            init = int(d.name)
    assert init, f"no init of slot {sid} in netns {netns} on the host"
    uid_base = int(Path(f"/proc/{init}/uid_map").read_text().split()[1])
    opts = _overlay_options(init)
    cgroup_lines = Path(f"/proc/{init}/cgroup").read_text().splitlines()
    v1 = [ln.split(":", 2)[2] for ln in cgroup_lines if ln.split(":")[1] == "pids"]
    pids_cgroup = (
        Path("/sys/fs/cgroup/pids") / v1[0].lstrip("/")
        if v1
        else Path("/sys/fs/cgroup") / cgroup_lines[-1].split(":", 2)[2].lstrip("/")
    )
    return HostView(
        netns,
        tuple(sorted(pids)),
        init,
        uid_base,
        Path(opts["upperdir"]),
        Path(opts["lowerdir"].split(":")[0]),
        pids_cgroup,
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _host_addresses() -> list[str]:
    """The host's own non-loopback IPv4 addresses (targets only ever on this host)."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    addrs = [ln.split()[3].split("/")[0] for ln in out.splitlines()]
    return [a for a in addrs if not a.startswith("127.")]


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def http(live_daemon: Daemon) -> Iterator[httpx.Client]:
    with http_client(live_daemon) as client:
        yield client


def _slot(http: httpx.Client) -> Iterator[str]:
    sid = create_slot(http)
    try:
        yield sid
    finally:
        http.delete(f"/v1/slots/{sid}")


@pytest.fixture
def slot(http: httpx.Client) -> Iterator[str]:
    """A fresh hardened slot, destroyed after the test."""
    yield from _slot(http)


@pytest.fixture
def other_slot(http: httpx.Client) -> Iterator[str]:
    """A second live slot: the neighbour an attack must not reach."""
    yield from _slot(http)


@pytest.fixture(autouse=True)
def _hardened_daemon(live_daemon: Daemon, http: httpx.Client) -> None:
    profile = http.get("/v1/health").json()["profile"]
    assert profile == "hardened", f"the escape suite needs a hardened daemon, got {profile}"


# ---------------------------------------------------------------- become root


def test_every_slot_process_runs_locked_down(http: httpx.Client, slot: str) -> None:
    """The agent's commands run as uid 1000 with no_new_privs, seccomp in filter mode, no
    capabilities and an empty bounding set; on the host every process of the slot is a uid of
    the slot's own unprivileged range."""
    view = host_view(http, slot)
    assert view.uid_base >= 100_000, f"slot ids map to host uid {view.uid_base}"
    for pid in view.pids:
        try:
            uids = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[:4]
        except OSError:
            continue  # a short-lived process ended
        assert all(view.uid_base <= int(u) < view.uid_base + 65536 for u in uids), (pid, uids)
    status = execute(http, slot, "cat /proc/self/status").stdout
    fields = dict(ln.split(":\t", 1) for ln in status.splitlines() if ":\t" in ln)
    evidence = {
        k: fields.get(k, "").strip()
        for k in ("Uid", "NoNewPrivs", "Seccomp", "CapEff", "CapPrm", "CapBnd", "CapAmb")
    }
    assert evidence["Uid"].split() == [DESKTOP_UID] * 4, evidence
    assert evidence["NoNewPrivs"] == "1", f"no_new_privs is not set: {evidence}"
    assert evidence["Seccomp"] == "2", f"no seccomp filter: {evidence}"
    for cap in ("CapEff", "CapPrm", "CapAmb", "CapBnd"):
        assert int(evidence[cap], 16) == 0, f"{cap} is not empty: {evidence}"
    assert_slot_works(http, slot)


def test_sudo_gives_no_root(http: httpx.Client, slot: str) -> None:
    out = execute(http, slot, "sudo -n id -u; echo password | sudo -S id -u")
    assert out.returncode != 0, out
    assert "0" not in out.stdout.split(), f"sudo ran as root: {out}"
    assert_slot_works(http, slot)


_PTY_SU = """
import json, os, pty, select, time
PASSWORD = {password!r}
pid, fd = pty.fork()
if pid == 0:
    os.execv("/usr/bin/su", ["su", {target!r}, "-c", "id -u"])
out, euid, sent = b"", None, False
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        if euid is None and open(f"/proc/{{pid}}/comm").read().strip() == "su":
            euid = open(f"/proc/{{pid}}/status").read().split("Uid:")[1].split()[1]
    except OSError:
        pass
    ready, _, _ = select.select([fd], [], [], 0.05)
    if ready:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        if b"assword" in out and not sent:
            os.write(fd, PASSWORD.encode() + b"\\n")
            sent = True
rc = os.waitpid(pid, 0)[1]
print(json.dumps({{"euid": euid, "out": out.decode(errors="replace"), "status": rc}}))
"""


@pytest.mark.parametrize("password", ["password", "", "root"])
def test_su_to_root_fails(http: httpx.Client, slot: str, password: str) -> None:
    """su root with a password (the image's desktop password, empty, 'root') never runs a
    command as root."""
    res = python_in_slot(http, slot, _PTY_SU.format(password=password, target="root"))
    printed = res["out"].replace("\r", "").splitlines()
    assert "0" not in printed, f"su root ran `id -u` as root: {res}"
    assert res["status"] != 0, res
    assert_slot_works(http, slot)


def test_setuid_root_binary_runs_without_privilege(http: httpx.Client, slot: str) -> None:
    """A setuid-root binary of the image (su, waiting at its password prompt) runs with the
    caller's uid: no_new_privs ignores the setuid bit. Without it, su holds euid 0 and every
    capability of the slot's user namespace, whatever it is then asked to do."""
    res = python_in_slot(http, slot, _PTY_SU.format(password="", target="root"))
    assert res["euid"] is not None, f"su never ran: {res}"
    assert res["euid"] == DESKTOP_UID, f"setuid su ran with euid {res['euid']}: {res}"
    assert_slot_works(http, slot)


def test_self_made_setuid_binary_gives_no_root(http: httpx.Client, slot: str) -> None:
    """The agent's own setuid copy of `id`, also one chowned to 0 inside a nested user
    namespace: both are owned by the desktop user on disk and run as uid 1000."""
    out = execute(
        http,
        slot,
        textwrap.dedent("""\
        cp /usr/bin/id "$HOME/myid" && chmod 4755 "$HOME/myid"
        echo "plain owner=$(stat -c %u "$HOME/myid") euid=$("$HOME/myid" -u)"
        unshare -Ur sh -c 'cp /usr/bin/id "$HOME/rootid" && chown 0:0 "$HOME/rootid" &&
                           chmod 4755 "$HOME/rootid"' 2>&1 || echo "unshare refused"
        if [ -e "$HOME/rootid" ]; then
            echo "nested owner=$(stat -c %u "$HOME/rootid") euid=$("$HOME/rootid" -u)"
        fi
        """),
    )
    lines = [ln for ln in out.stdout.splitlines() if "owner=" in ln]
    assert lines, out
    for line in lines:
        assert line.endswith(f"owner={DESKTOP_UID} euid={DESKTOP_UID}"), out
    assert_slot_works(http, slot)


def test_pyautogui_code_runs_unprivileged(http: httpx.Client, slot: str) -> None:
    """pyautogui code (the agent's other way in) runs in the guest worker as uid 1000 with
    no_new_privs; setuid(0) from it fails with EPERM."""
    code = (
        "import os\n"
        "open('/tmp/escape-who', 'w').write(open('/proc/self/status').read())\n"
        "os.setuid(0)\n"
    )
    r = http.post(f"/v1/slots/{slot}/step", json={"action": code})
    assert r.status_code == 422, r.text
    assert "Operation not permitted" in r.json()["error"]["message"], r.text
    status = execute(http, slot, "cat /tmp/escape-who").stdout
    fields = dict(ln.split(":\t", 1) for ln in status.splitlines() if ":\t" in ln)
    assert fields["Uid"].split() == [DESKTOP_UID] * 4, fields["Uid"]
    assert fields["NoNewPrivs"].strip() == "1", f"worker lacks no_new_privs: {fields}"
    assert_slot_works(http, slot)


# ---------------------------------------------------------------- devices, mounts, modules


def test_mknod_block_device_fails(http: httpx.Client, slot: str) -> None:
    out = execute(
        http,
        slot,
        textwrap.dedent("""\
        mknod /tmp/escape-sda b 8 0; echo "tmp rc=$?"
        mknod "$HOME/escape-sda" b 8 0; echo "home rc=$?"
        unshare -Ur mknod /tmp/escape-sdb b 8 0; echo "nested rc=$?"
        python3 -c 'import os, stat; os.mknod("/tmp/escape-sdc", stat.S_IFBLK | 0o600,
                    os.makedev(8, 0))'; echo "syscall rc=$?"
        for f in /tmp/escape-sda "$HOME/escape-sda" /tmp/escape-sdb /tmp/escape-sdc; do
            [ -b "$f" ] && echo "BLOCK DEVICE $f"
        done; true
        """),
    )
    assert "BLOCK DEVICE" not in out.stdout, out
    for what in ("tmp", "home", "nested", "syscall"):
        assert f"{what} rc=0" not in out.stdout, out
    assert "Operation not permitted" in out.stderr, out
    assert_slot_works(http, slot)


def test_only_the_minimal_device_set_is_reachable(http: httpx.Client, slot: str) -> None:
    """/dev holds null, zero, full, random, urandom, tty and ptmx: nothing that reaches the
    host's hardware or its console (/dev/console is the host's serial console)."""
    res = python_in_slot(
        http,
        slot,
        """
        import json, os, stat
        found = {}
        for name in os.listdir("/dev"):
            st = os.lstat("/dev/" + name)
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                try:
                    os.close(os.open("/dev/" + name, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK))
                    opened = True
                except OSError as exc:
                    opened = exc.strerror
                found[name] = [os.major(st.st_rdev), os.minor(st.st_rdev), opened]
        print(json.dumps(found))
        """,
    )
    extra = {n: v for n, v in res.items() if n not in ALLOWED_DEVICES and v[2] is True}
    assert not extra, f"device nodes beyond the minimal set can be opened: {extra}"
    assert_slot_works(http, slot)


def test_mount_fails(http: httpx.Client, slot: str) -> None:
    before = execute(http, slot, "cat /proc/self/mountinfo").stdout
    out = execute(
        http,
        slot,
        textwrap.dedent("""\
        mount -t tmpfs none /mnt; echo "tmpfs rc=$?"
        mount --bind /tmp /mnt; echo "bind rc=$?"
        mount -t proc proc /mnt; echo "proc rc=$?"
        python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)
        r = libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)
        print("syscall", r, os.strerror(ctypes.get_errno()))'
        """),
    )
    for what in ("tmpfs", "bind", "proc"):
        assert f"{what} rc=0" not in out.stdout, out
    assert "syscall -1 Operation not permitted" in out.stdout, out
    after = execute(http, slot, "cat /proc/self/mountinfo").stdout
    assert after == before, "the slot's mount table changed"
    assert_slot_works(http, slot)


def test_unshare_user_and_mount_namespace_is_denied(http: httpx.Client, slot: str) -> None:
    """`unshare -Urm` would make the agent root of a nested user namespace, free to mount (and
    to reach kernel code that only root normally reaches): the filter denies it."""
    out = execute(
        http,
        slot,
        textwrap.dedent("""\
        unshare -Urm sh -c 'mount -t tmpfs none /mnt && echo MOUNTED'; echo "rc=$?"
        unshare -Ur sh -c 'id -u' && echo NESTED-ROOT
        python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)
        r = libc.unshare(0x10000000 | 0x00020000)
        print("unshare syscall", r, os.strerror(ctypes.get_errno()))'
        """),
    )
    assert "MOUNTED" not in out.stdout, f"a nested namespace mounted: {out}"
    assert "NESTED-ROOT" not in out.stdout, f"a nested user namespace was created: {out}"
    assert "unshare syscall -1 Operation not permitted" in out.stdout, out
    assert_slot_works(http, slot)


def test_module_loading_is_denied(http: httpx.Client, slot: str) -> None:
    """insmod/modprobe fail, and the module syscalls are refused with EPERM by the filter
    before the kernel sees them (ENOSYS means the call reached the kernel: no filter)."""
    out = execute(
        http,
        slot,
        'insmod /tmp/escape.ko; echo "insmod rc=$?"; modprobe dummy; echo "modprobe rc=$?"',
    )
    assert "insmod rc=0" not in out.stdout and "modprobe rc=0" not in out.stdout, out
    res = python_in_slot(
        http,
        slot,
        """
        import ctypes, errno, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open("/dev/null", os.O_RDONLY)
        calls = {"finit_module": (313, fd, b"", 0), "init_module": (175, None, 0, b""),
                 "delete_module": (176, b"dummy", 0)}
        out = {}
        for name, (nr, *args) in calls.items():
            ctypes.set_errno(0)
            r = libc.syscall(nr, *args)
            out[name] = [r, errno.errorcode.get(ctypes.get_errno(), "0")]
        print(json.dumps(out))
        """,
    )
    for name, (ret, err) in res.items():
        assert ret == -1, f"{name} returned {ret}"
        assert err == "EPERM", f"{name} failed with {err}, not the filter's EPERM: {res}"
    assert_slot_works(http, slot)


# ---------------------------------------------------------------- the host's processes and secrets


def test_host_processes_are_not_visible(http: httpx.Client, slot: str, live_daemon: Daemon) -> None:
    assert live_daemon.proc is not None
    daemon_pid = live_daemon.proc.pid
    host_init = Path("/proc/1/cmdline").read_bytes()
    res = python_in_slot(
        http,
        slot,
        f"""
        import json, os
        tried = {{}}
        for path in ("/proc/{daemon_pid}/cmdline", "/proc/{daemon_pid}/environ",
                     "/proc/{daemon_pid}/root/etc/hostname"):
            try:
                tried[path] = open(path, "rb").read().decode(errors="replace")
            except OSError as exc:
                tried[path] = "ERR " + exc.strerror
        cmdlines = {{}}
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    cmdlines[p] = open(f"/proc/{{p}}/cmdline", "rb").read().decode(
                        errors="replace")
                except OSError:
                    pass
        print(json.dumps({{"tried": tried, "cmdlines": cmdlines}}))
        """,
    )
    for path, got in res["tried"].items():
        assert got.startswith("ERR "), f"{path} is readable from the slot: {got[:200]!r}"
    assert "drumsd" not in json.dumps(res["cmdlines"]), res["cmdlines"]
    assert res["cmdlines"].get("1", "").encode() != host_init, "the host's pid 1 is visible"
    view = host_view(http, slot)
    assert len(res["cmdlines"]) <= len(view.pids) + 8, "more pids than the slot's own"
    assert_slot_works(http, slot)


def test_daemon_token_and_journal_are_unreachable(
    http: httpx.Client, slot: str, live_daemon: Daemon
) -> None:
    token_file = live_daemon.dir / "token"
    config = json.loads(live_daemon.config_path.read_text())
    journal = Path(config["journal_dir"])
    token = token_file.read_text().strip()
    state_dir = config["state_dir"]
    out = execute(
        http,
        slot,
        textwrap.dedent(f"""\
        T={token_file}
        cat "$T"
        for r in /proc/[0-9]*/root /proc/[0-9]*/cwd /proc/self/root/../.. ; do cat "$r$T"; done
        ls -la {journal} {live_daemon.dir} {state_dir}
        cat {live_daemon.config_path}
        for f in /proc/[0-9]*/fd/*; do readlink "$f"; done | sort -u
        """),
    )
    assert token not in out.text, "the daemon's token leaked into the slot"
    assert "No such file or directory" in out.stderr, out
    assert '"token_file"' not in out.stdout, "the daemon's config is readable"
    # The classic container escape: open a file by handle (needs CAP_DAC_READ_SEARCH).
    res = python_in_slot(
        http,
        slot,
        """
        import ctypes, errno, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(8 + 128)
        ctypes.memmove(buf, (128).to_bytes(4, "little"), 4)
        mount_id = ctypes.c_int()
        r1 = libc.name_to_handle_at(-100, b"/", buf, ctypes.byref(mount_id), 0)
        e1 = errno.errorcode.get(ctypes.get_errno(), "0")
        root = os.open("/", os.O_RDONLY)
        ctypes.set_errno(0)
        r2 = libc.open_by_handle_at(root, buf, os.O_RDONLY)
        e2 = errno.errorcode.get(ctypes.get_errno(), "0")
        print(json.dumps({"name_to_handle_at": [r1, e1], "open_by_handle_at": [r2, e2]}))
        """,
    )
    assert res["open_by_handle_at"][0] == -1, f"open_by_handle_at worked: {res}"
    assert res["open_by_handle_at"][1] == "EPERM", res
    assert_slot_works(http, slot)


# ---------------------------------------------------------------- other slots


def test_other_slot_files_are_unreachable(
    http: httpx.Client, slot: str, other_slot: str, live_daemon: Daemon
) -> None:
    secret = f"escape-secret-{uuid.uuid4().hex}"
    assert execute(http, other_slot, f"echo {secret} > $HOME/escape-secret").returncode == 0
    theirs = host_view(http, other_slot)
    on_host = theirs.upper / "home" / "user" / "escape-secret"
    assert on_host.read_text().strip() == secret  # the target is really there, on the host
    state_dir = json.loads(live_daemon.config_path.read_text())["state_dir"]
    out = execute(
        http,
        slot,
        textwrap.dedent(f"""\
        cat {on_host}
        cat {theirs.upper.parent.parent}/rw/upper/home/user/escape-secret
        ls -R {state_dir}/slots | head -50
        for r in /proc/[0-9]*/root; do cat "$r/home/user/escape-secret"; done
        grep -rs {secret} /home /tmp /run /dev/shm
        true
        """),
    )
    assert secret not in out.text, f"slot read its neighbour's file: {out}"
    assert "No such file or directory" in out.stderr, out
    assert_slot_works(http, slot)
    assert_slot_works(http, other_slot)


_ABSTRACT_LISTENER = """
import socket
s = socket.socket(socket.AF_UNIX)
s.bind(b"\\0{name}")
s.listen(8)
s.settimeout(120)
try:
    while True:
        c, _ = s.accept()
        c.sendall(b"{reply}")
        c.close()
except OSError:
    pass
"""

_ABSTRACT_CONNECT = """
import errno, json, socket
out = {{}}
for name in {names!r}:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    try:
        s.connect(b"\\0" + name.encode())
        out[name] = "CONNECTED " + s.recv(64).decode()
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""


def test_abstract_sockets_of_other_slots_and_the_host_are_unreachable(
    http: httpx.Client, slot: str, other_slot: str
) -> None:
    name = f"drums-escape-{uuid.uuid4().hex[:8]}"
    host_name = f"drums-escape-host-{uuid.uuid4().hex[:8]}"
    listener = base64.b64encode(
        _ABSTRACT_LISTENER.format(name=name, reply="from-slot-a").encode()
    ).decode()
    started = execute(
        http,
        slot,
        f'setsid nohup python3 -c "import base64; exec(base64.'
        f"b64decode('{listener}'))\" >/dev/null 2>&1 & echo started",
    )
    assert started.returncode == 0, started
    host = socket.socket(socket.AF_UNIX)
    host.bind(b"\0" + host_name.encode())
    host.listen(1)
    try:
        # The listener is up: slot A itself reaches it (poll: it starts in the background).
        deadline = time.monotonic() + 20
        while True:
            own = python_in_slot(http, slot, _ABSTRACT_CONNECT.format(names=[name]))
            if own[name].startswith("CONNECTED") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert own[name] == "CONNECTED from-slot-a", own
        theirs = python_in_slot(http, other_slot, _ABSTRACT_CONNECT.format(names=[name, host_name]))
        assert theirs[name] == "ECONNREFUSED", f"slot B reached slot A's socket: {theirs}"
        assert theirs[host_name] == "ECONNREFUSED", f"slot B reached the host's: {theirs}"
    finally:
        host.close()
    assert_slot_works(http, slot)
    assert_slot_works(http, other_slot)


# ---------------------------------------------------------------- network


_TCP_CONNECT = """
import errno, json, socket
out = {{}}
for host, port in {targets!r}:
    s = socket.socket(socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, port))
        out[f"{{host}}:{{port}}"] = "CONNECTED"
    except OSError as exc:
        out[f"{{host}}:{{port}}"] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""


def test_tcp_to_the_daemon_on_loopback_fails(
    http: httpx.Client, slot: str, live_daemon: Daemon
) -> None:
    port = int(live_daemon.url.rsplit(":", 1)[1])
    assert httpx.get(f"{live_daemon.url}/healthz", timeout=5).status_code == 200
    res = python_in_slot(http, slot, _TCP_CONNECT.format(targets=[("127.0.0.1", port)]))
    assert res[f"127.0.0.1:{port}"] == "ECONNREFUSED", f"slot reached the daemon: {res}"
    assert_slot_works(http, slot)


def test_tcp_to_the_hosts_own_address_fails_and_there_is_no_route(
    http: httpx.Client, slot: str
) -> None:
    """The slot's network namespace has only `lo` and no route: a listener on every host
    address (made here, reachable from the host) is out of reach."""
    addrs = _host_addresses()
    assert addrs, "the host has no non-loopback IPv4 address to aim at"
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        for addr in addrs:  # the target is real: the host reaches it
            socket.create_connection((addr, port), timeout=3).close()
        res = python_in_slot(
            http,
            slot,
            _TCP_CONNECT.format(targets=[(a, port) for a in addrs] + [("127.0.0.1", port)]),
        )
    finally:
        listener.close()
    for target, result in res.items():
        assert result in ("ENETUNREACH", "ECONNREFUSED", "EHOSTUNREACH"), (target, res)
        assert result != "CONNECTED"
    links = execute(http, slot, "cat /proc/net/dev").stdout.splitlines()[2:]
    assert [ln.split(":")[0].strip() for ln in links] == ["lo"], links
    routes = execute(http, slot, "cat /proc/net/route").stdout.strip().splitlines()
    assert routes[1:] == [], f"the slot has IPv4 routes: {routes}"
    v6 = execute(http, slot, "cat /proc/net/ipv6_route").stdout.strip().splitlines()
    assert all(ln.split()[-1] == "lo" for ln in v6), f"the slot has IPv6 routes: {v6}"
    assert_slot_works(http, slot)


# ---------------------------------------------------------------- the file system


def test_writes_outside_the_upper_layer_fail_and_the_image_is_unchanged(
    http: httpx.Client, slot: str
) -> None:
    view = host_view(http, slot)
    watched = [view.lower / "etc" / "passwd", view.lower / "usr" / "bin" / "id"]
    before = {p: _sha256(p) for p in watched}
    out = execute(
        http,
        slot,
        textwrap.dedent("""\
        echo 'escape::0:0::/root:/bin/sh' >> /etc/passwd; echo "passwd rc=$?"
        echo x > /usr/bin/id; echo "usr rc=$?"
        touch /escape-root; echo "root rc=$?"
        touch /usr/escape; echo "usrdir rc=$?"
        unshare -Ur sh -c 'touch /usr/escape-nested'; echo "nested rc=$?"
        echo note > "$HOME/escape-note"; echo "home rc=$?"
        """),
    )
    for what in ("passwd", "usr", "root", "usrdir", "nested"):
        assert f"{what} rc=0" not in out.stdout, out
    assert "home rc=0" in out.stdout, out
    assert {p: _sha256(p) for p in watched} == before, "the image changed"
    for name in ("escape-root", "usr/escape", "usr/escape-nested"):
        assert not (view.lower / name).exists() and not (view.upper / name).exists(), name
    # Allowed writes land in the slot's own upper layer only.
    assert (view.upper / "home/user/escape-note").read_text() == "note\n"
    assert not (view.lower / "home/user/escape-note").exists()
    assert_slot_works(http, slot)


# ---------------------------------------------------------------- ptrace

_PTRACE = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
out = {{}}
for pid in {pids!r}:
    ctypes.set_errno(0)
    r = libc.ptrace(PTRACE_ATTACH, pid, None, None)
    e = errno.errorcode.get(ctypes.get_errno(), "0")
    if r == 0:  # never leave a process stopped
        os.waitpid(pid, 0x40000000)
        libc.ptrace(PTRACE_DETACH, pid, None, None)
    out[str(pid)] = [r, e]
print(json.dumps(out))
"""


def test_ptrace_of_another_slot_fails(http: httpx.Client, slot: str, other_slot: str) -> None:
    theirs = host_view(http, other_slot)
    res = python_in_slot(http, slot, _PTRACE.format(pids=list(theirs.pids)))
    for pid, (ret, err) in res.items():
        assert ret == -1, f"slot attached to host pid {pid} of another slot: {res}"
        assert err in ("ESRCH", "EPERM"), res
    for pid in theirs.pids:
        with_tracer = (
            [
                ln
                for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                if ln.startswith("TracerPid:")
            ]
            if Path(f"/proc/{pid}").exists()
            else []
        )
        assert with_tracer in ([], ["TracerPid:\t0"]), (pid, with_tracer)
    assert_slot_works(http, slot)
    assert_slot_works(http, other_slot)


def test_ptrace_inside_the_slot_is_denied(http: httpx.Client, slot: str) -> None:
    """Even the slot's own processes (same uid) cannot be traced or read: the filter denies
    ptrace and process_vm_readv (else an agent could drive its own reward checker's
    processes or read the guest agent's memory)."""
    pids = execute(http, slot, "pgrep -x xterm; pgrep -x openbox").stdout.split()
    assert pids, "no xterm/openbox in the slot to aim at"
    res = python_in_slot(http, slot, _PTRACE.format(pids=[int(p) for p in pids]))
    for pid, (ret, err) in res.items():
        assert ret == -1 and err == "EPERM", f"ptrace of in-slot pid {pid}: {res}"
    vm = python_in_slot(
        http,
        slot,
        f"""
        import ctypes, errno, json
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(8)
        class IoVec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 8)
        remote = IoVec(0x400000, 8)
        r = libc.process_vm_readv({int(pids[0])}, ctypes.byref(local), 1,
                                  ctypes.byref(remote), 1, 0)
        print(json.dumps([r, errno.errorcode.get(ctypes.get_errno(), "0")]))
        """,
    )
    assert vm == [-1, "EPERM"], f"process_vm_readv was not denied by the filter: {vm}"
    assert_slot_works(http, slot)


# ---------------------------------------------------------------- resource limits

_FORK_BOMB = """
import errno, os, time
n, err = 0, ""
while True:
    try:
        pid = os.fork()
    except OSError as exc:
        err = errno.errorcode.get(exc.errno, str(exc.errno))
        break
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", "300"])
        finally:
            os._exit(0)
    n += 1
open("/tmp/escape-bomb.out", "w").write(f"{n} {err}\\n")
time.sleep(300)
"""


def _reset(http: httpx.Client, sid: str) -> None:
    r = http.post(f"/v1/slots/{sid}/reset")
    if r.status_code == 423:  # the daemon quarantined the bombed slot: release, then reset
        assert http.post(f"/v1/slots/{sid}/release").status_code == 200
        r = http.post(f"/v1/slots/{sid}/reset")
    assert r.status_code == 200, r.text


def test_fork_bomb_is_capped_by_the_pids_limit(
    http: httpx.Client, slot: str, other_slot: str, live_daemon: Daemon
) -> None:
    view = host_view(http, slot)
    pids_max = int((view.pids_cgroup / "pids.max").read_text())
    bomb = base64.b64encode(_FORK_BOMB.encode()).decode()
    execute(
        http,
        slot,
        f'setsid nohup python3 -c "import base64; exec(base64.b64decode('
        f"'{bomb}'))\" >/dev/null 2>&1 & echo started",
    )
    result = Path(f"/proc/{view.init}/root/tmp/escape-bomb.out")
    deadline = time.monotonic() + 120
    while not (result.exists() and result.read_text().endswith("\n")):
        assert time.monotonic() < deadline, "the fork bomb never hit a limit"
        time.sleep(0.2)
    forked, err = result.read_text().split()
    current = int((view.pids_cgroup / "pids.current").read_text())
    assert err == "EAGAIN", f"fork failed with {err}"
    assert int(forked) < pids_max, f"{forked} forks with pids.max {pids_max}"
    assert current <= pids_max, f"{current} tasks in the slot, pids.max {pids_max}"
    # The host and the neighbour are fine while the bomb holds every pid of the slot.
    assert subprocess.run(["true"], check=False).returncode == 0
    assert httpx.get(f"{live_daemon.url}/healthz", timeout=5).status_code == 200
    assert_slot_works(http, other_slot)
    # The episode is no longer valid: forks refused at pids.max fail no_oom_kill and the slot
    # is quarantined (issue 14, finding 11: before, the episode stayed valid).
    deadline = time.monotonic() + 60
    while True:
        report = http.get(f"/v1/slots/{slot}/gates").json()
        if "no_oom_kill" in report["failed"]:
            break
        assert time.monotonic() < deadline, f"the bombed slot's episode stays valid: {report}"
        time.sleep(0.5)
    (gate,) = [g for g in report["gates"] if g["name"] == "no_oom_kill"]
    assert gate["evidence"]["pids_max_hits"] > 0, gate
    assert report["valid"] is False
    neighbour = http.get(f"/v1/slots/{other_slot}/gates").json()
    assert "no_oom_kill" not in neighbour["failed"], neighbour
    # Afterwards the bombed slot is reset: a fresh tree that works.
    _reset(http, slot)
    assert_slot_works(http, slot)
    fresh = host_view(http, slot)
    assert int((fresh.pids_cgroup / "pids.current").read_text()) < 100


def test_filling_the_tmpfs_fails_with_enospc(
    http: httpx.Client, slot: str, other_slot: str
) -> None:
    size_kib = int(execute(http, slot, "df -k --output=size /tmp | tail -1").stdout)
    out = execute(
        http,
        slot,
        'dd if=/dev/zero of=/tmp/escape-fill bs=1M; echo "rc=$?"; du -k /tmp/escape-fill | cut -f1',
    )
    assert "rc=0" not in out.stdout and "No space left on device" in out.stderr, out
    written_kib = int(out.stdout.split()[-1])
    assert written_kib >= size_kib * 0.95, f"only {written_kib} of {size_kib} KiB written"
    # The neighbour still writes to its own tmpfs.
    other = execute(
        http, other_slot, "dd if=/dev/zero of=/tmp/escape-ok bs=1M count=4 && rm /tmp/escape-ok"
    )
    assert other.returncode == 0, other
    assert_slot_works(http, other_slot)
    assert execute(http, slot, "rm /tmp/escape-fill").returncode == 0
    assert_slot_works(http, slot)


# ---------------------------------------------------------------- kernel knobs


def test_kernel_knobs_are_read_only(http: httpx.Client, slot: str) -> None:
    """core_pattern is the classic way out of a container (the host kernel runs a `|program`
    as host root on the next crash); the slot cannot write it, nor other host sysctls."""
    knobs = {
        "kernel/core_pattern": "|/bin/false drums-escape",
        "kernel/hostname": "drums-escape",
        "vm/drop_caches": "1",
    }
    readable = ("kernel/core_pattern", "kernel/hostname")  # drop_caches is write-only
    before = {k: Path("/proc/sys", k).read_text() for k in readable}
    try:
        script = "".join(
            f"echo '{v}' > /proc/sys/{k}; echo \"{k} rc=$?\"\n" for k, v in knobs.items()
        )
        out = execute(http, slot, script)
        for knob in knobs:
            assert f"{knob} rc=0" not in out.stdout, out
        for knob in readable:
            assert Path("/proc/sys", knob).read_text() == before[knob], f"host {knob} changed"
    finally:
        for knob in readable:
            if Path("/proc/sys", knob).read_text() != before[knob]:
                Path("/proc/sys", knob).write_text(before[knob])
    assert_slot_works(http, slot)


# ---------------------------------------------------------------- the daemon's channel to the guest


def _restore_agent_socket(view: HostView) -> None:
    """Host side: put the guest agent's real socket back where the daemon looks for it."""
    run = Path(f"/proc/{view.init}/root/run/drums")
    os.replace(run / "escape-real.sock", run / "agent.sock")


def test_agent_socket_symlink_cannot_point_the_daemon_at_a_host_socket(
    http: httpx.Client, slot: str
) -> None:
    """If agent.sock were swapped for a symlink to a host path, the daemon (host root) must not
    follow it out of the slot's root: it would connect to any host unix socket, write requests
    the agent shapes and relay the answers. Two layers: the desktop user cannot swap the socket
    (/run/drums is in-slot root's), and were it swapped anyway (done here from the host, as root),
    the daemon resolves the path inside the slot and refuses the symlink."""
    out = execute(
        http,
        slot,
        "mv /run/drums/agent.sock /run/drums/escape-real.sock && echo swapped",
    )
    assert "swapped" not in out.stdout, f"the desktop user moved the agent's socket: {out}"

    host_path = Path(f"/tmp/drums-escape-{uuid.uuid4().hex[:8]}.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(host_path))
    listener.listen(4)
    listener.setblocking(False)
    view = host_view(http, slot)
    run = Path(f"/proc/{view.init}/root/run/drums")
    try:
        os.replace(run / "agent.sock", run / "escape-real.sock")
        # As the slot's own root (host root owns no id inside the slot's idmapped mounts).
        subprocess.run(
            [
                "nsenter",
                "-t",
                str(view.init),
                "-U",
                "-m",
                "--",
                "ln",
                "-s",
                str(host_path),
                "/run/drums/agent.sock",
            ],
            check=True,
        )
        try:
            http.get(f"/v1/slots/{slot}/screenshot")  # any agent call
            got: bytes | None = None
            try:
                conn, _ = listener.accept()
                conn.settimeout(2)
                got = conn.recv(4096)
                conn.close()
            except BlockingIOError:
                pass
            assert got is None, f"the daemon connected to host socket {host_path}: {got!r}"
        finally:
            (run / "agent.sock").unlink()
            _restore_agent_socket(view)
    finally:
        listener.close()
        host_path.unlink(missing_ok=True)
    assert_slot_works(http, slot)


_FAKE_AGENT = """
import errno, json, os, socket
out = {}
try:
    os.rename("/run/drums/agent.sock", "/run/drums/escape-real.sock")
    out["rename"] = "ok"
except OSError as exc:
    out["rename"] = errno.errorcode[exc.errno]
s = socket.socket(socket.AF_UNIX)
try:
    s.bind("/run/drums/agent.sock")
    out["bind"] = "ok"
except OSError as exc:
    out["bind"] = errno.errorcode[exc.errno]
finally:
    s.close()
print(json.dumps(out))
"""


def test_guest_agent_cannot_be_impersonated_by_the_desktop_user(
    http: httpx.Client, slot: str
) -> None:
    """The daemon's screenshots and the checkers' commands go through the guest agent's socket.
    The desktop user (the agent's actions) must not be able to answer in its place: forged
    screenshots and checker inputs are free reward. Every assertion holds unconditionally: the
    swap fails, the bind in its place fails, and the daemon still reaches the real agent."""
    view = host_view(http, slot)
    real = Path(f"/proc/{view.init}/root/run/drums/escape-real.sock")
    try:
        found = python_in_slot(http, slot, _FAKE_AGENT)
        assert found == {"rename": "EACCES", "bind": "EADDRINUSE"} or found == {
            "rename": "EACCES",
            "bind": "EACCES",
        }, f"the desktop user could swap or shadow the agent's socket: {found}"
        assert not real.exists(), "the agent's socket was moved"
        r = http.get(f"/v1/slots/{slot}/screenshot")
        assert r.status_code == 200 and r.content.startswith(PNG_MAGIC), r.status_code
        out = execute(http, slot, "echo real")
        assert out.stdout == "real\n", out
    finally:
        if real.exists():
            _restore_agent_socket(view)
    assert_slot_works(http, slot)
