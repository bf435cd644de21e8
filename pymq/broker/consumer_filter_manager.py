"""ConsumerFilterManager: SQL92/property filter data per topic (consumerFilter.json).

pymq filters by tag only (``enablePropertyFilter`` is off, as RocketMQ's default), so the table
stays empty; the file is kept, read and written in RocketMQ's shape so a store directory moves
between pymq and RocketMQ unchanged.
"""

from __future__ import annotations

from typing import Any

from pymq.broker.config_manager import JsonConfigManager


class ConsumerFilterManager(JsonConfigManager):
    file_name = "consumerFilter.json"

    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir)
        self.filter_data_by_topic: dict[str, Any] = {}

    def encode(self) -> Any:
        return {"filterDataByTopic": self.filter_data_by_topic}

    def decode(self, data: Any) -> None:
        self.filter_data_by_topic = dict(data.get("filterDataByTopic") or {})
