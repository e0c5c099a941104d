"""The host uid ranges of the hardened profile: one per instance, claimed host-wide (daemons side
by side never share one) and each with a user namespace for its idmapped mounts. The trusted
profile maps ids one to one and holds no range."""

from __future__ import annotations

from collections.abc import Iterable

from drumsd.linux import host_share, idmap
from drumsd.linux.process_trees import close_fd

IdMap = tuple[tuple[int, int, int], ...]


class UidRanges:
    def __init__(self, claims: host_share.UidRanges, *, hardened: bool) -> None:
        self.hardened = hardened
        self.claims = claims
        self._held: set[int] = set()  # held by our instances, being made, or not yet swept
        self._userns_fds: dict[int, int] = {}

    def hold(self, indexes: Iterable[int]) -> None:
        """Ranges in use already: an adopted slot's, or a previous daemon's until swept."""
        self._held.update(indexes)

    def held(self) -> frozenset[int]:
        return frozenset(self._held)

    def recover_claims(self) -> list[int]:
        """At start (hardened): our host-wide claims made to match the ranges held; returns
        those another daemon claims too."""
        return self.claims.recover(self._held) if self.hardened else []

    def allocate(self) -> int | None:
        """The lowest range free here and on the host (hardened), or None (identity map)."""
        if not self.hardened:
            return None
        index = self.claims.claim_lowest(self._held)
        self._held.add(index)
        return index

    def free(self, index: int | None) -> None:
        if index is None:
            return
        self._held.discard(index)
        self.claims.release(index)

    def userns_of(self, index: int) -> int:
        """A user namespace fd with the range's map (made once, kept until `close`)."""
        fd = self._userns_fds.get(index)
        if fd is None:
            fd = self._userns_fds[index] = idmap.userns_fd(idmap.range_map(index))
        return fd

    @staticmethod
    def id_map(index: int | None) -> IdMap:
        return idmap.IDENTITY if index is None else idmap.range_map(index)

    def close(self) -> None:
        for fd in self._userns_fds.values():
            close_fd(fd)
        self._userns_fds.clear()
