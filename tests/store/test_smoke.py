from __future__ import annotations

from pymq.common.record import decode_record
from pymq.store import GetMessageStatus, PutMessageStatus
from tests.store.helpers import make_message, running_store, small_config


async def test_put_get_restart(root):
    config = small_config(root)
    async with running_store(config) as store:
        results = [await store.put(make_message(body=b"m%d" % i)) for i in range(10)]
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert [r.logic_offset for r in results] == list(range(10))
        await store.reput.do_reput()
        got = store.get_message("g", "TopicTest", 0, 0, 32)
        assert got.status is GetMessageStatus.FOUND
        assert [decode_record(m).body for m in got.messages] == [b"m%d" % i for i in range(10)]
    async with running_store(config) as store:
        assert store.last_exit_ok
        assert store.get_max_offset_in_queue("TopicTest", 0) == 10
        r = await store.put(make_message(body=b"after"))
        assert r.logic_offset == 10
