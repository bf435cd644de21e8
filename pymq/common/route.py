"""Route data the name server keeps and serves, as RocketMQ 4.x writes it in JSON bodies."""

from __future__ import annotations

import json
import struct
import zlib

import attrs

from pymq.common.serde import from_json, from_plain, loads_lenient, to_json
from pymq.common.topic import DataVersion, TopicConfig, TopicConfigSerializeWrapper

MASTER_ID = 0


@attrs.define
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@attrs.define
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = attrs.Factory(dict)

    def select_broker_addr(self) -> str | None:
        """The master's address, else any slave's (as BrokerData.selectBrokerAddr)."""
        if MASTER_ID in self.broker_addrs:
            return self.broker_addrs[MASTER_ID]
        return next(iter(self.broker_addrs.values()), None)


@attrs.define
class TopicRouteData:
    order_topic_conf: str | None = None
    queue_datas: list[QueueData] = attrs.Factory(list)
    broker_datas: list[BrokerData] = attrs.Factory(list)
    filter_server_table: dict[str, list[str]] = attrs.Factory(dict)


@attrs.define
class ClusterInfo:
    broker_addr_table: dict[str, BrokerData] = attrs.Factory(dict)
    cluster_addr_table: dict[str, list[str]] = attrs.Factory(dict)


@attrs.define
class TopicList:
    topic_list: list[str] = attrs.Factory(list)
    broker_addr: str | None = None


@attrs.define
class KVTable:
    table: dict[str, str] = attrs.Factory(dict)


# A compressed REGISTER_BROKER body inflating past this is refused (a deflate stream of 16 MB,
# the most a frame holds, could otherwise inflate to gigabytes).  100,000 topics take ~5 MB.
MAX_REGISTER_BODY_BYTES = 64 * 1024 * 1024


@attrs.define
class RegisterBrokerBody:
    """The body of REGISTER_BROKER: the broker's topics, with their data version."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = attrs.Factory(
        TopicConfigSerializeWrapper
    )
    filter_server_list: list[str] = attrs.Factory(list)

    def encode(self, compressed: bool = False) -> bytes:
        if not compressed:
            return to_json(self)
        # RegisterBrokerBody.encode(true): a deflate stream of length-prefixed JSON pieces.
        wrapper = self.topic_config_serialize_wrapper
        parts = [_prefixed(to_json(wrapper.data_version))]
        parts.append(struct.pack(">i", len(wrapper.topic_config_table)))
        for config in wrapper.topic_config_table.values():
            parts.append(_prefixed(_topic_config_line(config)))
        parts.append(_prefixed(json.dumps(self.filter_server_list).encode()))
        return zlib.compress(b"".join(parts), 9)

    @classmethod
    def decode(cls, data: bytes, compressed: bool = False) -> RegisterBrokerBody:
        """Decode either form; raises ValueError when the body is not one."""
        if not compressed:
            return from_json(data, cls)
        try:
            inflater = zlib.decompressobj()
            raw = inflater.decompress(data, MAX_REGISTER_BODY_BYTES)
            if inflater.unconsumed_tail:
                raise ValueError(
                    f"compressed register body inflates past {MAX_REGISTER_BODY_BYTES} bytes"
                )
            pos = 0

            def take() -> bytes:
                nonlocal pos
                (n,) = struct.unpack_from(">i", raw, pos)
                if n < 0 or pos + 4 + n > len(raw):
                    raise ValueError("bad length in compressed register body")
                pos += 4 + n
                return raw[pos - n : pos]

            version = from_json(take(), DataVersion)
            (count,) = struct.unpack_from(">i", raw, pos)
            pos += 4
            table: dict[str, TopicConfig] = {}
            for _ in range(count):
                config = _parse_topic_config_line(take().decode())
                table[config.topic_name] = config
            servers = loads_lenient(take()) if pos < len(raw) else []
        except (zlib.error, struct.error, UnicodeDecodeError) as exc:
            raise ValueError(f"bad compressed register body: {exc}") from None
        return cls(TopicConfigSerializeWrapper(table, version), list(servers or []))


def _prefixed(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _topic_config_line(config: TopicConfig) -> bytes:
    # TopicConfig.encode(): "name rqn wqn perm filterType" separated by single spaces.
    return (
        f"{config.topic_name} {config.read_queue_nums} {config.write_queue_nums} "
        f"{config.perm} {config.topic_filter_type.value}"
    ).encode()


def _parse_topic_config_line(line: str) -> TopicConfig:
    fields = line.split(" ")
    if len(fields) < 5:
        raise ValueError(f"bad topic config line {line!r}")
    return from_plain(
        {
            "topicName": fields[0],
            "readQueueNums": fields[1],
            "writeQueueNums": fields[2],
            "perm": fields[3],
            "topicFilterType": fields[4],
        },
        TopicConfig,
    )
