"""drums on Ray (`pip install drums-sdk[ray]`): every drums host of a Ray cluster as one pool.

    with drums.ray.connect() as pool:            # inside a Ray job (ray.init(address="auto"))
        with pool.create(task="e0df059f-...") as env:   # placed on the host with most free
            env.step("pyautogui.click(100, 200)")
            with env.fork(4) as children: ...           # children on the parent's host
            result = env.verify()

Async code (verl's agent loops): `async with drums.ray.aconnect() as pool: await pool.create()`.
A host joins with `drums pool join --address HEAD:PORT` (see docs/pool.md).
"""

from ._async import AsyncPool as AsyncPool
from ._async import AsyncPoolEnv as AsyncPoolEnv
from ._async import aconnect as aconnect
from ._placement import HostSlot as HostSlot
from ._pool import HostDown as HostDown
from ._pool import Pool as Pool
from ._pool import PoolEnv as PoolEnv
from ._pool import connect as connect
