"""`drums.ray.connect()`: the pool client. Same surface as `drums.connect()`, over every drums
host in the Ray cluster. Each env lives in this process's `HostAgent` on its host's node (one
warm actor per node, reused) and holds one `drums_desktops` through a placement group pinned to
that node, so every client's placement sees it; hosts are chosen by most free desktops.

An env whose host is this process's own node is called directly (this process's client of
that node's loopback drumsd, the agent still owning the env): a step then costs what it costs
through the plain SDK. Envs on other nodes are called through their agent (one Ray call)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import ray
from ray.util.placement_group import (
    NODE_ID_LABEL_KEY,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import _exceptions as errors
from .. import models as m
from .._base import Forked
from .._client import Client, Env
from .._exceptions import DrumsError, Overloaded
from .._observation import Observation
from ._actors import HostAgent, Keeper, Reply, connect_host, error_fields
from ._placement import DESKTOPS, HostSlot, choose_host, hosts_from_nodes

SEAT_WAIT_S = 5.0  # how long Ray may take to place a desktop it showed as free
log = logging.getLogger("drums.ray")


class HostDown(DrumsError):
    """The env's host (its node or its drumsd) is gone: the episode has no reward. Never a
    zero: train without it and create a new env (the pool places it on another host)."""

    default_code = "host_down"


_RAY_GONE = (
    ray.exceptions.RayActorError,
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.ObjectLostError,
)


def _raise(fields: Dict[str, Any]) -> None:
    cls = HostDown if fields["type"] == "HostDown" else getattr(errors, fields["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, DrumsError)):
        cls = DrumsError
    raise cls(
        fields["message"],
        code=fields["code"],
        env_id=fields["env_id"],
        status=fields["status"],
        detail=fields["detail"],
    )


class PoolEnv:
    """An env on some host of the pool: the methods of `drums.Env`, through its host's agent."""

    def __init__(
        self,
        pool: Pool,
        agent: Any,
        env_id: str,
        host: HostSlot,
        seat: Any,
        direct: Optional[Env] = None,
    ) -> None:
        self.pool = pool
        self.agent = agent
        self.id = env_id
        self.host = host.label
        self.node_id = host.node_id
        self.seat = seat  # the placement group holding this env's drums_desktops
        # This process's own handle (not owning: the agent owns the env) when the host's drumsd
        # is on this process's node: calls then skip Ray. None: every call goes to the agent.
        self.direct = direct
        self.closed = False

    def __repr__(self) -> str:
        return f"PoolEnv(id={self.id!r}, host={self.host!r})"

    def _get(self, ref: Any) -> Any:
        return self.pool._get(ref, self.host, self.node_id, env_id=self.id)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.direct is not None:
            try:
                return getattr(self.direct, method)(*args, **kwargs)
            except DrumsError as exc:  # the same errors as through the agent (host_down ...)
                self.pool._failed(error_fields(exc), self.host)
        return self._get(self.agent.call.remote(self.id, method, args, kwargs))

    def refresh(self) -> m.Slot:
        return self._call("refresh")

    def wait_valid(self, timeout: float = 60.0) -> m.GateReport:
        return self._call("wait_valid", timeout=timeout)

    def gates(self) -> m.GateReport:
        return self._call("gates")

    def observe(self) -> Observation:
        return self._call("observe")

    def step(self, action: Any, *, screenshot: bool = False) -> m.StepResult:
        return self._call("step", action, screenshot=screenshot)

    def reset(self) -> m.Slot:
        return self._call("reset")

    def load_task(self, task: Any) -> m.TaskInfo:
        return self._call("load_task", task)

    def save(self, *, keep: bool = True, **kwargs: Any) -> m.Checkpoint:
        """A saved state, on this env's host: `pool.create(from_state=...)` is placed there.
        It lives as long as its lease, as `Env.save()`'s does; keep=False ties it to this pool
        instead: deleted when the pool closes."""
        state = self._call("save", keep=True, **kwargs)
        self.pool._state_hosts[state.id] = self.host
        if not keep:
            self.pool._owned_states[state.id] = self.host
        return state

    def verify(self, **kwargs: Any) -> m.VerifyResult:
        return self._call("verify", **kwargs)

    def metrics(self) -> m.SlotMetrics:
        return self._call("metrics")

    def quarantine(self, reason: str) -> m.Slot:
        return self._call("quarantine", reason)

    def release(self) -> m.Slot:
        return self._call("release")

    @contextmanager
    def fork(
        self,
        n: int,
        *,
        keep_state: bool = False,
        idle_timeout_s: Optional[float] = None,
        ttl_s: Optional[float] = None,
    ) -> Iterator[Forked[Any]]:
        """N copies of this desktop as it is now, on this env's host (held by the same agent),
        each holding one drums_desktops there."""
        host = self.pool._host(self.host)
        with self.pool._placing:
            seats = [] if host is None else self.pool._reserve(host, n)
        if host is None or seats is None:
            raise Overloaded(
                f"host {self.host} has {0 if host is None else host.free} desktops free, "
                f"a fork of {n} needs {n}",
                env_id=self.id,
                detail={"retry_after_s": self.pool.retry_after_s, "host": self.host},
            )
        children: List[PoolEnv] = []
        made: Dict[str, Any] = {}
        try:
            made = self._get(self.agent.fork.remote(self.id, n, idle_timeout_s, ttl_s))
            for env_id, slot, seat in zip(made["children"], made["slots"], seats):
                direct = self.pool._direct(host, slot) if self.direct is not None else None
                children.append(PoolEnv(self.pool, self.agent, env_id, host, seat, direct))
            seats = seats[len(children) :]
            yield Forked(children, made["state"], made["elapsed_s"])
        finally:
            for child in children:
                child.close()
            for seat in seats:
                remove_placement_group(seat)
            if made and not (keep_state or made["kept_before"]):
                self._get(self.agent.delete_state.remote(made["state"].id))

    def close(self) -> None:
        """Destroy the env and give its desktop back (idempotent)."""
        if self.closed:
            return
        try:
            self._get(self.agent.close.remote(self.id))
        except HostDown:
            pass  # its desktops went with the host
        except errors.CleanupFailed:
            if self.host not in self.pool._down_now():
                raise
            # Its drumsd is down: the keeper destroys the env once the daemon is back.
        finally:
            self.closed = True
            remove_placement_group(self.seat)
            self.pool._envs.pop(self.id, None)

    def __enter__(self) -> PoolEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# One agent per (Ray job, node) in this process, shared by every Pool the process opens: a
# create reuses a warm actor instead of starting a Ray worker.
_AGENTS: Dict[Tuple[str, str], Any] = {}
_AGENTS_LOCK = threading.Lock()
# This process's own client of each host on its node, by label (None: that host's drumsd is not
# reachable from this process, e.g. its token file is not readable here; its agent is used).
_LOCAL: Dict[str, Optional[Client]] = {}


def _local_client(label: str) -> Optional[Client]:
    try:
        return connect_host(label)
    except (LookupError, OSError, DrumsError) as exc:
        log.info("host %s: calls go through its agent (no local client: %s)", label, exc)
        return None


class Pool:
    """Every drums host of the Ray cluster as one client (`with drums.ray.connect() as pool:`)."""

    def __init__(
        self,
        *,
        queue_timeout_s: float = 0.0,
        retry_after_s: float = 5.0,
        call_timeout_s: float = 600.0,
        down_ttl_s: float = 30.0,
        warm: bool = True,
        local_calls: bool = True,
    ) -> None:
        if not ray.is_initialized():
            ray.init(address="auto", log_to_driver=False)
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self.call_timeout_s = call_timeout_s
        self.down_ttl_s = down_ttl_s
        self.local_calls = local_calls
        self._node_id = ray.get_runtime_context().get_node_id()
        self._envs: Dict[str, PoolEnv] = {}
        self._down: Dict[str, float] = {}
        self._state_hosts: Dict[str, str] = {}
        self._owned_states: Dict[str, str] = {}
        self._keepers: Dict[str, Any] = {}
        self._placing = threading.Lock()
        self._agent_cls: Any = ray.remote(HostAgent)
        self._keeper_cls: Any = ray.remote(Keeper)
        if warm:
            # Every host's agent started now, in parallel, and waited for: a Ray worker takes
            # seconds to start, and the first create would otherwise pay it (5-9 s measured).
            agents = [self._agent(host) for host in self.hosts()]
            try:
                ray.get([agent.ready.remote() for agent in agents], timeout=120)
            except (ray.exceptions.GetTimeoutError, *_RAY_GONE) as exc:
                log.warning("pool: not every host's agent started (%s); creates will wait", exc)

    # --- hosts ------------------------------------------------------------------------------

    def hosts(self) -> List[HostSlot]:
        from ray._private import state

        return hosts_from_nodes(ray.nodes(), state.available_resources_per_node())

    def _host(self, label: str) -> Optional[HostSlot]:
        return next((h for h in self.hosts() if h.label == label), None)

    def _mark_down(self, label: str) -> None:
        self._down[label] = time.monotonic() + self.down_ttl_s

    def _down_now(self) -> List[str]:
        now = time.monotonic()
        return [label for label, until in self._down.items() if until > now]

    def _affinity(self, host: HostSlot) -> NodeAffinitySchedulingStrategy:
        return NodeAffinitySchedulingStrategy(node_id=host.node_id, soft=False)

    def _keeper(self, host: HostSlot) -> Any:
        if host.label not in self._keepers:
            self._keepers[host.label] = self._keeper_cls.options(
                name=f"drums-keeper:{host.label}",
                namespace="drums",
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=32,  # the gateway forwards many requests at once
                scheduling_strategy=self._affinity(host),
            ).remote(host.label)
        return self._keepers[host.label]

    def _agent(self, host: HostSlot) -> Any:
        """This process's agent on `host`'s node, made once and reused by every env there."""
        self._keeper(host)
        key = (ray.get_runtime_context().get_job_id(), host.node_id)
        with _AGENTS_LOCK:
            agent = _AGENTS.get(key)
            if agent is None:
                agent = _AGENTS[key] = self._agent_cls.options(
                    num_cpus=0,
                    max_restarts=0,
                    max_concurrency=64,  # many envs' calls at once, each a blocking HTTP call
                    scheduling_strategy=self._affinity(host),
                ).remote(host.label)
        return agent

    def _direct(self, host: HostSlot, slot: m.Slot) -> Optional[Env]:
        """A handle on `slot` through this process's client of `host`, if `host` is this
        process's node (and `local_calls`); None otherwise."""
        if not self.local_calls or host.node_id != self._node_id:
            return None
        with _AGENTS_LOCK:
            if host.label not in _LOCAL:
                _LOCAL[host.label] = _local_client(host.label)
            client = _LOCAL[host.label]
        return None if client is None else Env(client, slot, owned=False)

    def _forget_agent(self, node_id: str) -> None:
        with _AGENTS_LOCK:
            for key in [k for k in _AGENTS if k[1] == node_id]:
                del _AGENTS[key]

    def _reserve(self, host: HostSlot, n: int) -> Optional[List[Any]]:
        """`n` drums_desktops on `host`, one placement group each (no process: a GCS record
        that every pool client's placement sees), or None if Ray cannot place them now."""
        seats = [
            placement_group(
                [{DESKTOPS: 1}],
                strategy="STRICT_PACK",
                bundle_label_selector=[{NODE_ID_LABEL_KEY: host.node_id}],
            )
            for _ in range(n)
        ]
        if all(seat.wait(SEAT_WAIT_S) for seat in seats):
            return seats
        for seat in seats:
            remove_placement_group(seat)
        return None

    def _get(
        self, ref: Any, label: str, node_id: str, *, env_id: Optional[str] = None, what: str = ""
    ) -> Any:
        try:
            reply: Reply = ray.get(ref, timeout=self.call_timeout_s)
        except _RAY_GONE as exc:
            self._mark_down(label)
            self._forget_agent(node_id)
            raise HostDown(
                f"host {label} (node {node_id[:12]}) is gone: {type(exc).__name__}"
                + (f" during {what}" if what else ""),
                env_id=env_id,
                detail={"host": label},
            ) from None
        except ray.exceptions.GetTimeoutError:
            raise errors.Timeout(f"no answer from the agent on {label}", env_id=env_id) from None
        if reply[0] == "err":
            self._failed(reply[1], label)
        return reply[1]

    def _failed(self, fields: Dict[str, Any], label: str) -> None:
        """Raise the error a host's call answered (a host_down marks the host down)."""
        if fields["code"] == "host_down":
            self._mark_down(label)
            fields["detail"] = {**(fields["detail"] or {}), "host": label}
        _raise(fields)

    # --- envs -------------------------------------------------------------------------------

    def _place(self, on: Optional[str]) -> Tuple[HostSlot, Any]:
        """A host (the freest, or `on`) and one desktop reserved on it; Overloaded after
        `queue_timeout_s` when none has one free."""
        deadline = time.monotonic() + self.queue_timeout_s
        while True:
            # One placement at a time in this process: Ray's free counts include a seat once it
            # is placed (milliseconds), so threads choosing at once would all pick the same host.
            with self._placing:
                hosts = self.hosts()
                if on is not None:
                    hosts = [h for h in hosts if h.label == on]
                    if not hosts:
                        raise HostDown(f"host {on} (which holds the state) is not in the pool")
                host = choose_host(hosts, down=self._down_now())
                seats = None if host is None else self._reserve(host, 1)
            if host is not None and seats is not None:
                return host, seats[0]
            if time.monotonic() >= deadline:
                raise Overloaded(
                    f"every drums host is full ({len(hosts)} hosts, "
                    f"{sum(h.total for h in hosts)} desktops); retry in {self.retry_after_s:.0f}s",
                    status=429,
                    detail={
                        "retry_after_s": self.retry_after_s,
                        "hosts": {h.label: h.free for h in hosts},
                        "queued_s": self.queue_timeout_s,
                    },
                )
            time.sleep(0.1)

    def create(
        self,
        task: Optional[Any] = None,
        *,
        image: Optional[str] = None,
        from_state: Optional[Any] = None,
        **kwargs: Any,
    ) -> PoolEnv:
        """A new env on the host with the most free desktops (a saved state's own host when
        `from_state` is given). A host found down is skipped and the next one tried."""
        state_id = None if from_state is None else getattr(from_state, "id", from_state)
        on = None if state_id is None else self._state_hosts.get(state_id)
        args = {"task": task, "image": image, "from_state": state_id, **kwargs}
        tried: List[str] = []
        while True:
            host, seat = self._place(on)
            agent = self._agent(host)
            try:
                made = self._get(agent.create.remote(args), host.label, host.node_id, what="create")
            except HostDown:
                remove_placement_group(seat)
                tried.append(host.label)
                if on is not None or len(tried) >= 8:
                    raise
                continue
            except BaseException:
                remove_placement_group(seat)
                raise
            env = PoolEnv(self, agent, made["id"], host, seat, self._direct(host, made["slot"]))
            self._envs[env.id] = env
            return env

    def list_envs(self) -> List[PoolEnv]:
        return list(self._envs.values())

    # --- hosts' daemons ---------------------------------------------------------------------

    def _each_host(self, method: str, *args: Any) -> Dict[str, Any]:
        hosts = self.hosts()
        refs = {h.label: (h, self._agent(h).client_call.remote(method, args)) for h in hosts}
        out: Dict[str, Any] = {}
        for label, (host, ref) in refs.items():
            try:
                out[label] = self._get(ref, label, host.node_id, what=method)
            except DrumsError as exc:
                out[label] = exc
        return out

    def health(self) -> Dict[str, Any]:
        """Each host's /v1/health (or the error that host answered)."""
        return self._each_host("health")

    def metrics(self) -> Dict[str, Any]:
        return self._each_host("metrics")

    def delete_state(self, state: Any) -> None:
        state_id = getattr(state, "id", state)
        label = self._state_hosts.get(state_id)
        host = None if label is None else self._host(label)
        if label is None or host is None:
            raise HostDown(f"the host of state {state_id} is not in the pool ({label})")
        self._get(self._agent(host).delete_state.remote(state_id), label, host.node_id)
        self._owned_states.pop(state_id, None)

    def close(self) -> None:
        """Destroy this pool's envs and the states it saved without keep (its agents stay warm
        for the next pool of this process; they die with it)."""
        for env in list(self._envs.values()):
            env.close()
        for state_id in list(self._owned_states):
            try:
                self.delete_state(state_id)
            except HostDown:
                self._owned_states.pop(state_id, None)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(**kwargs: Any) -> Pool:
    """The pool of every drums host in the Ray cluster this process is part of."""
    return Pool(**kwargs)
