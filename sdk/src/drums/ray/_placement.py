"""Where the next env goes: pure choices over what each drums host has free.

Ray packs actors onto the first node that fits; a pool of desktops wants the opposite (spread by
FREE capacity, so no host's CPUs saturate while another idles), so the pool picks the node itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Dict, List, Optional, Sequence, Set, Tuple

DESKTOPS = "drums_desktops"  # custom resource: envs this node's drumsd admits
HOST = "drums_host"  # custom resource: 1 on every node that runs a drumsd
LABEL = "drums-host"  # node label naming the host


@dataclass(frozen=True)
class HostSlot:
    """One drums host as Ray sees it right now."""

    node_id: str
    label: str
    total: int
    free: int


def hosts_from_nodes(
    nodes: Sequence[Dict[str, object]], available: Dict[str, Dict[str, float]]
) -> List[HostSlot]:
    """Alive nodes advertising drums desktops, from `ray.nodes()` and per-node availability."""
    out = []
    for node in nodes:
        resources = node.get("Resources") or {}
        if not node.get("Alive") or not isinstance(resources, dict):
            continue
        total = int(resources.get(DESKTOPS, 0))
        if total <= 0:
            continue
        node_id = str(node["NodeID"])
        labels = node.get("Labels") or {}
        label = str(labels.get(LABEL) if isinstance(labels, dict) else "") or node_id[:12]
        free = int(available.get(node_id, {}).get(DESKTOPS, 0))
        out.append(HostSlot(node_id, label, total, free))
    return sorted(out, key=lambda h: h.label)


def choose_host(
    hosts: Sequence[HostSlot],
    *,
    pending: Optional[Dict[str, int]] = None,
    down: Sequence[str] = (),
    need: int = 1,
) -> Optional[HostSlot]:
    """The host with the most free desktops after this client's in-flight placements, skipping
    hosts known down; None when none has `need` free. Ties go to the lowest label."""
    pending = pending or {}
    best: Optional[HostSlot] = None
    best_free = need - 1
    for host in hosts:
        if host.label in down:
            continue
        free = host.free - pending.get(host.node_id, 0)
        if free > best_free:
            best, best_free = host, free
    return best


def ghost_changes(
    live: Set[str],
    held: Set[str],
    seen_before: Set[str],
    ghosts: Set[str],
    known: AbstractSet[str] = frozenset(),
) -> Tuple[Set[str], Set[str]]:
    """Which of a host's slots need a ghost seat (a `drums_desktops` held for a desktop no pool
    env holds: made by the gateway, another client, or a dead driver not yet swept), as
    (add, remove). A slot counts once it was outside every lease on two sweeps in a row, so
    a pool env between its create and its lease write is not counted twice; `known` slots (the
    gateway's own creates) count at once."""
    foreign = live - held
    wanted = (foreign & seen_before) | (foreign & known)
    return wanted - ghosts, ghosts - foreign
