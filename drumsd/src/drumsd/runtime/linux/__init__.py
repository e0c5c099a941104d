"""The Linux slot runtime: CRIU restores of a desktop into their own namespaces, cgroups and
copy-on-write overlay roots (the `SlotRuntime` the control plane calls).

Use it inside `open_linux_runtime(config)`: the runtime owns a nursery for supervision (pidfds),
background kills, warm uppers and spare refills. `LinuxRuntime` holds small owners of its state
and parts that each take the owners they need; every OS effect is a synchronous function in
`drumsd.linux` (`slot_fs`, `process_trees`, `checkpoint_files`, ...) called through trio.to_thread.

Owners (state with a public interface, each with its own unit tests):
- instances.py    InstanceTable: the instance serving each slot, its warm upper
- images.py       ImageCache: checkpoint images copied to tmpfs, their uid-map variants
- spare_pool.py   SparePool: which checkpoints keep spares, targets, parked spares
- uids.py         UidRanges: the hardened profile's host uid ranges and their user namespaces
- ksm.py          KsmMembership: KSM joined and left host-wide, its savings
- fs.py           InstanceFs: an instance's tmpfs, upper and overlay; the iids being built

Parts (operations):
- base.py         config, the instance record, the event log line
- supervision.py  the running nursery and launcher, pidfd watches, agent calls, disposal
- restore.py      Restorer: the restore queue (CRIU restore into a fresh instance, retries)
- slots.py        Slots: restore, reset, destroy, fork of a slot
- slot_io.py      SlotIO: agent calls, commands and files in a slot, facts
- waits.py        TreeWaits: quiescence, a booting tree's quiet, the init's exit
- dumps.py        Dumper: CRIU dumps, checked against the tree
- boot.py         Booter: cold boots and templates
- spares.py       Spares: warm spares (claims, refills, recycling) and warm uppers
- adoption.py     Adoption: adoption and sweep after a restart
- runtime.py      `LinuxRuntime` (the owners and parts held together), `open_linux_runtime`
"""

from drumsd.linux.trees import tree_sha256
from drumsd.runtime.linux.base import Instance, LinuxRuntimeConfig
from drumsd.runtime.linux.runtime import LinuxRuntime, open_linux_runtime

__all__ = [
    "Instance",
    "LinuxRuntime",
    "LinuxRuntimeConfig",
    "open_linux_runtime",
    "tree_sha256",
]
