"""Request-reply (RocketMQ 4.6+) through pymq: SEND_REPLY_MESSAGE(_V2) (324/325) on the broker,
PUSH_REPLY_MESSAGE_TO_CLIENT (326) to the requester, ``Producer.request`` and
``create_reply_message`` in the client (issue #37)."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from pymq.broker.processors import reply as reply_processor
from pymq.client import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    MQClientError,
    Producer,
    PushConsumer,
    RequestTimeoutError,
    SendResult,
    create_reply_message,
    topics,
)
from pymq.client import instance as client_instance
from pymq.client.instance import ClientInstance, PendingReply
from pymq.common.consumer import HeartbeatData, ProducerData
from pymq.common.message_ext import (
    PROPERTY_CLUSTER,
    PROPERTY_CORRELATION_ID,
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_MESSAGE_TTL,
    PROPERTY_MESSAGE_TYPE,
    PROPERTY_PUSH_REPLY_TIME,
    PROPERTY_REPLY_MESSAGE_ARRIVE_TIME,
    MessageSysFlag,
    encode_properties,
)
from pymq.common.serde import to_json
from pymq.embedded import Cluster, open_cluster
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.testing import TEST_PROPERTIES
from tests.helpers import wait_until

TOPIC = "RequestTopic"
REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


@asynccontextmanager
async def reply_cluster(tmp_path: object, **extra: str) -> AsyncIterator[Cluster]:
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties={**TEST_PROPERTIES, **extra},
    ) as cluster:
        await topics.create_topic(
            cluster.namesrv_addr, TOPIC, brokers=[cluster.broker_addr], queues=2
        )
        yield cluster


async def stored(cluster: Cluster, topic: str = REPLY_TOPIC) -> list[MessageExt]:
    store = cluster.broker.store
    await store.reput.do_reput()  # a new queue's first entry waits for its file (a thread)
    out = []
    for offset in range(store.get_max_offset_in_queue(topic, 0)):
        msg = store.message_at(topic, 0, offset)
        assert msg is not None
        out.append(msg)
    return out


class Responder:
    """A push consumer's handler answering each request with ``re:<body>`` through its own
    producer, keeping the broker's answers (or refusals)."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.requests: list[MessageExt] = []
        self.results: list[SendResult | MQClientError] = []

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        for msg in msgs:
            self.requests.append(msg)
            try:
                self.results.append(
                    await self.producer.send(create_reply_message(msg, b"re:" + msg.body))
                )
            except MQClientError as exc:
                self.results.append(exc)
        return True


@asynccontextmanager
async def responder(cluster: Cluster) -> AsyncIterator[Responder]:
    ns = cluster.namesrv_addr
    async with Producer("ReplyPG", ns) as producer:
        handler = Responder(producer)
        async with PushConsumer("ResponderCG", ns, handler, consume_from=FIRST) as consumer:
            await consumer.subscribe(TOPIC)
            yield handler


@pytest.mark.parametrize("store", [True, False])
async def test_request_gets_its_reply_and_the_reply_topic_keeps_it_if_told(
    tmp_path: object, store: bool
) -> None:
    flag = "true" if store else "false"
    async with reply_cluster(tmp_path, storeReplyMessageEnable=flag) as cluster:
        async with (
            responder(cluster) as handler,
            Producer("RequestPG", cluster.namesrv_addr) as requester,
        ):
            original = Message(TOPIC, b"q1", tags="T", properties={"k": "v"})
            reply = await requester.request(original, timeout=10)
            second = await requester.request(Message(TOPIC, b"q2"), timeout=10)
            assert requester.client is not None
            client_id = requester.client.client_id
            assert requester.client.pending_replies == {}
        assert original.properties == {"k": "v"}  # the caller's message is left as it was
        request = handler.requests[0]
        assert request.properties[PROPERTY_MESSAGE_REPLY_TO_CLIENT] == client_id
        assert request.properties[PROPERTY_MESSAGE_TTL] == "10000"
        assert request.properties["k"] == "v" and request.tags == "T"
        assert reply.body == b"re:q1" and second.body == b"re:q2"
        assert reply.topic == REPLY_TOPIC
        props = reply.properties
        assert props[PROPERTY_CORRELATION_ID] == request.properties[PROPERTY_CORRELATION_ID]
        assert props[PROPERTY_MESSAGE_TYPE] == "reply"
        assert props[PROPERTY_MESSAGE_REPLY_TO_CLIENT] == client_id
        assert props[PROPERTY_MESSAGE_TTL] == "10000"
        assert int(props[PROPERTY_PUSH_REPLY_TIME]) <= int(
            props[PROPERTY_REPLY_MESSAGE_ARRIVE_TIME]
        )
        assert reply.store_host == cluster.broker.store_host
        answers = handler.results
        assert all(isinstance(a, SendResult) and a.status == "SEND_OK" for a in answers)
        kept = await stored(cluster)
        if store:
            assert [m.body for m in kept] == [b"re:q1", b"re:q2"]
            assert [a.queue_offset for a in answers] == [0, 1]  # type: ignore[union-attr]
            assert answers[0].offset_msg_id == kept[0].msg_id  # type: ignore[union-attr]
            assert PROPERTY_PUSH_REPLY_TIME not in kept[0].properties  # as the responder sent it
        else:
            assert kept == []
            assert [(a.offset_msg_id, a.queue_offset) for a in answers] == [("0", 0)] * 2  # type: ignore[union-attr]


def forged_request(client_id: str | None, correlation: str = "c-1") -> MessageExt:
    """A request as a responder gets it, naming ``client_id`` as the requester."""
    props = {PROPERTY_CLUSTER: "DefaultCluster", PROPERTY_CORRELATION_ID: correlation}
    if client_id is not None:
        props[PROPERTY_MESSAGE_REPLY_TO_CLIENT] = client_id
    return MessageExt(topic=TOPIC, body=b"q", properties=props)


async def test_reply_to_a_requester_that_is_gone_is_refused_as_java_refuses_it(
    tmp_path: object,
) -> None:
    async with reply_cluster(tmp_path) as cluster:
        ns = cluster.namesrv_addr
        async with Producer("RequestPG", ns) as gone:
            await gone.publish_queues(TOPIC)
            assert gone.client is not None
            gone_id = gone.client.client_id
            producers = cluster.broker.producer_manager
            await wait_until(lambda: producers.find_channel(gone_id) is not None)
        await wait_until(lambda: producers.find_channel(gone_id) is None)
        assert gone_id not in producers.clients
        async with Producer("ReplyPG", ns) as responder_producer:
            for client_id, remark in [
                (gone_id, f"push reply message fail, channel of <{gone_id}> not found."),
                ("never-seen", "push reply message fail, channel of <never-seen> not found."),
                (None, "reply message properties[REPLY_TO_CLIENT] is null"),
            ]:
                with pytest.raises(MQClientError) as refused:
                    await responder_producer.send(
                        create_reply_message(forged_request(client_id), b"r")
                    )
                assert (refused.value.code, refused.value.remark) == (
                    ResponseCode.SYSTEM_ERROR,
                    remark,
                )
        # Stored all the same (storeReplyMessageEnable), once each: a reply is not retried.
        assert [m.body for m in await stored(cluster)] == [b"r", b"r", b"r"]


async def test_a_reply_needs_a_cluster_property() -> None:
    with pytest.raises(MQClientError) as refused:
        create_reply_message(MessageExt(topic=TOPIC, body=b"q"), b"r")
    assert refused.value.code == 10007
    assert "property[CLUSTER] is null" in refused.value.remark


async def test_request_without_a_responder_times_out(tmp_path: object) -> None:
    async with (
        reply_cluster(tmp_path) as cluster,
        Producer("RequestPG", cluster.namesrv_addr) as requester,
    ):
        with pytest.raises(RequestTimeoutError) as late:
            await requester.request(Message(TOPIC, b"nobody"), timeout=0.5)
        assert late.value.code == 10006
        assert late.value.remark == (
            f"send request message to <{TOPIC}> OK, but wait reply message timeout, 500 ms."
        )
        assert requester.client is not None and requester.client.pending_replies == {}


async def test_a_reply_naming_another_client_reaches_it_and_is_dropped(tmp_path: object) -> None:
    """Java lets any client name any clientId in REPLY_TO_CLIENT (the request may have gone
    through another broker: none can check): the broker pushes it, and the named client keeps
    only replies to requests it waits for."""
    async with reply_cluster(tmp_path) as cluster:
        ns = cluster.namesrv_addr
        async with Producer("RequestPG", ns) as victim, Producer("Intruder", ns) as intruder:
            await victim.publish_queues(TOPIC)
            assert victim.client is not None
            victim_id = victim.client.client_id
            pending = victim.client.pending_replies
            await wait_until(lambda: cluster.broker.producer_manager.find_channel(victim_id))
            async with trio.open_nursery() as nursery:
                got: list[MessageExt] = []

                async def ask() -> None:
                    got.append(await victim.request(Message(TOPIC, b"real"), timeout=10))

                nursery.start_soon(ask)
                await wait_until(lambda: len(pending) == 1)
                (correlation,) = pending
                for i in range(50):  # replies to requests the victim never made
                    result = await intruder.send(
                        create_reply_message(forged_request(victim_id, f"forged-{i}"), b"evil")
                    )
                    assert result.status == "SEND_OK"  # pushed and taken, as by Java's client
                # The asynchronous send goes as a reply too (a plain send would be stored
                # and answered SEND_OK): refused, its requester unknown.
                answered: list[Exception | None] = []
                await intruder.send_async(
                    create_reply_message(forged_request("nobody", "forged-async"), b"evil"),
                    lambda result, error: answered.append(error),
                )
                await wait_until(lambda: answered)
                assert isinstance(answered[0], MQClientError)
                assert answered[0].code == ResponseCode.SYSTEM_ERROR
                assert list(pending) == [correlation]  # nothing kept for them
                # The real reply still gets through.
                await intruder.send(
                    create_reply_message(forged_request(victim_id, correlation), b"ok")
                )
            assert [m.body for m in got] == [b"ok"]
            assert pending == {}


class MuteRequester:
    """A client that heartbeats as a producer under ``client_id`` and answers a reply push as
    ``answer`` says (never, or with an error)."""

    def __init__(self, answer: Callable[[RemotingCommand], Awaitable[RemotingCommand | None]]):
        self.answer = answer
        self.pushes = 0

    async def serve(self, channel: Channel, req: RemotingCommand) -> RemotingCommand | None:
        self.pushes += 1
        return await self.answer(req)


async def _never(req: RemotingCommand) -> RemotingCommand | None:
    await trio.sleep_forever()
    return None


async def _refuse(req: RemotingCommand) -> RemotingCommand | None:
    return req.response(ResponseCode.SYSTEM_ERROR, "no")


@pytest.mark.parametrize("answer", [_never, _refuse])
async def test_a_push_the_requester_does_not_take_fails_the_reply(
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
    answer: Callable[[RemotingCommand], Awaitable[RemotingCommand | None]],
) -> None:
    monkeypatch.setattr(reply_processor, "PUSH_REPLY_TIMEOUT", 0.5)
    async with reply_cluster(tmp_path) as cluster, trio.open_nursery() as nursery:
        mute = MuteRequester(answer)
        raw = RemotingClient(nursery, handler=mute.serve)
        heartbeat = to_json(HeartbeatData("mute-client", [ProducerData("MutePG")], []))
        response = await raw.invoke(
            cluster.broker_addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=heartbeat), 3
        )
        assert response.code == ResponseCode.SUCCESS
        async with Producer("ReplyPG", cluster.namesrv_addr) as responder_producer:
            started = trio.current_time()
            with pytest.raises(MQClientError) as refused:
                await responder_producer.send(
                    create_reply_message(forged_request("mute-client"), b"r"), timeout=5
                )
            assert trio.current_time() - started < 3
        assert (refused.value.code, refused.value.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "push reply message to mute-clientfail.",
        )
        assert mute.pushes == 1
        raw.close()
        nursery.cancel_scope.cancel()


async def test_push_headers_and_bodies_the_client_cannot_use_are_answered_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_instance, "MAX_REPLY_BODY", 1024 * 1024)
    async with trio.open_nursery() as nursery:
        client = ClientInstance(nursery, "127.0.0.1:1")
        waiting = client.pending_replies["c-1"] = PendingReply()

        def push(ext: dict[str, str], body: bytes) -> RemotingCommand:
            req = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, ext, body)
            return req

        good = H.encode(
            H.ReplyMessageRequestHeader(
                producer_group="PG",
                topic=REPLY_TOPIC,
                default_topic="TBW102",
                default_topic_queue_nums=4,
                queue_id=0,
                sys_flag=0,
                born_timestamp=1,
                flag=0,
                properties=encode_properties({PROPERTY_CORRELATION_ID: "c-1"}),
                born_host="127.0.0.1:5",
                store_host="127.0.0.1:6",
                store_timestamp=2,
            )
        )

        class _Peer:
            remote_address = "127.0.0.1:7"

        peer: Channel = _Peer()  # type: ignore[assignment]
        missing = {k: v for k, v in good.items() if k != "storeHost"}
        with pytest.raises(H.HeaderError, match="storeHost"):
            await client._serve(peer, push(missing, b""))
        bomb = zlib.compress(b"\0" * (1024 * 1024 + 1), 9)
        compressed = {**good, "sysFlag": str(MessageSysFlag.COMPRESSED_FLAG)}
        for body in (bomb, b"not zlib"):
            answer = await client._serve(peer, push(compressed, body))
            assert answer is not None
            assert (answer.code, answer.remark) == (
                ResponseCode.SYSTEM_ERROR,
                "process reply message fail",
            )
        assert waiting.reply is None and list(client.pending_replies) == ["c-1"]
        answer = await client._serve(peer, push(compressed, zlib.compress(b"fine")))
        assert answer is not None and answer.code == ResponseCode.SUCCESS
        assert waiting.reply is not None and waiting.reply.body == b"fine"
        assert waiting.reply.born_host == ("127.0.0.1", 5)
        assert client.pending_replies == {}
        client.close()
        nursery.cancel_scope.cancel()


async def test_send_reply_message_with_long_names(tmp_path: object) -> None:
    """SEND_REPLY_MESSAGE (324), the V1 header with long names (Java's sendSmartMsg=false)."""
    async with reply_cluster(tmp_path) as cluster, trio.open_nursery() as nursery:
        raw = RemotingClient(nursery)
        header = H.SendMessageRequestHeader(
            producer_group="PG",
            topic=REPLY_TOPIC,
            default_topic="TBW102",
            default_topic_queue_nums=4,
            queue_id=0,
            sys_flag=0,
            born_timestamp=1,
            flag=0,
            properties=encode_properties({PROPERTY_MESSAGE_TYPE: "reply"}),
        )
        request = RemotingCommand.request(
            RequestCode.SEND_REPLY_MESSAGE, header.to_ext(v2=False), b"body"
        )
        answer = await raw.invoke(cluster.broker_addr, request, 3)
        assert (answer.code, answer.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "reply message properties[REPLY_TO_CLIENT] is null",
        )
        assert answer.ext_fields["queueOffset"] == "0"  # stored, its place named
        assert answer.ext_fields["MSG_REGION"] == "DefaultRegion"
        no_topic = {k: v for k, v in header.to_ext(v2=False).items() if k != "topic"}
        bad = RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE, no_topic, b"body")
        answer = await raw.invoke(cluster.broker_addr, bad, 3)
        assert (answer.code, answer.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "the custom field <topic> is null",
        )
        assert [m.body for m in await stored(cluster)] == [b"body"]
        raw.close()
        nursery.cancel_scope.cancel()


async def test_the_push_and_the_answers_are_java_4_9_4s(tmp_path: object) -> None:
    """326's header and 325's answers field for field as the Java 4.9.4 broker sends them (seen
    against its build, 2026-11-28): the send header's fields (queueId as the responder sent
    it), bornHost/storeHost as ip:port, and the properties in Java's HashMap order with
    PUSH_REPLY_TIME; the stored reply keeps the responder's properties as they were."""
    pushes: list[RemotingCommand] = []

    async def take(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        pushes.append(req)
        return req.response()

    async with reply_cluster(tmp_path) as cluster, trio.open_nursery() as nursery:
        requester = RemotingClient(nursery, handler=take)
        heartbeat = to_json(HeartbeatData("raw-req", [ProducerData("RawPG")], []))
        await requester.invoke(
            cluster.broker_addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=heartbeat), 3
        )
        responder = RemotingClient(nursery)
        sent = encode_properties(
            {
                PROPERTY_MESSAGE_TYPE: "reply",
                PROPERTY_CORRELATION_ID: "c1",
                PROPERTY_MESSAGE_REPLY_TO_CLIENT: "raw-req",
                PROPERTY_MESSAGE_TTL: "3000",
            }
        )
        header = H.SendMessageRequestHeader(
            producer_group="RespPG",
            topic=REPLY_TOPIC,
            default_topic="TBW102",
            default_topic_queue_nums=4,
            queue_id=-1,
            sys_flag=0,
            born_timestamp=123,
            flag=7,
            properties=sent,
            reconsume_times=0,
        )
        request = RemotingCommand.request(
            RequestCode.SEND_REPLY_MESSAGE_V2, header.to_ext(v2=True), b"hello"
        )
        answer = await responder.invoke(cluster.broker_addr, request, 5)
        kept = await stored(cluster)
        assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, None)
        assert answer.ext_fields == {
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
            "msgId": kept[0].msg_id,
            "queueId": "0",
            "queueOffset": "0",
        }
        (push,) = pushes
        ext = dict(push.ext_fields)
        pushed_at = ext.pop("storeTimestamp")
        assert ext == {
            "bornHost": ext["bornHost"],
            "bornTimestamp": "123",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4",
            "flag": "7",
            "producerGroup": "RespPG",
            "properties": (
                f"PUSH_REPLY_TIME\x01{pushed_at}\x02MSG_TYPE\x01reply\x02REPLY_TO_CLIENT\x01raw-req"
                "\x02TTL\x013000\x02CORRELATION_ID\x01c1"
            ),
            "queueId": "-1",
            "reconsumeTimes": "0",
            "storeHost": f"127.0.0.1:{cluster.broker.store_host[1]}",
            "sysFlag": "0",
            "topic": REPLY_TOPIC,
            "unitMode": "false",
        }
        assert ext["bornHost"].startswith("127.0.0.1:") and push.body == b"hello"
        assert encode_properties(kept[0].properties) == sent and kept[0].flag == 7
        requester.close()
        responder.close()
        nursery.cancel_scope.cancel()


async def test_client_ids_differ_between_processes_with_the_same_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reply goes to the connection its REPLY_TO_CLIENT last registered on: two processes
    whose pid and instance number agree (containers) must still have different clientIds."""
    ids = []
    async with trio.open_nursery() as nursery:
        for _ in range(2):  # each as a fresh process's first instance with pid 1
            monkeypatch.setattr(client_instance, "_instance_ids", itertools.count(1))
            monkeypatch.setattr(client_instance.os, "getpid", lambda: 1)
            client = ClientInstance(nursery, "127.0.0.1:1")
            ids.append(client.client_id)
            client.close()
    assert ids[0] != ids[1] and all(i.startswith("127.0.0.1@1#1#") for i in ids)
