"""`drums pool join`: make this drums host a Ray node advertising what its drumsd admits.

    drums pool join --address HEAD:6379 [--drumsd-url URL] [--token-file PATH]
                    [--node-label NAME] [--desktops N] [--block]

It asks the local drumsd for its health (admission: memory available and what one slot costs),
registers the daemon's URL and token file for the pool's actors on this node, and runs
`ray start` with `drums_host: 1`, `drums_desktops: N` and the label `drums-host=NAME`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

from .._client import Client
from .._exceptions import DrumsError
from ._actors import host_down_body
from ._placement import DESKTOPS, HOST, LABEL
from ._registry import HostEntry, write_host

SLOT_MIB_FALLBACK = 1024.0  # admission's env_mib default, when no slot has been measured yet


def desktops_admitted(
    mem_available_mib: Optional[float], slot_cost_mib: Optional[float], reserve_mib: float
) -> int:
    """How many more envs admission would let in: what stays above its floor, per slot."""
    if mem_available_mib is None:
        return 0
    cost = slot_cost_mib or SLOT_MIB_FALLBACK
    return max(0, math.floor((mem_available_mib - reserve_mib) / cost))


def ray_start_argv(
    address: str, label: str, desktops: int, block: bool, extra: Sequence[str] = ()
) -> List[str]:
    resources = json.dumps({HOST: 1, DESKTOPS: desktops})
    argv = [
        "ray",
        "start",
        f"--address={address}",
        f"--resources={resources}",
        f"--labels={LABEL}={label}",
    ]
    if block:
        argv.append("--block")
    return [*argv, *extra]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="drums", description="drums pool tools")
    sub = parser.add_subparsers(dest="group", required=True)
    pool = sub.add_parser("pool", help="drums on Ray").add_subparsers(dest="cmd", required=True)
    join = pool.add_parser("join", help="join this drums host to a Ray cluster")
    join.add_argument("--address", required=True, help="the Ray head, HEAD:PORT")
    join.add_argument("--drumsd-url", default=os.environ.get("DRUMS_URL", "http://127.0.0.1:7070"))
    join.add_argument(
        "--token-file", default=os.environ.get("DRUMS_TOKEN_FILE", "/etc/drums/token")
    )
    join.add_argument("--node-label", default=socket.gethostname())
    join.add_argument("--desktops", type=int, help="advertise N desktops (default: admission's)")
    join.add_argument(
        "--reserve-mib", type=float, default=4096.0, help="admission's min_available_mib"
    )
    join.add_argument("--block", action="store_true", help="stay in the foreground (services)")
    join.add_argument("--dry-run", action="store_true", help="print the ray start command")
    serve = pool.add_parser("serve", help="the gateway: drumsd's HTTP API over the whole pool")
    serve.add_argument("--address", default="auto", help="the Ray cluster to join as a driver")
    serve.add_argument("--listen", default="127.0.0.1:7080")
    serve.add_argument("--token-file", required=True, help="the gateway's own token, mode 0600")
    serve.add_argument(
        "--session-ttl-s",
        type=float,
        default=10.0,
        help="destroy the envs of a client session not heard from for this long (the SDK "
        "renews every third of it while it lives)",
    )
    return parser


def serve(args: argparse.Namespace) -> int:
    import asyncio

    import ray
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    from ._gateway import Gateway
    from ._pool import Pool

    path = os.path.abspath(args.token_file)
    if os.stat(path).st_mode & 0o077:
        print(f"drums pool serve: {path} is readable by others; chmod 600 it", file=sys.stderr)
        return 1
    token = open(path).read().strip()
    if len(token) < 32:
        print(f"drums pool serve: {path} holds fewer than 32 characters", file=sys.stderr)
        return 1
    ray.init(address=args.address, log_to_driver=False)
    pool = Pool(warm=False)  # the gateway forwards through keepers; it holds no envs itself

    cache: List[Any] = [0.0, []]

    async def hosts(fresh: bool = False) -> List[Tuple[str, int]]:
        # Ray's node view at most 0.5 s old (a step pays no GCS round trip); a create asks
        # for it fresh, since the keepers seat every desktop the moment it is made.
        if fresh or time.monotonic() - cache[0] > 0.5:
            found = await asyncio.to_thread(pool.hosts)
            for host in found:
                pool._keeper(host)
            cache[:] = [time.monotonic(), [(h.label, h.free) for h in found]]
        return list(cache[1])

    async def forward(
        label: str, method: str, p: str, q: str, body: bytes
    ) -> Tuple[int, str, bytes]:
        keeper = pool._keepers[label]
        try:
            return await keeper.forward.remote(method, p, q, body)
        except ray.exceptions.RayError as exc:
            return 503, "application/json", host_down_body(label, exc)

    config = Config()
    config.bind = [args.listen]
    config.accesslog = None
    print(f"drums pool serve: listening on {args.listen}", file=sys.stderr, flush=True)
    gateway = Gateway(token, forward, hosts, session_ttl_s=args.session_ttl_s)
    asyncio.run(hypercorn_serve(gateway, config))  # type: ignore[arg-type]
    return 0


def join(args: argparse.Namespace, extra: Sequence[str]) -> int:
    try:
        with Client(args.drumsd_url, token_file=args.token_file) as client:
            health = client.health()
    except DrumsError as exc:
        print(
            f"drums pool join: the drumsd at {args.drumsd_url} did not answer: {exc}",
            file=sys.stderr,
        )
        return 1
    desktops = args.desktops
    if desktops is None:
        adm = health.admission
        desktops = desktops_admitted(adm.mem_available_mib, adm.slot_cost_mib, args.reserve_mib)
    if desktops <= 0:
        print(
            f"drums pool join: the drumsd at {args.drumsd_url} admits no desktops now "
            f"({health.admission.reason or 'memory below the reserve'}); pass --desktops N",
            file=sys.stderr,
        )
        return 1
    argv = ray_start_argv(args.address, args.node_label, desktops, args.block, extra)
    if args.dry_run:
        print(" ".join(argv))
        return 0
    write_host(HostEntry(args.node_label, args.drumsd_url, os.path.abspath(args.token_file)))
    print(f"drums pool join: {args.node_label} with {desktops} desktops", file=sys.stderr)
    return subprocess.call(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra = _parser().parse_known_args(argv)
    if args.group == "pool" and args.cmd == "join":
        return join(args, extra)
    if args.group == "pool" and args.cmd == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
