"""The dashboard's views the console gained: producers of a group, the dead-letter queue with
resend, and a message's consumption state per group (message track)."""

from __future__ import annotations

from pymq.client import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer, topics
from pymq.embedded import Cluster
from tests.admin.helpers import AdminClient
from tests.helpers import wait_until

TOPIC = "DashT"


async def test_producers_dead_letters_and_message_track(
    admin_cluster: Cluster, admin: AdminClient
) -> None:
    ns = admin_cluster.namesrv_addr
    await topics.create_topic(ns, TOPIC, queues=1)
    received: list[MessageExt] = []
    accept_poison = False

    async def handler(msgs: list[MessageExt]) -> bool:
        if any(m.body == b"poison" for m in msgs) and not accept_poison:
            return False
        received.extend(msgs)
        return True

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with (
        Producer("dash-producer", ns) as producer,
        PushConsumer("dash-g", ns, handler, consume_from=first, max_reconsume_times=0) as consumer,
    ):
        await consumer.subscribe(TOPIC, "A")
        ok = await producer.send(Message(TOPIC, b"ok", tags="A"))
        await producer.send(Message(TOPIC, b"poison", tags="A"))

        # Producers of a group.
        groups = {g["group"]: g for g in await admin.call("producer.list")}
        assert len(groups["dash-producer"]["connectionSet"]) == 1
        producers = await admin.call("group.producers", group="dash-producer")
        assert producers["connectionSet"][0]["clientId"] == producer.client.client_id  # type: ignore[union-attr]
        missing = await admin.request("group.producers", group="nobody")
        assert missing["ok"] is False and "not exist" in missing["error"]["message"]

        # The poison message fails once and, with no retries allowed, lands in the DLQ.
        async def dead_letters() -> list | None:
            page = await admin.call("dlq.messages", group="dash-g")
            return page["messages"] or None

        letters = await wait_until(dead_letters, timeout=30, interval=0.1)
        assert letters[0]["bodyPreview"] == "poison"
        assert letters[0]["properties"]["RETRY_TOPIC"] == TOPIC
        empty = await admin.call("dlq.messages", group="never-failed")
        assert empty["messages"] == [] and empty["topic"] == "%DLQ%never-failed"

        # Message track: consumed by the live group; not yet by a group with an old offset.
        await wait_until(lambda: any(m.body == b"ok" for m in received), timeout=30)
        await consumer.persist_offsets()
        admin_cluster.broker.consumer_offset_manager.commit_offset("t", "dash-idle", TOPIC, 0, 0)
        track = await admin.call("message.track", msgId=ok.offset_msg_id)
        states = {t["group"]: t["trackType"] for t in track["tracks"]}
        assert states == {"dash-g": "CONSUMED", "dash-idle": "NOT_ONLINE"}
        assert track["message"]["topic"] == TOPIC

        # Resend the dead letter: the group consumes it again, under its original topic.
        accept_poison = True
        resent = await admin.call("dlq.resend", group="dash-g", offset=letters[0]["queueOffset"])
        assert resent["topic"] == "%RETRY%dash-g"
        await wait_until(lambda: any(m.body == b"poison" for m in received), timeout=30)
        poison = next(m for m in received if m.body == b"poison")
        assert poison.topic == TOPIC
        gone = await admin.request("dlq.resend", group="dash-g", offset=99)
        assert gone["ok"] is False
