"""The instance table: which instance serves each slot (a reset swaps it), and each slot's next
filesystem prepared ahead of its reset (a warm upper)."""

from __future__ import annotations

from drumsd.core.seams import RuntimeError_, SlotHandle
from drumsd.runtime.linux.base import Instance, Prepared


class InstanceTable:
    def __init__(self) -> None:
        self._serving: dict[str, Instance] = {}
        self._warm: dict[str, Prepared] = {}

    def __contains__(self, slot_id: str) -> bool:
        return slot_id in self._serving

    def __len__(self) -> int:
        return len(self._serving)

    def get(self, slot_id: str) -> Instance | None:
        return self._serving.get(slot_id)

    def of(self, handle: SlotHandle) -> Instance:
        """The instance behind `handle`, or a typed error when this runtime does not serve it
        (another daemon's, not adopted, or an older instance of the slot)."""
        inst = self._serving.get(handle.slot_id)
        if inst is None or inst.pid != handle.init_pid:
            raise RuntimeError_(
                "runtime_error",
                f"slot {handle.slot_id} (pid {handle.init_pid})"
                " is not served by this runtime; adopt() it or create it again",
            )
        return inst

    def serve(self, slot_id: str, inst: Instance) -> None:
        self._serving[slot_id] = inst

    def release(self, slot_id: str) -> Instance | None:
        """The slot's instance, no longer served (the caller disposes of it)."""
        return self._serving.pop(slot_id, None)

    def serving(self) -> list[Instance]:
        return list(self._serving.values())

    def park_warm(self, slot_id: str, prep: Prepared) -> bool:
        """Keep `prep` for the slot's next reset; False (the caller tears it down) when the slot
        is gone or has one already."""
        if slot_id not in self._serving or slot_id in self._warm:
            return False
        self._warm[slot_id] = prep
        return True

    def has_warm(self, slot_id: str) -> bool:
        return slot_id in self._warm

    def take_warm(self, slot_id: str) -> Prepared | None:
        return self._warm.pop(slot_id, None)

    def take_all_warm(self) -> list[Prepared]:
        taken = list(self._warm.values())
        self._warm.clear()
        return taken

    def iids(self) -> set[str]:
        """Every instance dir the table names (a sweep leaves them alone)."""
        return {i.iid for i in self._serving.values()} | {p.iid for p in self._warm.values()}
