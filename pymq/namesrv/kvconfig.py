"""KVConfigManager: namespaced key/value settings, persisted as ``{"configTable": {...}}``.

Mutations persist the whole table (temp file + rename, previous kept as ``.bak``) in a worker
thread before they return, so an acknowledged PUT_KV_CONFIG survives a crash.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from pymq.common.files import CoalescedWriter, read_file_with_backup
from pymq.common.serde import loads_lenient

log = logging.getLogger(__name__)

# NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


def _parse(data: bytes) -> dict[str, dict[str, str]]:
    table = loads_lenient(data).get("configTable") or {}
    if not isinstance(table, dict):
        raise ValueError("configTable is not an object")
    return {str(ns): {str(k): str(v) for k, v in kv.items()} for ns, kv in table.items()}


class KVConfigManager:
    def __init__(self, path: str) -> None:
        self.path = path
        self.config_table: dict[str, dict[str, str]] = {}
        self._writer = CoalescedWriter(path)

    def load(self) -> None:
        """Blocking: read the file (or its backup) if there is one."""
        table = read_file_with_backup(self.path, _parse)
        if table is not None:
            self.config_table = table
            log.info("load KV config table OK, %d namespaces", len(table))

    def get(self, namespace: str, key: str) -> str | None:
        return self.config_table.get(namespace, {}).get(key)

    def get_namespace(self, namespace: str) -> dict[str, str] | None:
        table = self.config_table.get(namespace)
        return None if table is None else dict(table)

    async def put(self, namespace: str, key: str, value: str) -> None:
        table = self.config_table.setdefault(namespace, {})
        old = table.get(key)
        table[key] = value
        if old is None:
            log.info("putKVConfig create new config item, %s %s %s", namespace, key, value)
        else:
            log.info("putKVConfig update config item, %s %s %s", namespace, key, value)
        await self.persist()

    async def delete(self, namespace: str, key: str) -> None:
        table = self.config_table.get(namespace)
        if table is None or table.pop(key, None) is None:
            return
        if not table:
            del self.config_table[namespace]
        log.info("deleteKVConfig delete a config item, %s %s", namespace, key)
        await self.persist()

    async def persist(self) -> None:
        """Write the table as it is now (or later); changes waiting for the disk share a write
        and one encoded copy (CoalescedWriter), however many PUT_KV_CONFIG arrive meanwhile."""
        await self._writer.write(self._snapshot)

    def _snapshot(self) -> Callable[[], bytes]:
        data = json.dumps({"configTable": self.config_table}, indent=4, sort_keys=True).encode()
        return lambda: data

    def print_all(self) -> None:
        log.info("--------------------------------------------------------")
        log.info("configTable SIZE: %d", len(self.config_table))
        for namespace, table in self.config_table.items():
            for key, value in table.items():
                log.info("configTable NS: %s Key: %s Value: %s", namespace, key, value)
