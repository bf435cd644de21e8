#!/usr/bin/env python3
"""The real C++ RocketMQ client (PyPI rocketmq==0.4.4) sending with ACL session credentials.

Usage: python cpp_client_acl.py --namesrv HOST:PORT --topic T [--access-key AK --secret-key SK]
Sends one message synchronously (the producer's group is unique per run) and prints one line:
``SENT <status>`` when the broker stored it, ``REFUSED <the client's error text>`` otherwise.
Exit status 0 either way; 2 when the client could not start.
"""

import argparse
import sys
import uuid

from rocketmq.client import Message, Producer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--access-key")
    ap.add_argument("--secret-key")
    args = ap.parse_args()
    producer = Producer("PG_ACL_" + uuid.uuid4().hex[:8])
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        producer.set_session_credentials(args.access_key, args.secret_key, "ALIYUN")
    try:
        producer.start()
    except Exception as exc:
        print(f"START FAILED {exc}")
        return 2
    try:
        msg = Message(args.topic)
        msg.set_tags("TagAcl")
        msg.set_keys("ACLKEY")
        msg.set_body("acl body")
        try:
            result = producer.send_sync(msg)
        except Exception as exc:
            print("REFUSED " + " ".join(str(exc).split()))
            return 0
        print(f"SENT {result.status}")
        return 0
    finally:
        producer.shutdown()


if __name__ == "__main__":
    sys.exit(main())
