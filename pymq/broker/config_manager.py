"""The base of the broker's JSON-persisted managers (RocketMQ's ConfigManager).

A manager encodes its state to JSON and decodes it back; :meth:`load` reads its file at start
(falling back to ``.bak``, refusing to start when both are corrupt) and :meth:`persist` writes it
atomically in a worker thread.  Persists are serialised per manager so that two writers never
interleave on the temporary file.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import trio

from pymq.common.files import read_file_with_backup, write_file_atomic
from pymq.common.serde import loads_lenient

log = logging.getLogger(__name__)


class JsonConfigManager:
    file_name = ""

    def __init__(self, config_dir: str) -> None:
        self.path = os.path.join(config_dir, self.file_name)
        self._persist_lock = trio.Lock()

    def encode(self) -> Any:
        raise NotImplementedError

    def decode(self, data: Any) -> None:
        raise NotImplementedError

    def load(self) -> None:
        """Blocking: read the file (or its backup); a missing file leaves the defaults."""
        loaded = read_file_with_backup(self.path, loads_lenient)
        if loaded is not None:
            self.decode(loaded)
            log.info("loaded %s", self.path)

    def encode_bytes(self) -> bytes:
        return json.dumps(self.encode(), indent=1, sort_keys=True).encode()

    async def persist(self) -> None:
        data = self.encode_bytes()
        async with self._persist_lock:
            await trio.to_thread.run_sync(write_file_atomic, self.path, data)

    def persist_blocking(self) -> None:
        write_file_atomic(self.path, self.encode_bytes())
