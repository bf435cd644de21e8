"""The broker's JSON-persisted managers: round trips, .bak fallback, refusal when both corrupt."""

from __future__ import annotations

import json

import pytest

from pymq.broker.client_manager import ClientChannelInfo, ProducerManager
from pymq.broker.config import BrokerConfig
from pymq.broker.consumer_offset_manager import ConsumerOffsetManager
from pymq.broker.topic_config_manager import TopicConfigManager
from pymq.client import allocate_averagely
from pymq.common.consumer import MessageQueue
from pymq.common.topic import TopicConfig


async def test_topics_round_trip_and_fall_back_to_bak(tmp_path) -> None:
    manager = TopicConfigManager(str(tmp_path), BrokerConfig(broker_name="b"))
    assert "TBW102" in manager.table and manager.table["TBW102"].perm == 7
    await manager.update(TopicConfig("Orders", 8, 8))
    await manager.update(TopicConfig("Orders", 4, 4))  # the first version is now the .bak
    fresh = TopicConfigManager(str(tmp_path), BrokerConfig(broker_name="b"))
    fresh.load()
    assert fresh.table["Orders"] == TopicConfig("Orders", 4, 4)
    assert fresh.data_version == manager.data_version

    (tmp_path / "topics.json").write_text("{ torn")
    recovered = TopicConfigManager(str(tmp_path), BrokerConfig(broker_name="b"))
    recovered.load()
    assert recovered.table["Orders"].write_queue_nums == 8  # from topics.json.bak

    (tmp_path / "topics.json.bak").write_text("also torn")
    broken = TopicConfigManager(str(tmp_path), BrokerConfig(broker_name="b"))
    with pytest.raises(ValueError, match="cannot load"):
        broken.load()


async def test_auto_create_inherits_from_tbw102(tmp_path) -> None:
    changes = []
    manager = TopicConfigManager(str(tmp_path), BrokerConfig(default_topic_queue_nums=8))
    manager.on_change = lambda: changes.append(1)
    created = await manager.create_in_send_message("New", "TBW102", "peer", 4, 0)
    assert created == TopicConfig("New", 4, 4, perm=6)
    assert changes == [1]
    assert await manager.create_in_send_message("Other", "NoTemplate", "peer", 4, 0) is None

    off = TopicConfigManager(str(tmp_path / "off"), BrokerConfig(auto_create_topic_enable=False))
    assert "TBW102" not in off.table
    assert await off.create_in_send_message("New", "TBW102", "peer", 4, 0) is None


def test_consumer_offsets_read_fastjson_numeric_keys(tmp_path) -> None:
    (tmp_path / "consumerOffset.json").write_text(
        '{"offsetTable":{"TopicTest@G":{0:12,1:7},"%RETRY%G@G":{0:0}}}'
    )
    manager = ConsumerOffsetManager(str(tmp_path))
    manager.load()
    assert manager.query_offset("G", "TopicTest", 1) == 7
    assert manager.query_offset("G", "TopicTest", 9) == -1
    assert manager.groups_of_topic("TopicTest") == {"G"}
    manager.commit_offset("peer", "G", "TopicTest", 1, 9)
    assert json.loads(manager.encode_bytes())["offsetTable"]["TopicTest@G"] == {"0": 12, "1": 9}


def test_allocate_averagely_matches_rocketmq() -> None:
    mqs = [MessageQueue("T", "b", i) for i in range(5)]
    ids = ["c1", "c2"]
    assert [q.queue_id for q in allocate_averagely(mqs, ids, "c1")] == [0, 1, 2]
    assert [q.queue_id for q in allocate_averagely(mqs, ids, "c2")] == [3, 4]
    assert allocate_averagely(mqs, ids, "stranger") == []
    many = [f"c{i}" for i in range(7)]
    shares = [len(allocate_averagely(mqs, many, c)) for c in many]
    assert sorted(shares) == [0, 0, 1, 1, 1, 1, 1]


def test_min_offset_in_all_groups_leaves_out_offsets_behind_the_queue(tmp_path) -> None:
    offsets = ConsumerOffsetManager(str(tmp_path))
    offsets.commit_offset("c", "A", "T", 0, 5)
    offsets.commit_offset("c", "A", "T", 1, 50)
    offsets.commit_offset("c", "B", "T", 0, 3)  # behind queue 0's first offset (4): left out
    offsets.commit_offset("c", "B", "T", 1, 60)
    offsets.commit_offset("c", "B", "U", 1, 1)
    queue_min = {0: 4, 1: 0}
    found = offsets.query_min_offset_in_all_group("T", (), lambda topic, q: queue_min[q])
    assert found == {0: 5, 1: 50}
    assert offsets.query_min_offset_in_all_group("T", {"A"}, lambda t, q: queue_min[q]) == {1: 60}
    assert offsets.query_offsets("B", "T") == {0: 3, 1: 60}


def test_producer_clients_by_id_follow_registrations() -> None:
    """ProducerManager.find_channel (where a reply is pushed): the connection a clientId last
    registered on, while some group of that client is registered there."""

    class Conn:
        closed = False

    producers = ProducerManager()
    old, new = Conn(), Conn()
    producers.register("A", ClientChannelInfo(old, "c1", "JAVA", 401, 0.0))
    producers.register("B", ClientChannelInfo(old, "c1", "JAVA", 401, 0.0))
    assert producers.find_channel("c1") is old
    producers.unregister("A", old)  # group B of c1 is still on that connection
    assert producers.find_channel("c1") is old
    producers.register("A", ClientChannelInfo(new, "c1", "JAVA", 401, 0.0))  # reconnected
    assert producers.find_channel("c1") is new
    producers.channel_closed(old)  # the old connection going does not hide the new one
    assert producers.find_channel("c1") is new
    new.closed = True
    assert producers.find_channel("c1") is None
    producers.channel_closed(new)
    assert producers.clients == {} and producers.groups == {}
    producers.register("A", ClientChannelInfo(old, "c2", "JAVA", 401, 0.0))
    assert producers.scan_expired(1000.0) == [old] and producers.clients == {}


async def test_changes_waiting_on_a_slow_disk_share_one_write_and_one_copy(
    tmp_path, monkeypatch
) -> None:
    """#37: each change waiting for the disk held its own encoded copy of the whole table (a
    flood of auto-created topics held one per topic, each the size of the table).  Changes that
    wait now share the next write, which encodes the state as it is when it starts."""
    import threading
    import time

    import trio

    from pymq.common import files

    manager = TopicConfigManager(str(tmp_path), BrokerConfig(broker_name="b"))
    for i in range(2000):
        manager.table[f"T{i:05d}"] = TopicConfig(f"T{i:05d}", 4, 4)
    written: list[bytes] = []
    alive = 0
    most_alive = 0
    lock = threading.Lock()

    def slow_write(path: str, data: bytes) -> None:
        time.sleep(0.05)  # a disk whose fsyncs are slow
        written.append(data)

    real_snapshot = getattr(manager, "snapshot", None)  # None: the old code, which had none

    def counted_snapshot():  # type: ignore[no-untyped-def]
        nonlocal alive, most_alive
        encode = real_snapshot()  # type: ignore[misc]

        def run() -> bytes:
            nonlocal alive, most_alive
            with lock:
                alive += 1
                most_alive = max(most_alive, alive)
            try:
                return encode()
            finally:
                with lock:
                    alive -= 1

        return run

    monkeypatch.setattr(files, "write_file_atomic", slow_write)
    if real_snapshot is not None:
        monkeypatch.setattr(manager, "snapshot", counted_snapshot)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.update, TopicConfig("New000", 4, 4))
        await trio.sleep(0.01)  # its write is under way: the rest wait behind it
        for i in range(1, 200):
            nursery.start_soon(manager.update, TopicConfig(f"New{i:03d}", 4, 4))
    # The first change's write, then one for the 199 that waited behind it (the old code
    # wrote 200 times, each of the 199 holding its copy while it waited).
    assert len(written) == 2
    assert most_alive == 1
    assert "New001" not in json.loads(written[0])["topicConfigTable"]
    last = json.loads(written[-1])["topicConfigTable"]
    assert all(f"New{i:03d}" in last for i in range(200))
    assert json.loads(written[-1])["dataVersion"]["counter"] == 200


async def test_name_server_kv_puts_waiting_on_a_slow_disk_share_one_write(
    tmp_path, monkeypatch
) -> None:
    """The name server's kvConfig.json: the same coalesced writes (a flood of oneway
    PUT_KV_CONFIG held one encoded copy of the table per waiting put)."""
    import time

    import trio

    from pymq.common import files
    from pymq.namesrv import kvconfig
    from pymq.namesrv.kvconfig import KVConfigManager

    written: list[bytes] = []

    def slow_write(path: str, data: bytes) -> None:
        time.sleep(0.05)
        written.append(data)

    monkeypatch.setattr(files, "write_file_atomic", slow_write)
    # (the old code wrote through its own import, once per put)
    monkeypatch.setattr(kvconfig, "write_file_atomic", slow_write, raising=False)
    manager = KVConfigManager(str(tmp_path / "kvConfig.json"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.put, "NS", "k000", "v")
        await trio.sleep(0.01)
        for i in range(1, 200):
            nursery.start_soon(manager.put, "NS", f"k{i:03d}", "v")
    assert len(written) == 2
    assert len(json.loads(written[-1])["configTable"]["NS"]) == 200
