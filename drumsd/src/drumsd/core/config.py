"""The drumsd configuration file: one pydantic model, the single source of every default.

Pure: parsing and validation only. Checking the token file's mode and creating directories are
OS effects and live in `drumsd.serve_checks`.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from drumsd.core import config_compat

PositiveSeconds = Annotated[float, Field(gt=0, le=30 * 86400)]
# A lease limit: null or 0 turns it off (0 is read as null).
LeaseSeconds = Annotated[float | None, Field(ge=0, le=30 * 86400)]
Port = Annotated[int, Field(ge=1, le=65535)]


class Block(BaseModel):
    """Every block rejects unknown keys so a typo is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class QuiesceConfig(Block):
    """When a process tree counts as quiescent (before a dump, or on request)."""

    window_s: float = Field(default=1.0, gt=0, le=60, description="no activity for this long")
    timeout_s: float = Field(default=30.0, gt=0, le=600, description="give up after this long")
    poll_ms: int = Field(default=50, ge=5, le=5000, description="sampling interval")
    events: bool = Field(
        default=True,
        description="kernel process events prove the window (a process that starts and ends "
        "between two samples counts); false: the samples alone",
    )
    max_attempts: int = Field(
        default=3, ge=1, le=20, description="capture tries (quiet window + dump) before 409"
    )


class AdmissionConfig(Block):
    """Refuse create, capture and fork (429 overloaded) before the host runs out."""

    enabled: bool = True
    min_available_pct: float = Field(default=8.0, ge=0, le=100)
    min_available_mib: int = Field(default=4096, ge=0)
    env_mib: int = Field(default=1024, ge=1, description="fallback cost of one new slot")
    capture_mib: int = Field(default=2048, ge=1, description="cost of one capture or prefork")
    capture_max_mib: int = Field(
        default=4096,
        ge=1,
        description="refuse a capture or prefork (409) when the slot's files hold more data "
        "than this (allocated size: a sparse file's holes are free)",
    )
    max_memory_psi_some_avg10: float = Field(default=10.0, ge=0, le=100)
    min_state_free_mib: int = Field(default=8192, ge=0)
    sample_interval_s: float = Field(default=1.0, gt=0, le=60)


class LeaseConfig(Block):
    """Idle timeouts and time-to-live of slots and saved states; null or 0 turns one off."""

    env_idle_timeout_s: LeaseSeconds = 1800.0
    env_ttl_s: LeaseSeconds = None
    state_idle_timeout_s: LeaseSeconds = 1800.0
    state_ttl_s: LeaseSeconds = None
    reap_interval_s: float = Field(default=15.0, gt=0, le=3600)

    @field_validator("env_idle_timeout_s", "env_ttl_s", "state_idle_timeout_s", "state_ttl_s")
    @classmethod
    def _zero_is_off(cls, value: float | None) -> float | None:
        return None if value == 0 else value


class RetentionConfig(Block):
    """What a destroyed slot leaves in `forgotten_dir`. Full archives (failures) are never
    pruned unless `full_max_gib` or `forgotten_max_gib` is set."""

    mode: Literal["failures_full", "keep_all"] = "failures_full"
    summary_max_gib: float = Field(default=2.0, gt=0)
    full_max_gib: float | None = Field(default=None, gt=0, description="null = no cap")
    forgotten_warn_gib: float = Field(default=8.0, gt=0)


class OsworldConfig(Block):
    """A pinned OSWorld checkout whose task files are served (its evaluation_examples/examples).

    With no network, `dir` names a copy; with neither a copy nor a fetched pin, the daemon runs
    without OSWorld's tasks and says so in /v1/health."""

    repository: str = Field(
        default="https://github.com/xlang-ai/OSWorld",
        description="OSWorld's git repository (https URL); its GitHub tarball is fetched by commit",
    )
    commit: str | None = Field(
        default=None, description="the pinned commit (40 hex digits); null = no pinned OSWorld"
    )
    sha256: str | None = Field(
        default=None, description="sha256 of that commit's tarball; a fetch that differs is refused"
    )
    dir: Path | None = Field(
        default=None, description="an OSWorld checkout to use as it is (offline host, Nix fetcher)"
    )
    cache_dir: Path = Field(
        default=Path("/var/cache/drums/osworld"),
        description="fetched checkouts, as <cache>/<sha256>/",
    )

    @field_validator("commit")
    @classmethod
    def _commit_hex(cls, value: str | None) -> str | None:
        if value is not None and not (len(value) == 40 and _is_hex(value)):
            raise ValueError("commit must be 40 hex digits (a full git commit id)")
        return value.lower() if value else value

    @field_validator("sha256")
    @classmethod
    def _sha_hex(cls, value: str | None) -> str | None:
        if value is not None and not (len(value) == 64 and _is_hex(value)):
            raise ValueError("sha256 must be 64 hex digits")
        return value.lower() if value else value

    @field_validator("repository")
    @classmethod
    def _https(cls, value: str) -> str:
        if not value.startswith("https://"):
            raise ValueError("repository must be an https:// URL")
        return value.rstrip("/").removesuffix(".git")

    @model_validator(mode="after")
    def _pin_whole(self) -> OsworldConfig:
        if (self.commit is None) != (self.sha256 is None):
            raise ValueError("osworld.commit and osworld.sha256 go together (a pin is both)")
        return self


def _is_hex(value: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in value)


class TasksConfig(Block):
    """Where tasks come from and where their setup steps and checkers run (never as root)."""

    dirs: list[Path] = Field(default_factory=list, description="OSWorld-format task directories")
    assets_dir: Path | None = Field(default=None, description="files upload_file may send")
    cache_dir: Path = Field(
        default=Path("/var/cache/drums/task-cache"),
        description="downloads, as <cache>/<task id>/<file name>",
    )
    verifier_dirs: list[Path] = Field(
        default_factory=list, description="root-owned dirs of installed drums_verifier modules"
    )
    checker_venv: Path | None = Field(
        default=None,
        description="a built checker venv (python -m drumsd.tasks); null = the current pins' one",
    )
    checker_uid: int = Field(default=65534, ge=1, description="unprivileged uid of checkers")
    checker_gid: int = Field(default=65534, ge=1)
    resident_checkers: bool = Field(
        default=True,
        description="fork checker calls from a worker that has imported the metrics; "
        "false = a fresh process per call",
    )
    checker_worker_max_rss_mib: int = Field(
        default=1024, ge=64, le=65536, description="a worker above this RSS is replaced"
    )
    checker_memory_mib: int = Field(
        default=1024,
        ge=64,
        le=65536,
        description="address space one checker call may add (RLIMIT_AS); admission reserves it "
        "for each running call",
    )
    checker_cpu_s: float = Field(
        default=60.0, gt=0, le=3600, description="CPU seconds of one checker call (RLIMIT_CPU)"
    )
    max_concurrent_checkers: int = Field(
        default=2, ge=1, le=256, description="checker calls running at once (others wait)"
    )
    exploits_report: Path | None = Field(
        default=None,
        description="the JSON of `drumsd audit exploits`: GET /v1/tasks carries each task's "
        "verdict, verify flags hackable_task",
    )
    refuse_hackable: bool = Field(
        default=True,
        description="refuse to load a task the exploits_report calls hackable (a 422 naming the "
        "strategy); false = load it, its rewards flagged hackable_task",
    )
    setup_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    eval_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    client_password: str = Field(default="password", description="{CLIENT_PASSWORD}")
    screen_width: int = Field(default=1920, ge=320, le=8192)
    screen_height: int = Field(default=1080, ge=200, le=8192)
    osworld: OsworldConfig = Field(default_factory=OsworldConfig)


class SparesConfig(Block):
    """Warm spares: restored ahead of time, parked frozen, claimed by create/reset/fork."""

    enabled: bool = True
    per_checkpoint: int = Field(default=2, ge=0, le=64)
    per_host: int = Field(default=16, ge=0, le=1024)
    max_age_s: float = Field(default=1800.0, gt=0)
    sizing_interval_s: float = Field(
        default=2.0, gt=0, le=600, description="how often pool targets follow the claim rate"
    )


class TaskCheckpointsConfig(Block):
    """Task checkpoints: a task's setup captured once, restored by its later creates and resets."""

    enabled: bool = Field(
        default=True, description="capture a task's first setup and restore it for later episodes"
    )
    max_mib: float | None = Field(
        default=4096.0, gt=0, description="state_dir MiB they may hold (LRU beyond; null = no cap)"
    )
    idle_timeout_s: LeaseSeconds = 3600.0
    ttl_s: LeaseSeconds = None
    spares: bool = Field(
        default=True, description="warm spares of a task checkpoint once a later episode uses it"
    )


class KsmConfig(Block):
    """Kernel same-page merging across slots (a cross-slot timing side channel: one tenant)."""

    enabled: bool = True
    pages_to_scan: int = Field(default=1000, ge=1, le=100_000)
    sleep_millisecs: int = Field(default=20, ge=1, le=10_000)
    boost_s: float = Field(
        default=20.0,
        ge=0,
        le=600,
        description="after a fork (and a spare refill) KSM scans at the boost rate for this "
        "long, so the new restores' unwritten pages merge within seconds instead of a quiet "
        "scan's minutes; 0 = never boost",
    )
    boost_pages_to_scan: int = Field(default=20_000, ge=1, le=1_000_000)
    boost_sleep_millisecs: int = Field(default=5, ge=1, le=10_000)


class LinuxConfig(Block):
    """The Linux runtime's own bounds: every step that can wedge (a broken image, a stuck kernel
    call) has a limit, and the slots share one CPU weight and one image tmpfs."""

    agent_ready_timeout_s: float = Field(
        default=20.0,
        gt=0,
        le=600,
        description="a restored or claimed desktop's agent answers within this, else the "
        "restore fails at once (not retried) and a claimed spare is disposed of",
    )
    restore_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="criu restore is killed past this (a broken image can make it spin forever)",
    )
    dump_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="criu dump is killed past this (or the capture's own deadline, if sooner)",
    )
    boot_timeout_s: float = Field(
        default=90.0,
        gt=0,
        le=3600,
        description="a cold boot (templates): its agent, then its ready file and app windows",
    )
    teardown_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="bound of every shielded teardown (kill, reap, cgroups, mounts); the thread "
        "finishes behind it. Below cleanup_timeout_s, so a wedged kill cannot hold a destroy",
    )
    group_cpu_shares: int = Field(
        default=16384,
        ge=2,
        le=262144,
        description="CPU weight of all slots together against the daemon's siblings (v1 "
        "shares; 1024 = one ordinary process): restores are bursts of short wakeups",
    )
    images_tmpfs_mib: int = Field(
        default=8192,
        ge=64,
        le=1_048_576,
        description="the tmpfs checkpoint images are copied into for restores (a restore from disk "
        "is 3x slower)",
    )
    screen_grab: Literal["damage", "full"] = Field(
        default="damage",
        description="damage = screenshots read the framebuffer in place, re-encode only the bands "
        "X DAMAGE says changed and answer an unchanged screen from cache; full = every screenshot "
        "is X GetImage of the whole screen and Pillow's encoder (for comparison)",
    )
    shm_holes: bool = Field(
        default=True,
        description="before a dump, the slot is frozen for a moment and the all-zero pages of its "
        "System V shared memory (Xvfb's framebuffer) are made holes, which CRIU does not write: "
        "the same content, 3.7 MiB less per dump of a base desktop (none on an office desktop "
        "with an app drawn over the whole screen); false = dumps write them (for comparison)",
    )
    track_writes: bool = Field(
        default=False,
        description="true = each restored tree (a spare too) is armed for write tracking (a "
        "userfaultfd write-protect the kernel resolves by itself) so a save stores only the "
        "pages written since the restore without CRIU reading the rest (office: a delta save "
        "1.10-1.52x a full one's time instead of 1.66-1.92x); it costs every restore (~24 ms "
        "of the daemon's CPU on office, ~40 ms on osworld, whose fork of 16 took 5.50 s "
        "instead of 5.00 s in the same run), so it is for save-heavy runs (tree search); needs "
        "drums' CRIU build (setup builds it)",
    )


class Config(Block):
    """The whole drumsd config file. Field order is the order `check-config` prints."""

    listen: str = Field(default="127.0.0.1:7070", description="host:port of the API")
    allow_remote: bool = Field(default=False, description="permit a non-loopback listen")
    token_file: Path = Field(description="bearer token, 32+ characters, mode 0600")
    profile: Literal["hardened", "trusted"] = Field(
        default="hardened", description="trusted = --trusted-unhardened: trusted code only"
    )
    state_dir: Path = Field(default=Path("/run/drums"), description="tmpfs for slots")
    journal_dir: Path = Field(default=Path("/var/lib/drums/journal"))
    lower: Path | None = Field(default=None, description="the default desktop image root")
    image_sha256: str | None = Field(default=None, description="expected hash of `lower`")
    images_dir: Path = Field(
        default=Path("/var/cache/drums/images"), description="built images, found by profile"
    )
    default_image: str = Field(default="base", description="profile used when none is named")
    criu: Path = Field(default=Path("/usr/local/sbin/criu"))
    vcpus: float = Field(default=1.0, gt=0, le=256)
    memory_mib: int = Field(default=2048, ge=128, le=1_048_576)
    swap_mib: int = Field(default=0, ge=0, le=1_048_576)
    pids_max: int = Field(default=1024, ge=16, le=1_000_000)
    group_memory_mib: int | None = Field(
        default=None,
        ge=0,
        description="memory limit of all slots together; null = what the slots use plus "
        "MemAvailable less admission's floor, refreshed every admission sample; a number caps "
        "that; 0 = none",
    )
    tmpfs_mib: int = Field(default=1024, ge=16, le=1_048_576, description="slot upper + /tmp")
    slot_range: tuple[int, int] = Field(
        default=(100, 2000), description="slot numbers N, lowest free first, kept across resets"
    )
    port_base: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="slot N's guest_port on the host at 127.0.0.1:port_base+N; null = none",
    )
    guest_port: int = Field(
        default=5000, ge=1, le=65535, description="the guest server port port_base forwards"
    )
    extra_ports: dict[Port, Port] = Field(
        default_factory=dict,
        description="more guest ports: guest port -> host base (slot N's at 127.0.0.1:base+N)",
    )
    max_concurrent_restores: int = Field(default=4, ge=1, le=256)
    natural_exits: list[str] = Field(
        default_factory=list, description="process names whose exit is expected"
    )
    alive_after_s: float = Field(default=5.0, ge=0, le=600)
    max_attempts: int = Field(default=3, ge=1, le=20)
    warm_upper: bool = Field(default=True, description="prepare the next upper layer ahead")
    async_kill: bool = Field(default=True, description="kill a reset's old tree in background")
    restore_cpu_boost: bool = Field(default=True, description="lift the cpu quota while restoring")
    netns_fast: bool = Field(
        default=False,
        description="restores make a fresh net namespace with lo up (CRIU's --empty-ns net and "
        "an action script) instead of CRIU restoring the dumped one with ip and iptables-restore",
    )
    restore_cpu_weight: int | None = Field(
        default=None,
        ge=2,
        le=262144,
        description="CPU weight (v1 shares; 1024 = a slot's own) of a restoring slot until its "
        "agent answers, against the other slots; null = the slot's own weight throughout",
    )
    daemon_cpu_weight: int | None = Field(
        default=None,
        ge=2,
        le=262144,
        description="CPU weight (v1 shares) of the daemon's own cgroup, set at start (v1: the "
        "daemon moves into a `daemon` leaf beside the slots' group); null = left as it is",
    )
    prefork_max_age_s: float = Field(default=120.0, gt=0)
    prefork_quiesce_window_s: float | None = Field(
        default=None,
        gt=0,
        le=600,
        description="a prefork (and a fork's own) waits for this long a window in which no "
        "process of the slot started, exited or sat in D or Z state (within quiesce.timeout_s, "
        "else 409 not_quiescent); null = no window, only up to 5 s for zombies and D state",
    )
    crash_watch: bool = Field(default=True, description="refuse to start without proc events")
    procview_dir: Path | None = Field(
        default=None,
        description="opt-in: LXCFS is mounted here (started if absent) and every slot sees its "
        "own memory limit, CPUs, CPU time, uptime and load in /proc/meminfo, cpuinfo, stat, "
        "uptime and loadavg (not sysinfo(2)); null = slots see the host's",
    )
    criu_log_level: int | None = Field(
        default=None,
        ge=0,
        le=4,
        description="CRIU's -v level (0 none .. 4 debug) of every dump and restore log; null = "
        "dumps at 4, restores at CRIU's own default (2), which keeps restores cheap",
    )
    host_usd_per_hour: float | None = Field(
        default=None, ge=0, description="null or 0: cost is not reported"
    )
    save_delta_depth: int = Field(
        default=8,
        ge=0,
        le=64,
        description="a saved state or task checkpoint stores only the pages and files that "
        "differ from the checkpoint its slot was restored from, up to this many such saves in "
        "a chain (the next is stored full); 0 = every save full",
    )
    quiesce: QuiesceConfig = Field(default_factory=QuiesceConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    lease: LeaseConfig = Field(default_factory=LeaseConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    forgotten_dir: Path = Field(default=Path("/var/lib/drums/forgotten"))
    forgotten_max_gib: float | None = Field(default=None, gt=0, description="null = no cap")
    state_min_free_mib: int = Field(default=1024, ge=0)
    state_warn_free_pct: float = Field(default=15.0, ge=0, le=100)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    spares: SparesConfig = Field(default_factory=SparesConfig)
    ksm: KsmConfig = Field(default_factory=KsmConfig)
    task_checkpoints: TaskCheckpointsConfig = Field(default_factory=TaskCheckpointsConfig)
    linux: LinuxConfig = Field(default_factory=LinuxConfig)
    drain_timeout_s: float = Field(default=10.0, gt=0, le=600)
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="a request body must arrive within this; slower ones get a 408",
    )
    gate_refresh_s: float = Field(
        default=3.0, gt=0, le=600, description="how often live slots' running gates are judged"
    )
    step_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="an action's deadline when it names none"
    )
    capture_timeout_s: float = Field(
        default=180.0,
        gt=0,
        le=3600,
        description="a capture's or prefork's deadline (quiet wait, dump, copy, hash): its slot "
        "is free again by then",
    )
    stuck_operation_s: float = Field(
        default=300.0,
        gt=0,
        description="/v1/health warns of an operation holding its slot longer (or past its own "
        "deadline)",
    )
    cleanup_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="wait this long for a slot's destroy"
    )
    journal_compact_mib: float = Field(
        default=64.0, gt=0, description="rewrite events.jsonl past this size"
    )
    service_backoff_s: float = Field(
        default=1.0, gt=0, le=600, description="first wait after a background service fails"
    )
    service_backoff_max_s: float = Field(default=30.0, gt=0, le=3600)
    runtime: Literal["linux", "memory"] = Field(
        default="linux",
        description="memory = an in-process fake of the desktops, for control-plane tests only",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("listen")
    @classmethod
    def _listen_is_host_port(cls, value: str) -> str:
        listen_host_port(value)
        return value

    @field_validator("image_sha256")
    @classmethod
    def _sha256_is_hex(cls, value: str | None) -> str | None:
        if value is not None and (
            len(value) != 64 or any(c not in "0123456789abcdef" for c in value)
        ):
            raise ValueError("must be 64 lowercase hex characters (a sha256)")
        return value

    @model_validator(mode="after")
    def _ports_fit(self) -> Config:
        lo, hi = self.slot_range
        if not 0 <= lo <= hi:
            raise ValueError(f"slot_range {[lo, hi]} must be [low, high] with 0 <= low <= high")
        bases = {f"extra_ports[{g}]": b for g, b in self.extra_ports.items()}
        if self.port_base is not None:
            bases = {"port_base": self.port_base, **bases}
        elif bases:
            raise ValueError("extra_ports needs port_base (forwarding is off without it)")
        if self.guest_port in self.extra_ports:
            raise ValueError(f"extra_ports repeats guest_port {self.guest_port}")
        spans = []
        for name, base in bases.items():
            if base + hi > 65535:
                raise ValueError(
                    f"{name} {base} + slot_range {[lo, hi]} gives host ports {base + lo}-"
                    f"{base + hi}, outside 1-65535; lower it or narrow slot_range"
                )
            spans.append((base + lo, base + hi, name))
        spans.sort()
        for (a_lo, a_hi, a), (b_lo, b_hi, b) in itertools.pairwise(spans):
            if b_lo <= a_hi:
                raise ValueError(
                    f"host ports of {a} ({a_lo}-{a_hi}) and {b} ({b_lo}-{b_hi}) overlap; space "
                    "the bases at least the width of slot_range apart"
                )
        return self

    @model_validator(mode="after")
    def _remote_needs_consent(self) -> Config:
        host, _ = listen_host_port(self.listen)
        if not is_loopback(host) and not self.allow_remote:
            raise ValueError(
                f"listen {self.listen!r} is not loopback: set allow_remote: true to serve "
                "other hosts (and put TLS in front)"
            )
        return self


def listen_host_port(listen: str) -> tuple[str, int]:
    """Split `host:port` (IPv6 as `[::1]:7070`); ValueError says what is wrong."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{listen!r} must be host:port, e.g. 127.0.0.1:7070")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port {port_text!r} in {listen!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} in {listen!r} is out of range 0-65535")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ConfigError(Exception):
    """Every problem in a config file, each naming its key."""

    def __init__(self, path: str, problems: list[str]) -> None:
        super().__init__(f"{path}: " + "; ".join(problems))
        self.path = path
        self.problems = problems


def config_from_text(text: str, source: str = "<config>") -> Config:
    """Parse JSON text into a Config, or raise ConfigError listing every problem."""
    return config_with_notices(json_object(text, source), source)[0]


def json_object(text: str, source: str = "<config>") -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            source, [f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"]
        ) from None


def config_from_dict(raw: Any, source: str = "<config>") -> Config:
    return config_with_notices(raw, source)[0]


def config_with_notices(raw: Any, source: str = "<config>") -> tuple[Config, list[str]]:
    """The Config and the notices of documented keys read under their names here
    (core/config_compat.py); ConfigError lists every problem of the file at once."""
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the top level must be a JSON object"])
    read = config_compat.translate(raw)
    try:
        config = Config.model_validate(read.raw)
    except ValidationError as exc:
        raise ConfigError(
            source, [*read.problems, *(describe_error(err) for err in exc.errors())]
        ) from None
    if read.problems:
        raise ConfigError(source, read.problems)
    return config, read.notices


def describe_error(err: Any) -> str:
    key = ".".join(str(part) for part in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"{key}: unknown key (check the spelling; see `drumsd check-config --defaults`)"
    if err["type"] == "missing":
        return f"{key}: required, and missing"
    message = err["msg"].removeprefix("Value error, ")
    return f"{key}: {message}"


def effective_config_json(config: Config) -> str:
    return json.dumps(config.model_dump(mode="json"), indent=2)


def defaults_json() -> str:
    """Every default, for docs and the Nix module's drift check."""
    example = Config.model_validate({"token_file": "/etc/drums/token"})
    data = example.model_dump(mode="json")
    data.pop("token_file")
    return json.dumps(data, indent=2)
