#!/usr/bin/env python3
"""The real C++ RocketMQ client (PyPI rocketmq==0.4.4) sending timer messages: RocketMQ 5's
TIMER_DELAY_MS / TIMER_DELAY_SEC / TIMER_DELIVER_MS set as user properties (the 4.x client
knows nothing of timers; the broker reads the properties).

Usage: python cpp_client_timer.py --namesrv HOST:PORT --topic T --deliver-ms EPOCH_MS
Sends four messages synchronously, bodies ``ms``, ``sec``, ``at`` and ``plain`` (1.5 s, 2 s and
at --deliver-ms, and none), and prints ``SENT <body> <status> <epoch ms before the send>`` per
message, then ``DONE``.  Exit status 0, or 2 when the client could not start or a send failed.
"""

import argparse
import sys
import time
import uuid

from rocketmq.client import Message, Producer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--deliver-ms", required=True)
    args = ap.parse_args()
    producer = Producer("PG_TIMER_" + uuid.uuid4().hex[:8])
    producer.set_namesrv_addr(args.namesrv)
    try:
        producer.start()
    except Exception as exc:
        print(f"START FAILED {exc}")
        return 2
    try:
        for body, key, value in (
            ("ms", "TIMER_DELAY_MS", "1500"),
            ("sec", "TIMER_DELAY_SEC", "2"),
            ("at", "TIMER_DELIVER_MS", args.deliver_ms),
            ("plain", None, None),
        ):
            msg = Message(args.topic)
            msg.set_keys("TIMERKEY_" + body)
            msg.set_tags("TagTimer")
            msg.set_body(body)
            if key is not None:
                msg.set_property(key, value)
            before = int(time.time() * 1000)
            try:
                result = producer.send_sync(msg)
            except Exception as exc:
                print("FAILED " + " ".join(str(exc).split()))
                return 2
            print(f"SENT {body} {result.status} {before}", flush=True)
        print("DONE")
        return 0
    finally:
        producer.shutdown()


if __name__ == "__main__":
    sys.exit(main())
