"""A real name server and broker, in this test's nursery, fed malformed frames over loopback.

Each case is one connection: a mutated request (bit flips, truncations, lying lengths, header
fields replaced with anything JSON can say, ext fields with values no Java client sends, deep
nesting, invalid UTF-8, garbage) to the name server, the broker's main and fast ports or its HA
port; some cases first make a valid request on the same connection.  Every answer the servers
write must be a well-formed frame.  Every ``CHECK_EVERY`` cases and at the end both servers must
still serve: a route lookup on the name server, a send and pull round trip on the broker.  An
exception that escapes a server's connection ends the nursery the servers run in, and so fails
the test, with the case that caused it printed.

A second test mutates the ext fields of valid SEND_MESSAGE_V2 requests: every answer must carry
a known response code, and afterwards every queue's offsets must be dense (a refused send takes
no offset): each offset in [minOffset, maxOffset) pulls a message, and the SEND_OK answers of a
queue are exactly its offsets.

``PYMQ_FUZZ_SEED`` reproduces a run (printed on failure); ``PYMQ_FUZZ_CASES`` sets its size.
"""

from __future__ import annotations

import json
import os
import random
import struct
import time

import pytest
import trio

from pymq.client import Message, Producer, PullConsumer, topics
from pymq.common.consumer import MessageQueue
from pymq.common.record import decode_records
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import ProtocolError
from pymq.testing import TEST_PROPERTIES

from .frames import (
    BAD_UTF8,
    LYING_LENGTHS,
    NUMBER_LITERALS,
    binary_header,
    deep_nesting,
    frame,
    json_object,
    random_ext_value,
    random_json_value,
)

SEED = int(os.environ.get("PYMQ_FUZZ_SEED", "1212"))
CASES = int(os.environ.get("PYMQ_FUZZ_CASES", "3000"))
SEND_CASES = int(os.environ.get("PYMQ_FUZZ_SEND_CASES", "1500"))
# Bounds on the fuzzing itself (a count, then time): not assertions, a cap on CI time.
TIME_BUDGET = float(os.environ.get("PYMQ_FUZZ_SECONDS", "10"))
CHECK_EVERY = 50
CASE_TIMEOUT = 10.0  # a server that neither answers nor closes within this has hung

FRAMES_TOPIC = "FuzzFrames"
SEND_TOPICS = ("FuzzSendA", "FuzzSendB")
KNOWN_CODES = {c.value for c in ResponseCode}
# MessageSysFlag's transaction type bits: PREPARED 0x4 and ROLLBACK 0xC take no queue offset;
# COMMIT 0x8 does.
TRANSACTION_TYPE_BITS = 0xC
NO_OFFSET_TYPES = (0x4, 0xC)
# SendMessageRequestHeaderV2's fields, as a Java producer fills them.
SEND_FIELDS = tuple("abcdefghijklm")
PULL_FIELDS = (
    "consumerGroup",
    "topic",
    "queueId",
    "queueOffset",
    "maxMsgNums",
    "sysFlag",
    "commitOffset",
    "suspendTimeoutMillis",
    "subscription",
    "subVersion",
    "expressionType",
)


def send_header(topic: str, queue_id: int) -> dict[str, str]:
    return {
        "a": "FuzzProducer",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": "0",
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": "UNIQ_KEY\x01fuzz\x02WAIT\x01true\x02TAGS\x01T\x02",
        "j": "0",
        "k": "false",
        "m": "false",
    }


def base_requests() -> list[RemotingCommand]:
    heartbeat = {
        "clientID": "127.0.0.1@fuzz",
        "producerDataSet": [{"groupName": "FuzzProducer"}],
        "consumerDataSet": [
            {
                "groupName": "FuzzConsumer",
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [
                    {"topic": FRAMES_TOPIC, "subString": "*", "tagsSet": [], "codeSet": []}
                ],
                "unitMode": False,
            }
        ],
    }
    pull = {
        "consumerGroup": "FuzzConsumer",
        "topic": FRAMES_TOPIC,
        "queueId": "0",
        "queueOffset": "0",
        "maxMsgNums": "32",
        "sysFlag": "4",
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
        "subVersion": "0",
        "expressionType": "TAG",
    }
    return [
        RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": FRAMES_TOPIC}, opaque=1),
        RemotingCommand(
            RequestCode.SEND_MESSAGE_V2, send_header(FRAMES_TOPIC, 1), b"fuzz body", opaque=2
        ),
        RemotingCommand(RequestCode.PULL_MESSAGE, pull, opaque=3),
        RemotingCommand(RequestCode.HEART_BEAT, {}, json.dumps(heartbeat).encode(), opaque=4),
    ]


# -- mutations --------------------------------------------------------------------------------


def _members(cmd: RemotingCommand, ext: dict[str, str] | None = None) -> list[list]:
    """The JSON header of ``cmd`` as [key, value text] pairs; ``ext`` holds value *texts*."""
    if ext is None:
        ext = {k: json.dumps(v) for k, v in cmd.ext_fields.items()}
    return [
        ["code", str(cmd.code)],
        ["language", '"JAVA"'],
        ["version", "399"],
        ["opaque", str(cmd.opaque)],
        ["flag", str(cmd.flag)],
        ["extFields", json_object(list(ext.items()))],
        ["serializeTypeCurrentRPC", '"JSON"'],
    ]


def _json(members: list[list], body: bytes) -> bytes:
    text = json_object([tuple(m) for m in members])
    return frame(text.encode("utf-8", "surrogatepass"), body)


def _flip_bits(rng: random.Random, data: bytes, start: int = 0) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(start, len(buf)) if len(buf) > start else 0
        if buf:
            buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)


def mutate(rng: random.Random, cmd: RemotingCommand) -> tuple[str, bytes]:  # noqa: C901
    """One malformed frame made from ``cmd``, and the name of the mutation."""
    sound = encode(cmd)
    kind = rng.randrange(14)
    if kind == 0:
        return "bit flips", _flip_bits(rng, sound)
    if kind == 1:
        return "header bit flips", _flip_bits(rng, sound, 8)
    if kind == 2:
        return "truncated", sound[: rng.randrange(len(sound))]
    if kind == 3:
        lie = rng.choice(
            [*LYING_LENGTHS, len(sound) - 4 + rng.randint(-8, 8), rng.randint(-(2**31), 2**31 - 1)]
        )
        return "length lie", struct.pack(">i", lie) + sound[4:]
    if kind == 4:
        header_len = struct.unpack(">i", sound[4:8])[0] & 0xFFFFFF
        hlen = rng.choice([0, 1, header_len - 1, header_len + 1, 0xFFFFFF, rng.randrange(1 << 24)])
        stype = rng.choice([0, 0, 1, 2, 127, 128, 255])
        field = struct.pack(">I", (stype << 24) | (hlen & 0xFFFFFF))
        return "header length/type lie", sound[:4] + field + sound[8:]
    if kind == 5:  # one top-level header field gets any JSON value
        members = _members(cmd)
        i = rng.randrange(len(members))
        members[i][1] = (
            rng.choice(NUMBER_LITERALS) if rng.random() < 0.5 else random_json_value(rng)
        )
        return f"field {members[i][0]}", _json(members, cmd.body)
    if kind in (6, 7):  # the request's known ext fields get values Java never sends
        ext = {k: json.dumps(v) for k, v in cmd.ext_fields.items()}
        names = list(ext) or ["topic"]
        for name in rng.sample(names, rng.randint(1, min(3, len(names)))):
            if rng.random() < 0.25:
                ext[name] = random_json_value(rng)  # not even a string
            else:
                value = random_ext_value(rng)
                if value is None:
                    ext.pop(name, None)
                else:
                    ext[name] = json.dumps(value)
        return "ext fields", _json(_members(cmd, ext), cmd.body)
    if kind == 8:
        raw = json_object([tuple(m) for m in _members(cmd)]).encode()
        at = rng.randrange(len(raw))
        return "invalid utf-8", frame(raw[:at] + rng.choice(BAD_UTF8) + raw[at:], cmd.body)
    if kind == 9:
        return "garbage", rng.randbytes(rng.randrange(64))
    if kind == 10:
        members = _members(cmd)
        nest = deep_nesting(rng.randint(500, 10_000), rng.choice("[{m"), rng.random() < 0.8)
        where = rng.choice(["header", "field", "ext"])
        if where == "header":
            return "deep header", frame(nest.encode(), cmd.body)
        if where == "field":
            members[rng.randrange(len(members))][1] = nest
        else:
            ext = {k: json.dumps(v) for k, v in cmd.ext_fields.items()}
            ext[rng.choice([*ext, "x"])] = nest
            members = _members(cmd, ext)
        return f"deep {where}", _json(members, cmd.body)
    if kind == 11:  # the binary form with lying lengths
        ext = [(k.encode(), v.encode()) for k, v in cmd.ext_fields.items()]
        lies = [(None, None)] * len(ext)
        if ext and rng.random() < 0.5:
            lies[rng.randrange(len(ext))] = (
                rng.choice([None, -1, 200, -32768]),
                rng.choice([None, -1, 1 << 20, -(2**31)]),
            )
        header = binary_header(
            code=cmd.code,
            opaque=cmd.opaque,
            language=rng.choice([0, 0, 12, 99, 255]),
            remark=rng.choice([None, b"r", rng.choice(BAD_UTF8)]),
            remark_len=rng.choice([None, None, -1, 1000, 2**31 - 1]),
            ext=ext,
            ext_len=rng.choice([None, None, -1, 3, 1 << 20]),
            entry_lens=lies,
        )
        return "binary lies", frame(header, cmd.body, serialize_type=1)
    if kind == 12:  # a body that is not what the request carries
        body = rng.choice(
            [
                rng.randbytes(rng.randrange(64)),
                random_json_value(rng).encode("utf-8", "surrogatepass"),
                b"",
                b"{" * 5000,
            ]
        )
        return "body", _json(_members(cmd), body)
    # a malformed frame between sound ones
    _, bad = mutate(rng, cmd)
    return "sandwich", sound + bad + sound


def ha_garbage(rng: random.Random) -> tuple[str, bytes]:
    kind = rng.randrange(4)
    if kind == 0:
        return "ha garbage", rng.randbytes(rng.randrange(64))
    offsets = [rng.choice([0, -1, 2**63 - 1, -(2**63), 1, 1 << 40]) for _ in range(3)]
    data = b"".join(struct.pack(">q", o) for o in offsets)
    if kind == 1:
        return "ha offsets", data
    if kind == 2:
        return "ha offsets cut", data[: rng.randrange(len(data))]
    return "ha random offsets", struct.pack(">q", rng.randrange(0, 1 << 30))


# -- talking to the servers -------------------------------------------------------------------


def check_output(name: str, data: bytes) -> list[RemotingCommand]:
    """What a remoting server wrote back must be well-formed responses with known codes."""
    try:
        cmds = FrameDecoder().feed(data)
    except ProtocolError as exc:
        raise AssertionError(f"{name} wrote a malformed frame: {exc}: {data[:200]!r}") from None
    for cmd in cmds:
        if not cmd.is_response:  # the broker tells a consumer's connection of group changes
            assert cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, f"{name} wrote {cmd}"
            assert cmd.is_oneway, cmd
            continue
        assert cmd.code in KNOWN_CODES, f"{name} answered with unknown code {cmd.code}: {cmd}"
    return cmds


async def send_case(port: int, data: bytes, prefix: RemotingCommand | None) -> bytes:
    """Connect, make the valid ``prefix`` request (checking its answer), send ``data``, then end
    our side; returns what the server wrote after ``data`` until it closed."""
    out = bytearray()
    with trio.fail_after(CASE_TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            try:
                if prefix is not None:
                    await stream.send_all(encode(prefix))
                    decoder, got = FrameDecoder(), []
                    while not got:
                        chunk = await stream.receive_some(65536)
                        assert chunk, "closed before answering a valid request"
                        got = decoder.feed(chunk)
                    assert got[0].opaque == prefix.opaque and got[0].is_response
                await stream.send_all(data)
                await stream.send_eof()
                while chunk := await stream.receive_some(65536):
                    out += chunk
            except trio.BrokenResourceError:
                pass  # the server closed first (e.g. a protocol error): fine
    return bytes(out)


async def create_topic(cluster: Cluster, topic: str) -> None:
    await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])


async def health_check(cluster: Cluster, client, producer: Producer, puller: PullConsumer) -> None:
    """Both servers still serve: a route lookup, and a message sent and pulled back."""
    with trio.fail_after(30):
        route = await client.invoke(
            cluster.namesrv_addr,
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": FRAMES_TOPIC}),
        )
        assert route.code == ResponseCode.SUCCESS, route
        assert cluster.broker_addr in route.body.decode()
        body = f"health {time.perf_counter_ns()}".encode()
        mq = MessageQueue(FRAMES_TOPIC, "broker-a", 3)
        result = await producer.send(Message(FRAMES_TOPIC, body), queue=mq)
        assert result.status == "SEND_OK", result
        await cluster.broker.store.reput.do_reput()
        pulled = await puller.pull(mq, "*", result.queue_offset, 1)
        assert [m.body for m in pulled.messages] == [body], pulled
        # The fast port serves too.
        fast = f"127.0.0.1:{cluster.broker.fast_server.port}"
        answer = await client.invoke(
            fast,
            RemotingCommand.request(
                RequestCode.GET_MAX_OFFSET, {"topic": FRAMES_TOPIC, "queueId": 3}
            ),
        )
        assert answer.code == ResponseCode.SUCCESS and int(answer.ext_fields["offset"]) > 0


def _targets(cluster: Cluster) -> list[tuple[str, int]]:
    broker = cluster.broker
    targets = [("namesrv", cluster.namesrv.port), ("broker", broker.port)]
    if broker.fast_server.port:
        targets.append(("broker-fast", broker.fast_server.port))
    if broker.ha_service is not None and broker.ha_service.port:
        targets.append(("ha", broker.ha_service.port))
    return targets


@pytest.fixture
def fuzz_report():
    """Prints the seed whatever the outcome (and the last case, set by the test, on failure)."""
    state: dict[str, object] = {"case": None}
    yield state
    print(f"\nPYMQ_FUZZ_SEED={SEED} {state.get('summary', '')}")
    if state.get("case") is not None and not state.get("done"):
        print(f"last case: {state['case']}")


@pytest.mark.slow
async def test_servers_survive_malformed_frames(tmp_path, fuzz_report) -> None:
    rng = random.Random(SEED)
    bases = base_requests()
    counts: dict[str, int] = {}
    async with (
        open_cluster(
            str(tmp_path),
            namesrv_port=0,
            broker_port=0,
            bind_address="127.0.0.1",
            properties=dict(TEST_PROPERTIES),
        ) as cluster,
        open_remoting_client() as client,
    ):
        await create_topic(cluster, FRAMES_TOPIC)
        targets = _targets(cluster)
        assert {name for name, _ in targets} >= {"namesrv", "broker", "broker-fast", "ha"}
        async with (
            Producer("FuzzHealthP", cluster.namesrv_addr) as producer,
            PullConsumer("FuzzHealthC", cluster.namesrv_addr) as puller,
        ):
            await health_check(cluster, client, producer, puller)
            start = time.perf_counter()
            done = 0
            while done < CASES and time.perf_counter() - start < TIME_BUDGET:
                name, port = targets[rng.randrange(len(targets))]
                prefix = None
                if name == "ha":
                    kind, data = ha_garbage(rng)
                else:
                    base = bases[rng.randrange(len(bases))]
                    kind, data = mutate(rng, base)
                    if rng.random() < 0.2:
                        prefix = bases[0] if name == "namesrv" else bases[3]
                fuzz_report["case"] = (
                    f"#{done} {name} {kind}{' after a valid request' if prefix else ''}: "
                    f"{data[:600]!r}{'...' if len(data) > 600 else ''} ({len(data)} bytes)"
                )
                output = await send_case(port, data, prefix)
                if name != "ha":
                    check_output(name, output)
                counts[kind] = counts.get(kind, 0) + 1
                done += 1
                if done % CHECK_EVERY == 0:
                    await health_check(cluster, client, producer, puller)
            elapsed = time.perf_counter() - start
            await health_check(cluster, client, producer, puller)
            fuzz_report["done"] = True
            fuzz_report["summary"] = (
                f"socket fuzz: {done} cases in {elapsed:.1f} s ({done / elapsed:.0f}/s) {counts}"
            )
    assert done >= min(CASES, 50)


# -- refused sends take no offset -------------------------------------------------------------


async def pull_offsets(client, addr: str, topic: str, queue_id: int, start: int, end: int) -> list:
    offsets: list[int] = []
    offset = start
    while offset < end:
        request = RemotingCommand.request(
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": "FuzzChecker",
                "topic": topic,
                "queueId": queue_id,
                "queueOffset": offset,
                "maxMsgNums": 32,
                "sysFlag": 4,
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": "*",
                "subVersion": 0,
                "expressionType": "TAG",
            },
        )
        response = await client.invoke(addr, request, 10)
        if response.code != ResponseCode.SUCCESS:
            break
        got = [m.queue_offset for m in decode_records(response.body)]
        if not got:
            break
        offsets += got
        offset = max(int(response.ext_fields["nextBeginOffset"]), offset + 1)
    return offsets


async def test_mutated_sends_answer_known_codes_and_refusals_take_no_offset(
    tmp_path, fuzz_report
) -> None:
    rng = random.Random(SEED + 1)
    acked: dict[tuple[str, int], list[int]] = {}
    changed_fields: dict[tuple[str, int, int], dict] = {}  # (topic, queue, offset): mutations
    codes: dict[int, int] = {}
    async with (
        open_cluster(
            str(tmp_path),
            namesrv_port=0,
            broker_port=0,
            bind_address="127.0.0.1",
            properties=dict(TEST_PROPERTIES),
        ) as cluster,
        open_remoting_client() as client,
    ):
        for topic in SEND_TOPICS:
            await create_topic(cluster, topic)
        addr = cluster.broker_addr
        start = time.perf_counter()
        done = 0
        while done < SEND_CASES and time.perf_counter() - start < TIME_BUDGET:
            topic = rng.choice(SEND_TOPICS)
            header = send_header(topic, rng.randrange(4))
            sound = dict(header)
            for name in rng.sample(SEND_FIELDS, rng.randint(0, 3)):
                if name == "b" and rng.random() < 0.8:
                    continue  # the topic stays one of ours, mostly
                value = random_ext_value(rng)
                if value is None:
                    header.pop(name, None)
                else:
                    header[name] = value
            body = rng.choice([b"m", rng.randbytes(rng.randrange(1, 100)), b""])
            request = RemotingCommand(RequestCode.SEND_MESSAGE_V2, header, body)
            fuzz_report["case"] = f"#{done} SEND_MESSAGE_V2 {header!r} body {body!r}"
            response = await client.invoke(addr, request, CASE_TIMEOUT)
            codes[response.code] = codes.get(response.code, 0) + 1
            assert response.code in KNOWN_CODES, f"unknown response code: {response}"
            try:
                sys_flag = int(header.get("f") or 0)
            except ValueError:
                sys_flag = 0
            # A transaction's prepared or rollback half takes no queue offset (acked at 0), as
            # in RocketMQ: it is not counted.
            if (
                response.code == ResponseCode.SUCCESS
                and sys_flag & TRANSACTION_TYPE_BITS not in NO_OFFSET_TYPES
            ):
                ext = response.ext_fields
                key = (header.get("b", ""), int(ext["queueId"]))
                acked.setdefault(key, []).append(int(ext["queueOffset"]))
                changes = {
                    k: None if header.get(k) is None else header[k][:40]
                    for k in SEND_FIELDS
                    if header.get(k) != sound.get(k)
                }
                if changes:
                    changed_fields[(*key, int(ext["queueOffset"]))] = changes
            done += 1
        elapsed = time.perf_counter() - start
        fuzz_report["case"] = "checking the queues"

        await cluster.broker.store.reput.do_reput()
        store = cluster.broker.store
        holes = []
        for topic, config in sorted(cluster.broker.topic_config_manager.table.items()):
            for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
                low = store.get_min_offset_in_queue(topic, queue_id)
                high = store.get_max_offset_in_queue(topic, queue_id)
                if high <= low:
                    continue
                got = await pull_offsets(client, addr, topic, queue_id, low, high)
                if sorted(got) != list(range(low, high)):
                    missing = sorted(set(range(low, high)) - set(got))
                    holes.append(f"{topic}/{queue_id} [{low}, {high}) misses {missing[:10]}")
                ack = sorted(acked.get((topic, queue_id), []))
                if topic in SEND_TOPICS and ack != list(range(low, high)):
                    odd = sorted(
                        set(range(low, high)).symmetric_difference(ack)
                        | {o for o in ack if ack.count(o) > 1}
                    )
                    holes.append(
                        f"{topic}/{queue_id}: {len(ack)} SEND_OK for queue [{low}, {high}); "
                        f"offsets acked not once: {odd[:10]}; mutated sends acked around them: "
                        + repr(
                            {
                                o: changed_fields.get((topic, queue_id, o))
                                for o in range(min(odd) - 1, max(odd) + 2)
                                if (topic, queue_id, o) in changed_fields
                            }
                            if odd
                            else {}
                        )[:1500]
                    )
        fuzz_report["done"] = not holes
        fuzz_report["summary"] = (
            f"send fuzz: {done} sends in {elapsed:.1f} s ({done / elapsed:.0f}/s), codes {codes}"
        )
        assert not holes, "queues with holes (a refused send took an offset?):\n" + "\n".join(holes)
        assert codes.get(ResponseCode.SUCCESS, 0) > 0  # the mutations left some sends sound
