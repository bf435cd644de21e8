"""Pull every queue of a topic from the start with the real C++ client; print each body.

Used by test_ha.py to read from a slave while its master is down (the shared conformance script
sends before it pulls, which a slave refuses).  Usage: cpp_pull.py NAMESRV TOPIC EXPECTED
"""

import sys
import time

from rocketmq.client import PullConsumer


def main() -> int:
    namesrv, topic, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    consumer = PullConsumer(f"CID_HA_PULL_{int(time.time() * 1000)}")
    consumer.set_namesrv_addr(namesrv)
    consumer.start()
    seen = set()
    deadline = time.time() + 60
    try:
        while time.time() < deadline and len(seen) < expected:
            for msg in consumer.pull(topic, "*", 32):
                seen.add(msg.body.decode())
    finally:
        consumer.shutdown()
    for body in sorted(seen):
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
