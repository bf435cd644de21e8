"""The base of the broker's JSON-persisted managers (RocketMQ's ConfigManager).

A manager encodes its state to JSON and decodes it back; :meth:`load` reads its file at start
(falling back to ``.bak``, refusing to start when both are corrupt) and :meth:`persist` writes it
atomically in a worker thread.

Persists are serialised per manager, and coalesced (:class:`~pymq.common.files.CoalescedWriter`):
a change that arrives while a write is under way is covered by the next write, which encodes the
state as it is when it starts (#37: a flood of auto-created topics held one copy of the whole
table per waiting topic).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import cattrs

from pymq.common.files import CoalescedWriter, read_file_with_backup, write_file_atomic
from pymq.common.serde import error_reasons, loads_lenient

log = logging.getLogger(__name__)


class JsonConfigManager:
    file_name = ""

    def __init__(self, config_dir: str) -> None:
        self.path = os.path.join(config_dir, self.file_name)
        self._writer = CoalescedWriter(self.path)

    def encode(self) -> Any:
        raise NotImplementedError

    def decode(self, data: Any) -> None:
        raise NotImplementedError

    def load(self) -> None:
        """Blocking: read the file (or its backup); a missing file leaves the defaults."""
        loaded = read_file_with_backup(self.path, loads_lenient)
        if loaded is not None:
            try:
                self.decode(loaded)
            except (ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
                # A value out of its bounds (a queue count over MAX_QUEUE_NUMS, say): the
                # broker does not start on a table it cannot serve.
                raise ValueError(f"cannot load {self.path}: {error_reasons(exc)}") from exc
            log.info("loaded %s", self.path)

    def encode_bytes(self) -> bytes:
        return self.dump(self.encode())

    @staticmethod
    def dump(plain: Any) -> bytes:
        return json.dumps(plain, indent=1, sort_keys=True).encode()

    def snapshot(self) -> Callable[[], bytes]:
        """Called on the loop when a write starts: a function that the worker thread calls for
        the file's bytes.  By default the state is encoded here; a manager whose state can be
        copied cheaply (and read safely from a thread) copies it here and encodes it there."""
        data = self.encode_bytes()
        return lambda: data

    async def persist(self) -> None:
        """Write the state as it is now (or later) to the file; returns once it is written."""
        await self._writer.write(self.snapshot)

    def persist_blocking(self) -> None:
        write_file_atomic(self.path, self.encode_bytes())
