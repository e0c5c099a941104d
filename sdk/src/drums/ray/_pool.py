"""`drums.ray.connect()`: the pool client. Same surface as `drums.connect()`, over every drums
host in the Ray cluster; each env is an `EnvActor` on its host's node, holding one desktop
resource, placed on the host with the most free desktops (NodeAffinity, not Ray's packing)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import _exceptions as errors
from .. import models as m
from .._base import Forked
from .._exceptions import DrumsError, Overloaded
from .._observation import Observation
from ._actors import EnvActor, Keeper, Reply
from ._placement import DESKTOPS, HostSlot, choose_host, hosts_from_nodes


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
    """An env on some host of the pool: the methods of `drums.Env`, through its actor."""

    def __init__(self, pool: Pool, actor: Any, env_id: str, host: HostSlot) -> None:
        self.pool = pool
        self.actor = actor
        self.id = env_id
        self.host = host.label
        self.node_id = host.node_id

    def __repr__(self) -> str:
        return f"PoolEnv(id={self.id!r}, host={self.host!r})"

    def _get(self, ref: Any, timeout: Optional[float] = None) -> Any:
        try:
            reply: Reply = ray.get(ref, timeout=timeout or self.pool.call_timeout_s)
        except _RAY_GONE as exc:
            self.pool._mark_down(self.host)
            raise HostDown(
                f"host {self.host} (node {self.node_id[:12]}) is gone: {type(exc).__name__}",
                env_id=self.id,
                detail={"host": self.host},
            ) from None
        except ray.exceptions.GetTimeoutError:
            raise errors.Timeout(
                f"no answer from env actor on {self.host}", env_id=self.id
            ) from None
        if reply[0] == "err":
            if reply[1]["code"] == "host_down":
                self.pool._mark_down(self.host)
                reply[1]["detail"] = {**(reply[1]["detail"] or {}), "host": self.host}
            _raise(reply[1])
        return reply[1]

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._get(self.actor.call.remote(method, args, kwargs))

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

    def save(self, **kwargs: Any) -> m.Checkpoint:
        """A saved state, on this env's host: `pool.create(from_state=...)` is placed there."""
        state = self._call("save", **kwargs)
        self.pool._state_hosts[state.id] = self.host
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
    def fork(self, n: int, *, idle_timeout_s: Optional[float] = None) -> Iterator[Forked[Any]]:
        """N copies of this desktop as it is now, each its own actor on this env's node."""
        host = self.pool._host(self.host)
        if host is None or host.free < n:
            raise Overloaded(
                f"host {self.host} has {0 if host is None else host.free} desktops free, "
                f"a fork of {n} needs {n}",
                env_id=self.id,
                detail={"retry_after_s": self.pool.retry_after_s, "host": self.host},
            )
        made = self._get(self.actor.branch.remote(n, idle_timeout_s))
        children: List[PoolEnv] = []
        try:
            for env_id in made["children"]:
                actor = self.pool._actor(host)
                self.pool._get_placed(actor.adopt.remote(env_id), host, env_id)
                children.append(PoolEnv(self.pool, actor, env_id, host))
            self._get(self.actor.handed_over.remote())
            state = m.Checkpoint.model_construct(id=made["state"])
            yield Forked(children, state, made["elapsed_s"])
        finally:
            for child in children:
                child.close()

    def close(self) -> None:
        try:
            self._get(self.actor.close.remote())
        except HostDown:
            pass  # its desktops went with the host
        except errors.CleanupFailed:
            if self.host not in self.pool._down_now():
                raise
            # Its drumsd is down: the keeper destroys the env once the daemon is back.
        finally:
            ray.kill(self.actor)
            self.pool._envs.pop(self.id, None)

    def __enter__(self) -> PoolEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pool:
    """Every drums host of the Ray cluster as one client (`with drums.ray.connect() as pool:`)."""

    def __init__(
        self,
        *,
        queue_timeout_s: float = 0.0,
        retry_after_s: float = 5.0,
        call_timeout_s: float = 600.0,
        down_ttl_s: float = 30.0,
    ) -> None:
        if not ray.is_initialized():
            ray.init(address="auto", log_to_driver=False)
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self.call_timeout_s = call_timeout_s
        self.down_ttl_s = down_ttl_s
        self._envs: Dict[str, PoolEnv] = {}
        self._down: Dict[str, float] = {}
        self._pending: Dict[str, int] = {}
        self._state_hosts: Dict[str, str] = {}
        self._keepers: Dict[str, Any] = {}
        self._actor_cls: Any = ray.remote(EnvActor)
        self._keeper_cls: Any = ray.remote(Keeper)

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

    def _actor(self, host: HostSlot) -> Any:
        self._keeper(host)
        return self._actor_cls.options(
            num_cpus=0,
            resources={DESKTOPS: 1},
            max_restarts=0,
            scheduling_strategy=self._affinity(host),
        ).remote(host.label)

    def _get_placed(self, ref: Any, host: HostSlot, what: str) -> Dict[str, Any]:
        self._pending[host.node_id] = self._pending.get(host.node_id, 0) + 1
        try:
            reply: Reply = ray.get(ref, timeout=self.call_timeout_s)
        except _RAY_GONE as exc:
            self._mark_down(host.label)
            raise HostDown(
                f"host {host.label} is gone ({type(exc).__name__}) during {what}"
            ) from None
        finally:
            self._pending[host.node_id] -= 1
        if reply[0] == "err":
            if reply[1]["code"] == "host_down":
                self._mark_down(host.label)
            _raise(reply[1])
        return reply[1]

    # --- envs -------------------------------------------------------------------------------

    def _place(self, on: Optional[str]) -> HostSlot:
        deadline = time.monotonic() + self.queue_timeout_s
        while True:
            hosts = self.hosts()
            if on is not None:
                hosts = [h for h in hosts if h.label == on]
                if not hosts:
                    raise HostDown(f"host {on} (which holds the state) is not in the pool")
            host = choose_host(hosts, pending=self._pending, down=self._down_now())
            if host is not None:
                return host
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
            host = self._place(on)
            actor = self._actor(host)
            try:
                made = self._get_placed(actor.create.remote(args), host, "create")
            except HostDown:
                ray.kill(actor)
                tried.append(host.label)
                if on is not None or len(tried) >= 8:
                    raise
                continue
            except BaseException:
                ray.kill(actor)
                raise
            env = PoolEnv(self, actor, made["id"], host)
            self._envs[env.id] = env
            return env

    def list_envs(self) -> List[PoolEnv]:
        return list(self._envs.values())

    # --- hosts' daemons ---------------------------------------------------------------------

    def _each_host(self, method: str, *args: Any) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for host in self.hosts():
            actor = self._actor_cls.options(
                num_cpus=0, scheduling_strategy=self._affinity(host)
            ).remote(host.label)
            try:
                out[host.label] = self._get_placed(
                    actor.client_call.remote(method, args), host, method
                )
            except DrumsError as exc:
                out[host.label] = exc
            finally:
                ray.kill(actor)
        return out

    def health(self) -> Dict[str, Any]:
        """Each host's /v1/health (or the error that host answered)."""
        return self._each_host("health")

    def metrics(self) -> Dict[str, Any]:
        return self._each_host("metrics")

    def close(self) -> None:
        for env in list(self._envs.values()):
            env.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(**kwargs: Any) -> Pool:
    """The pool of every drums host in the Ray cluster this process is part of."""
    return Pool(**kwargs)
