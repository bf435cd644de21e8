"""What HA needs of the message store, as Protocols: the master reads, the slave appends.

:class:`~pymq.store.message_store.DefaultMessageStore` is both; the unit tests pass small fakes.
"""

from __future__ import annotations

from typing import Protocol


class MasterStore(Protocol):
    """The store the master streams from (:class:`~pymq.store.ha.master.HAService`)."""

    @property
    def max_phy_offset(self) -> int: ...

    @property
    def min_phy_offset(self) -> int: ...

    def get_commitlog_data(self, offset: int, max_size: int, /) -> bytes | None:
        """Raw commit-log bytes from ``offset``, at most ``max_size``; None when there are none."""
        ...


class SlaveStore(Protocol):
    """The store the slave appends to (:class:`~pymq.store.ha.slave.HAClient`)."""

    @property
    def max_phy_offset(self) -> int: ...

    def start_replica_at(self, offset: int, /) -> None:
        """An empty commit log's first file starts at the file holding ``offset``."""
        ...

    def append_to_commitlog(self, start_offset: int, data: bytes | memoryview, /) -> bool:
        """Append replicated bytes at exactly the current max offset; False when refused."""
        ...
