"""The Linux slot runtime: CRIU restores of a desktop into their own namespaces, cgroups and
copy-on-write overlay roots (the `SlotRuntime` the control plane calls).

Use it inside `open_linux_runtime(config)`: the runtime owns a nursery for supervision (pidfds),
background kills, warm uppers and spare refills. One module per part, each a mixin on the shared
state of `base.RuntimeBase`; every OS effect is a synchronous function in `drumsd.linux`
(`slot_fs`, `process_trees`, `checkpoint_files`, ...) called through trio.to_thread:

- base.py      config, the instance record, fs set-up/teardown, supervision, disposal, handles
- restore.py   instances and the restore queue: images on tmpfs, CRIU restore, restore/reset/destroy
- slot_io.py   agent calls, commands and files in a slot, facts, quiescence
- dumps.py     CRIU dumps: capture and branch
- boot.py      cold boots and templates
- spares.py    warm spares and warm uppers
- adoption.py  adoption and sweep after a restart
- ksm.py       KSM join/leave and its savings
- runtime.py   `LinuxRuntime` (the parts combined), `run`, `open_linux_runtime`
"""

from drumsd.linux.trees import tree_sha256
from drumsd.runtime.linux.base import LinuxRuntimeConfig, _Instance
from drumsd.runtime.linux.runtime import LinuxRuntime, open_linux_runtime

__all__ = [
    "LinuxRuntime",
    "LinuxRuntimeConfig",
    "_Instance",
    "open_linux_runtime",
    "tree_sha256",
]
