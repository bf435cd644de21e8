"""DLedger 0.2.6's peer protocol: codes, and bodies exactly as Java's fastjson writes them
(JAVA_BODIES: the output of tests/conformance/java/DLedgerJsonSamples.java, which
tests/conformance/test_java_dledger_json.py checks against a Java build)."""

from __future__ import annotations

import pytest

from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.protocol import (
    MAX_BATCH_ENTRIES,
    RESPONSES,
    AppendEntryRequest,
    AppendEntryResponse,
    EntryTexts,
    GetEntriesRequest,
    GetEntriesResponse,
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
    ProtocolError,
    PullEntriesRequest,
    PullEntriesResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    RequestCode,
    VoteRequest,
    VoteResponse,
    VoteResult,
    decode,
    decode_request,
    encode,
)
from pymq.dledger.store import DLedgerEntry

ENTRY = DLedgerEntry(index=4, term=2, body=bytes([1, 2, 3, 255]), pos=1000)

# (what pymq builds, what Java 0.2.6 + fastjson 1.2.69 wrote for the same object)
JAVA_BODIES: list[tuple[Message, str]] = [
    (
        VoteRequest(
            group="g",
            leader_id="n1",
            remote_id="n0",
            term=3,
            ledger_end_index=10,
            ledger_end_term=2,
        ),
        '{"code":200,"group":"g","leaderId":"n1","ledgerEndIndex":10,"ledgerEndTerm":2,'
        '"remoteId":"n0","term":3}',
    ),
    (
        VoteResponse(
            group="g",
            leader_id="n1",
            remote_id="n0",
            term=3,
            vote_result=VoteResult.REJECT_TERM_NOT_READY,
        ),
        '{"code":200,"group":"g","leaderId":"n1","remoteId":"n0","term":3,'
        '"voteResult":"REJECT_TERM_NOT_READY"}',
    ),
    (VoteResponse(), '{"code":200,"term":-1,"voteResult":"UNKNOWN"}'),
    (
        HeartBeatRequest(group="g", local_id="n0", remote_id="n1", leader_id="n0", term=5),
        '{"code":200,"group":"g","leaderId":"n0","localId":"n0","remoteId":"n1","term":5}',
    ),
    (HeartBeatResponse(), '{"code":200,"term":-1}'),
    (HeartBeatResponse(term=7, code=403), '{"code":403,"term":7}'),
    (
        AppendEntryRequest(group="g", remote_id="n0", body=b"hi\x00"),
        '{"body":"aGkA","code":200,"group":"g","remoteId":"n0","term":-1}',
    ),
    (
        AppendEntryResponse(group="g", index=4, pos=1000, term=2, leader_id="n0"),
        '{"code":200,"group":"g","index":4,"leaderId":"n0","pos":1000,"term":2}',
    ),
    (
        PushEntryRequest(
            group="g",
            remote_id="n1",
            leader_id="n0",
            term=2,
            entry=ENTRY,
            type=PushType.APPEND,
            commit_index=3,
        ),
        '{"batch":false,"batchEntry":[],"code":200,"commitIndex":3,"count":1,"entry":'
        '{"body":"AQID/w==","bodyCrc":0,"chainCrc":0,"channel":0,"index":4,"magic":1,'
        '"pos":1000,"size":52,"term":2},"firstEntryIndex":4,"group":"g","lastEntryIndex":4,'
        '"leaderId":"n0","remoteId":"n1","term":2,"totalSize":0,"type":"APPEND"}',
    ),
    (
        PushEntryRequest(
            group="g", remote_id="n1", leader_id="n0", term=2, type=PushType.COMMIT, commit_index=3
        ),
        '{"batch":false,"batchEntry":[],"code":200,"commitIndex":3,"count":0,'
        '"firstEntryIndex":-1,"group":"g","lastEntryIndex":-1,"leaderId":"n0","remoteId":"n1",'
        '"term":2,"totalSize":0,"type":"COMMIT"}',
    ),
    (
        PushEntryRequest(group="g", term=2, batch_entry=[ENTRY]),
        '{"batch":true,"batchEntry":[{"body":"AQID/w==","bodyCrc":0,"chainCrc":0,"channel":0,'
        '"index":4,"magic":1,"pos":1000,"size":52,"term":2}],"code":200,"commitIndex":-1,'
        '"count":1,"firstEntryIndex":4,"group":"g","lastEntryIndex":4,"term":2,"totalSize":52,'
        '"type":"APPEND"}',
    ),
    (
        PushEntryResponse(group="g", term=2, index=4, begin_index=0, end_index=4, count=1),
        '{"beginIndex":0,"code":200,"count":1,"endIndex":4,"group":"g","index":4,"term":2}',
    ),
    (PushEntryResponse(), '{"beginIndex":0,"code":200,"count":0,"endIndex":0,"term":-1}'),
    (
        MetadataResponse(
            peers={"n0": "127.0.0.1:1", "n1": "127.0.0.1:2"}, leader_id="n0", group="g"
        ),
        '{"code":200,"group":"g","leaderId":"n0","peers":{"n0":"127.0.0.1:1",'
        '"n1":"127.0.0.1:2"},"term":-1}',
    ),
    (MetadataRequest(), '{"code":200,"term":-1}'),
    (
        GetEntriesRequest(group="g", begin_index=5, max_size=10, index_list=[1, 2]),
        '{"beginIndex":5,"code":200,"group":"g","indexList":[1,2],"maxSize":10,"term":-1}',
    ),
    (
        GetEntriesResponse(entries=[ENTRY]),
        '{"code":200,"entries":[{"body":"AQID/w==","bodyCrc":0,"chainCrc":0,"channel":0,'
        '"index":4,"magic":1,"pos":1000,"size":52,"term":2}],"term":-1}',
    ),
    (
        PullEntriesRequest(node_id="n1", begin_index=3, group="g"),
        '{"beginIndex":3,"code":200,"group":"g","nodeId":"n1","term":-1}',
    ),
    (PullEntriesResponse(), '{"code":200,"entries":[],"term":-1}'),
    (
        LeadershipTransferRequest(
            group="g", transfer_id="n0", transferee_id="n1", take_leadership_ledger_index=9, term=2
        ),
        '{"code":200,"group":"g","takeLeadershipLedgerIndex":9,"term":2,"transferId":"n0",'
        '"transfereeId":"n1"}',
    ),
    (LeadershipTransferResponse(term=2, code=200), '{"code":200,"term":2}'),
]


def test_the_codes_are_dledger_026s() -> None:
    assert {c.name: c.value for c in RequestCode} == {
        "UNKNOWN": -1,
        "METADATA": 50000,
        "APPEND": 50001,
        "GET": 50002,
        "VOTE": 51001,
        "HEART_BEAT": 51002,
        "PULL": 51003,
        "PUSH": 51004,
        "LEADERSHIP_TRANSFER": 51005,
    }
    assert ResponseCode.SUCCESS == 200 and ResponseCode.TIMEOUT == 300
    assert ResponseCode.UNKNOWN_GROUP == 400 and ResponseCode.TERM_NOT_READY == 416
    assert ResponseCode.REQUEST_WITH_EMPTY_BODYS == 420 and ResponseCode.INTERNAL_ERROR == 500
    assert ResponseCode.LEADER_TRANSFERRING == 506
    assert len(ResponseCode) == 34
    assert ResponseCode.of(999) is ResponseCode.UNKNOWN
    assert [r.name for r in VoteResult][:3] == ["UNKNOWN", "ACCEPT", "REJECT_UNKNOWN_LEADER"]
    assert len(VoteResult) == 12
    assert set(RESPONSES) == set(RequestCode) - {RequestCode.UNKNOWN}


@pytest.mark.parametrize(("message", "java"), JAVA_BODIES)
def test_bodies_are_written_and_read_as_java_writes_them(message, java) -> None:
    assert encode(message).decode() == java
    assert encode(message, EntryTexts()).decode() == java  # a leader's pushes: the same bytes
    assert decode(type(message), java.encode()) == message


def test_a_request_is_decoded_by_its_code() -> None:
    body = JAVA_BODIES[0][1].encode()
    assert decode_request(RequestCode.VOTE, body) == JAVA_BODIES[0][0]
    for code in (RequestCode.UNKNOWN, 10, 51006):
        with pytest.raises(ProtocolError, match="not DLedger's"):
            decode_request(code, body)


def test_unknown_fields_and_derived_getters_are_ignored_nulls_keep_defaults() -> None:
    got = decode(VoteResponse, b'{"term":3,"voteResult":"ACCEPT","extra":{"x":[1]},"group":null}')
    assert got == VoteResponse(term=3, vote_result=VoteResult.ACCEPT)
    push = decode(PushEntryRequest, b'{"count":7,"firstEntryIndex":9,"batch":true,"term":1}')
    assert push == PushEntryRequest(term=1)


@pytest.mark.parametrize(
    ("cls", "body", "fragment"),
    [
        (VoteRequest, b"", "not JSON"),
        (VoteRequest, b"\xff\xfe", "not JSON"),
        (VoteRequest, b"{", "not JSON"),
        (VoteRequest, b"[1,2]", "expected a JSON object"),
        (VoteRequest, b'"x"', "expected a JSON object"),
        (VoteRequest, b'{"term":"3"}', "term: expected a number"),
        (VoteRequest, b'{"term":true}', "term: expected a number"),
        (VoteRequest, b'{"term":1.5}', "term: expected a number"),
        (VoteRequest, b'{"term":9223372036854775808}', "outside a Java long"),
        (VoteRequest, b'{"code":2147483648}', "outside a Java int"),
        (VoteRequest, b'{"group":7}', "group: expected a string"),
        (VoteResponse, b'{"voteResult":"MAYBE"}', "is none of"),
        (PushEntryRequest, b'{"type":"DELETE"}', "is none of"),
        (AppendEntryRequest, b'{"body":"not base64!"}', "not base64"),
        (PushEntryRequest, b'{"entry":[]}', "expected an entry object"),
        (PushEntryRequest, b'{"entry":{"index":1}}', "entry.body: missing"),
        (PushEntryRequest, b'{"entry":{"body":"AQID","size":99}}', "entry.size"),
        (PushEntryRequest, b'{"entry":{"body":"AQID","pos":"x"}}', "entry.pos"),
        (PushEntryRequest, b'{"batchEntry":{}}', "expected an array"),
        # every field present (the checked-at-once path), one of them out of its range
        (
            PushEntryRequest,
            b'{"entry":{"body":"AQID","size":51,"bodyCrc":0,"chainCrc":0,"channel":0,"index":1,"magic":2147483648,"pos":0,"term":1}}',
            "entry.magic: 2147483648 is outside",
        ),
        (
            PushEntryRequest,
            b'{"entry":{"body":"AQID","size":51,"bodyCrc":0,"chainCrc":0,"channel":0,"index":1,"magic":1,"pos":-9223372036854775809,"term":1}}',
            "entry.pos",
        ),
        (
            PushEntryRequest,
            b'{"entry":{"body":"AQID","size":52,"bodyCrc":0,"chainCrc":0,"channel":0,"index":1,"magic":1,"pos":0,"term":1}}',
            "entry.size: 52",
        ),
        (
            PushEntryRequest,
            b'{"entry":{"body":"AQID","size":51,"bodyCrc":0,"chainCrc":0,"channel":0,"index":1,"magic":1,"pos":0,"term":true}}',
            "entry.term: expected a number",
        ),
        (GetEntriesRequest, b'{"indexList":[1,"2"]}', r"indexList\[1\]"),
        (MetadataResponse, b'{"peers":[1]}', "expected a map"),
        (MetadataResponse, b'{"peers":{"n0":5}}', r"peers\[n0\]"),
        (VoteRequest, b"[" * 100 + b"]" * 100, "not JSON"),
    ],
)
def test_bad_bodies_are_a_clear_protocol_error(cls, body, fragment) -> None:
    with pytest.raises(ProtocolError, match=fragment) as info:
        decode(cls, body)
    assert isinstance(info.value, DLedgerError)
    assert info.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_lists_are_bounded() -> None:
    entry = '{"body":"AQ=="}'
    body = '{"batchEntry":[' + ",".join([entry] * (MAX_BATCH_ENTRIES + 1)) + "]}"
    with pytest.raises(ProtocolError, match="at most"):
        decode(PushEntryRequest, body.encode())
    ok = '{"batchEntry":[' + ",".join([entry] * 3) + "]}"
    assert decode(PushEntryRequest, ok.encode()).count == 3


def test_a_body_nested_past_the_recursion_limit_is_a_protocol_error() -> None:
    """A body with few openings but nested deeper than the C parser recurses is read by
    fastjson's reader, whose nesting limit refuses it: a ProtocolError, not a RecursionError."""
    depth = 3000
    body = b'{"batchEntry":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(ProtocolError):
        decode(PushEntryRequest, body)


def test_a_batch_push_of_the_largest_batch_round_trips() -> None:
    """A batch of MAX_BATCH_ENTRIES entries (each an object: more openings than a vote's)
    decodes to the same entries."""
    entries = [DLedgerEntry(i, 3, b"m%d" % i, pos=100 * i) for i in range(MAX_BATCH_ENTRIES)]
    request = PushEntryRequest(group="g", term=3, leader_id="n0", batch_entry=entries)
    back = decode(PushEntryRequest, encode(request))
    assert [e.same_as(f) for e, f in zip(back.batch_entry, entries, strict=True)] == [True] * len(
        entries
    )
    assert back.first_entry_index == 0 and back.last_entry_index == MAX_BATCH_ENTRIES - 1


def test_a_pushed_entrys_text_is_written_once_for_every_follower() -> None:
    """The leader writes an entry's JSON once (EntryTexts) and splices it into the push to
    each follower: the bytes are encode's, for one entry, a batch, and fields that need
    fastjson's escapes (written by its writer then)."""
    texts = EntryTexts()
    batch = [DLedgerEntry(index=i, term=2, body=bytes(range(i, i + 40)), pos=100 * i)
             for i in range(5, 9)]  # fmt: skip
    pushes = [
        PushEntryRequest(group="g", remote_id=f"n{peer}", leader_id="n0", term=2,
                         batch_entry=batch, commit_index=4)
        for peer in (1, 2)
    ] + [
        PushEntryRequest(group="g", remote_id="n1", leader_id="n0", term=2, entry=batch[0]),
        PushEntryRequest(group='g"\\\u00e9', remote_id="n1", leader_id="n0", term=2, entry=ENTRY),
        PushEntryRequest(group="g", term=2, type=PushType.COMPARE, entry=ENTRY),
        PushEntryRequest(group="g", term=2, type=PushType.COMMIT),
    ]  # fmt: skip
    for push in pushes:
        assert encode(push, texts) == encode(push)
        assert decode(PushEntryRequest, encode(push, texts)) == push
    first = texts.text(batch[0])
    assert texts.text(batch[0]) is first  # written once, reused
    # An index rewritten (a truncated log appended anew) is a new entry: written anew.
    rewritten = DLedgerEntry(index=5, term=3, body=b"other", pos=500)
    assert texts.text(rewritten) is not first
    assert (
        texts.text(rewritten)
        == encode(GetEntriesResponse(entries=[rewritten])).decode()[
            len('{"code":200,"entries":[') : -len('],"term":-1}')
        ]
    )


def test_entry_texts_are_bounded_in_bytes() -> None:
    texts = EntryTexts(limit=1000)
    entries = [DLedgerEntry(index=i, term=1, body=bytes(300), pos=i * 400) for i in range(10)]
    kept = [texts.text(e) for e in entries]
    assert sum(len(t) for t in kept[-2:]) <= 1000 < sum(len(t) for t in kept[-3:])
    assert texts.text(entries[-1]) is kept[-1]  # the newest stay
    assert texts.text(entries[0]) is not kept[0]  # the oldest went (written anew)
    big = DLedgerEntry(index=20, term=1, body=bytes(5000), pos=9000)
    assert texts.text(big) is texts.text(big)  # one over the limit is still kept alone


@pytest.mark.parametrize(
    "text",
    ["", "AQID/w==", "AQID/w=", "AQID/w===", "AQ==AQ==", "=AQI", "AQI", "A", "AQ\\nID", "AQ ID",
     "AQ-_", "AQIDé", "AQID\\u0000", "QUJD", "QUJDRA", "QUJDRA=="],
)  # fmt: skip
def test_base64_bodies_are_taken_and_refused_as_b64decode_validate_does(text: str) -> None:
    """Bodies are read by binascii's strict mode: what b64decode(validate=True) takes."""
    import base64
    import binascii
    import json

    try:
        expected: bytes | None = base64.b64decode(text.encode("utf-8"), validate=True)
    except (binascii.Error, ValueError):
        expected = None
    body = json.dumps({"body": json.loads(f'"{text}"')}).encode()
    if expected is None:
        with pytest.raises(ProtocolError, match="not base64"):
            decode(AppendEntryRequest, body)
    else:
        assert decode(AppendEntryRequest, body).body == expected
