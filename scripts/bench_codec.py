"""Request-header decode benchmark: nanoseconds per typical request header, by path.

Times, on this machine, the decoding of the JSON headers Java and C++ clients send (a
SEND_MESSAGE_V2, a PULL_MESSAGE, a HEARTBEAT) through each tier of ``pymq.remoting.codec``:

- ``frame``: ``decode_frame`` of the whole request frame (the path every request takes:
  the C reader when built, else orjson and the Python fast path);
- ``json``: ``_json_loads`` + ``_checked_command``, the reference path a header that is not
  plain takes (and the one every field check lives in);
- ``checked``: ``_checked_command`` alone on the parsed header.

Prints the best of ``--repeat`` timings of ``--number`` calls each, per header and path.  Run
it with ``PYMQ_PURE_PYTHON=1`` for the pure-Python tiers.

    python scripts/bench_codec.py [--number N] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import struct
import timeit

from pymq.remoting.codec import _checked_command, _json_loads, decode_frame

HEADERS: dict[str, dict[str, object]] = {
    # SendMessageRequestHeaderV2 as the Java client writes it (single-letter keys).
    "send_v2 (Java)": {
        "code": 310, "extFields": {
            "a": "ProducerGroup", "b": "BenchTopic", "c": "TBW102", "d": "4", "e": "3",
            "f": "0", "g": "1700000000000", "h": "0", "i": "KEYS\x01order-1\x02TAGS\x01TagA"
            "\x02UNIQ_KEY\x017F0000010001000000000000000000000001\x02WAIT\x01true\x02",
            "j": "0", "k": "false", "m": "false",
        }, "flag": 0, "language": "JAVA", "opaque": 12345, "serializeTypeCurrentRPC": "JSON",
        "version": 395,
    },
    # The C++ client's send: numbers and booleans in extFields.
    "send_v2 (C++)": {
        "code": 310, "extFields": {
            "a": "ProducerGroup", "b": "BenchTopic", "c": "TBW102", "d": 4, "e": 3, "f": 0,
            "g": 1700000000000, "h": 0, "i": "TAGS\x01TagA\x02", "j": 0, "k": False,
        }, "flag": 0, "language": "CPP", "opaque": 12345, "version": 395,
    },
    "pull (Java)": {
        "code": 11, "extFields": {
            "commitOffset": "0", "consumerGroup": "ConsumerGroup", "expressionType": "TAG",
            "maxMsgNums": "32", "queueId": "3", "queueOffset": "1024", "subVersion": "0",
            "suspendTimeoutMillis": "15000", "sysFlag": "2", "topic": "BenchTopic",
        }, "flag": 0, "language": "JAVA", "opaque": 777, "version": 395,
    },
    "heartbeat (Java, no extFields)": {
        "code": 34, "flag": 0, "language": "JAVA", "opaque": 9, "version": 395,
    },
}  # fmt: skip


def frame(header: dict[str, object], body: bytes) -> bytes:
    data = json.dumps(header).encode()
    return struct.pack(">i", len(data)) + data + body


def main(args: argparse.Namespace) -> None:
    print(f"best of {args.repeat} x {args.number} calls, ns per call")
    print(f"{'header':34} {'frame':>8} {'json':>8} {'checked':>8}")
    for name, header in HEADERS.items():
        data = json.dumps(header).encode()
        whole = frame(header, b"x" * 1024)
        cases = {
            "frame": lambda whole=whole: decode_frame(whole),
            "json": lambda data=data: _checked_command(_json_loads(data)),
            "checked": lambda header=header: _checked_command(header),
        }
        row = []
        for call in cases.values():
            best = min(timeit.repeat(call, number=args.number, repeat=args.repeat))
            row.append(best / args.number * 1e9)
        print(f"{name:34} " + " ".join(f"{ns:8.0f}" for ns in row))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    main(parser.parse_args())
