"""The transactions view: the admin channel's ``transactions.status`` stream and
``pymq-admin transactionStatus`` (issue #13)."""

from __future__ import annotations

import json

from pymq.client import LocalTransactionState, Message, TransactionProducer
from pymq.embedded import Cluster
from tests.admin.helpers import AdminClient
from tests.helpers import pymq_admin, wait_until

OUTCOMES = [
    ("TxA", b"commit", LocalTransactionState.COMMIT_MESSAGE),
    ("TxA", b"rollback", LocalTransactionState.ROLLBACK_MESSAGE),
    ("TxA", b"unknown-a", LocalTransactionState.UNKNOW),
    ("TxB", b"unknown-b", LocalTransactionState.UNKNOW),
]


async def run_transactions(cluster: Cluster) -> None:
    states = {body: state for _topic, body, state in OUTCOMES}
    async with TransactionProducer(
        "PG_ADMIN",
        cluster.namesrv_addr,
        execute=lambda msg, arg: states[msg.body],
        check=lambda msg: LocalTransactionState.UNKNOW,
    ) as producer:
        for topic, body, _state in OUTCOMES:
            await producer.send_in_transaction(Message(topic, body))
    store = cluster.broker.store
    await wait_until(lambda: store.get_max_offset_in_queue("RMQ_SYS_TRANS_OP_HALF_TOPIC", 0) == 2)


async def test_transactions_stream_pushes_waiting_half_messages(
    admin_cluster: Cluster, admin: AdminClient
) -> None:
    sub = await admin.call("subscribe", stream="transactions.status", interval=0.2)
    sid = sub["subscription"]
    first = await admin.next_event(sid)
    assert first["pendingTotal"] == 0 and first["halfMaxOffset"] == 0
    assert first["checkService"] is True and first["transactionCheckMax"] == 15
    await run_transactions(admin_cluster)
    while True:
        data = await admin.next_event(sid)
        if data["unknown"] == 2:
            break
    assert data["pendingByTopic"] == {"TxA": 1, "TxB": 1} and data["pendingTotal"] == 2
    assert (data["committed"], data["rolledBack"]) == (1, 1)
    assert (data["halfMaxOffset"], data["opMaxOffset"]) == (4, 2)
    assert data["pendingTruncated"] is False


async def admin_json(*args: str) -> dict:
    code, out, err = await pymq_admin(*args, "--json")
    assert code == 0, err
    return json.loads(out)


async def test_transaction_status_subcommand(admin_cluster: Cluster) -> None:
    await run_transactions(admin_cluster)
    addr = admin_cluster.broker_addr
    before = (await admin_json("transactionStatus", "-b", addr))[addr]
    assert (before["halfMaxOffset"], before["halfCheckOffset"]) == (4, 0)
    assert (before["opMaxOffset"], before["opCheckOffset"]) == (2, 0)
    assert before["uncheckedByTopic"] == {"TxA": 3, "TxB": 1}
    # A round passes the two ended half messages and stops at the first young one.
    await admin_cluster.broker.transactions.check()
    after = (await admin_json("transactionStatus", "-b", addr, "-t", "TxB"))[addr]
    assert (after["halfCheckOffset"], after["opCheckOffset"]) == (2, 2)
    assert after["uncheckedByTopic"] == {"TxB": 1} and after["discarded"] == 0
