"""A broker with aclEnable=true, driven by the Python client with and without credentials."""

from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import AsyncIterator

import pytest
import trio
import yaml
from trio_websocket import open_websocket_url

from pymq.acl.plain import sign_request
from pymq.broker.acl import AclManager
from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.client import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    MQClientError,
    Producer,
    PullConsumer,
    PushConsumer,
    topics,
)
from pymq.embedded import ADMIN_ANY_PORT, Cluster, open_cluster
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import MessageStoreConfig
from pymq.testing import TEST_PROPERTIES
from tests.admin.helpers import AdminClient, ws_url
from tests.helpers import make_namesrv, wait_until

ADMIN = ("RocketMQAdmin", "12345678admin")
PRODUCER = ("producerUser", "producerSecret")
CONSUMER = ("consumerUser", "consumerSecret")
ACL = """\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: RocketMQAdmin
    secretKey: 12345678admin
    admin: true
  - accessKey: producerUser
    secretKey: producerSecret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Allowed=PUB]
  - accessKey: consumerUser
    secretKey: consumerSecret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Allowed=SUB]
    groupPerms: [Readers=SUB]
"""


@pytest.fixture
async def acl_cluster(tmp_path: pathlib.Path) -> AsyncIterator[Cluster]:
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "plain_acl.yml").write_text(ACL)
    properties = dict(TEST_PROPERTIES, aclEnable="true", rocketmqHome=str(home))
    async with open_cluster(
        str(tmp_path / "data"),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:
        for topic in ("Allowed", "Denied"):
            await topics.create_topic(
                cluster.namesrv_addr, topic, brokers=[cluster.broker_addr], credentials=ADMIN
            )
        yield cluster


def acl_file(cluster: Cluster) -> pathlib.Path:
    assert cluster.broker.acl is not None
    return cluster.broker.acl.default_file


async def test_acl_is_enforced_for_the_python_producer(acl_cluster: Cluster) -> None:
    namesrv = acl_cluster.namesrv_addr
    async with Producer("P", namesrv, credentials=PRODUCER) as producer:
        result = await producer.send(Message("Allowed", b"hello"))
        assert result.status == "SEND_OK"
        with pytest.raises(MQClientError) as denied:
            await producer.send(Message("Denied", b"no"))
        assert denied.value.code == ResponseCode.SYSTEM_ERROR
        assert "AclException: No default permission for topic:Denied" in denied.value.remark
    async with Producer("P2", namesrv, credentials=(PRODUCER[0], "wrongSecret")) as producer:
        with pytest.raises(MQClientError) as wrong:
            await producer.send(Message("Allowed", b"no"))
        assert "Check signature failed for accessKey=producerUser" in wrong.value.remark
    async with Producer("P3", namesrv) as producer:
        with pytest.raises(MQClientError) as anonymous:
            await producer.send(Message("Allowed", b"no"))
        assert "No accessKey is configured" in anonymous.value.remark
    # A refused request changed nothing: only the first message is stored.
    assert acl_cluster.broker.stats.put_msgs == 1
    # The command-line client, its secret from the environment.
    env = dict(os.environ, PYMQ_SECRET_KEY=PRODUCER[1])
    args = ["-m", "pymq.client", "send", "-n", namesrv, "-t", "Allowed", "-b", "cli"]
    sent = await trio.run_process(
        [sys.executable, *args, "--access-key", PRODUCER[0]],
        env=env,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert sent.returncode == 0 and sent.stdout.startswith(b"SEND_OK"), sent.stderr
    refused = await trio.run_process(
        [sys.executable, *args], capture_stdout=True, capture_stderr=True, check=False
    )
    assert refused.returncode == 1 and b"No accessKey is configured" in refused.stderr


async def test_async_sends_and_batches_are_signed(acl_cluster: Cluster) -> None:
    """send_async and send_batch_async on a signing channel (the request command, not the
    frame path): allowed topics are stored, a denied one reaches the callback refused."""
    got: list[tuple[object, Exception | None]] = []
    arrived = trio.Event()

    def callback(result: object, error: Exception | None) -> None:
        got.append((result, error))
        if len(got) == 4:
            arrived.set()

    async with Producer("P", acl_cluster.namesrv_addr, credentials=PRODUCER) as producer:
        await producer.send_async(Message("Allowed", b"one"), callback)
        await producer.send_batch_async(
            [Message("Allowed", b"b%d" % i) for i in range(3)], callback
        )
        await producer.send_async(Message("Denied", b"no"), callback)
        await producer.send_batch_async([Message("Denied", b"no")], callback)
        with trio.fail_after(10):
            await arrived.wait()
    ok = [r for r, e in got if e is None]
    assert sorted(r.msg_id.count(",") for r in ok) == [0, 2]  # type: ignore[attr-defined]
    refusals = [e for _, e in got if e is not None]
    assert len(refusals) == 2
    assert all("No default permission for topic:Denied" in str(e) for e in refusals)
    assert acl_cluster.broker.stats.put_msgs == 4


async def test_a_transaction_with_credentials_commits(acl_cluster: Cluster) -> None:
    """The half message needs PUB on its topic; the oneway END_TRANSACTION a valid signature
    (a refused END would be silent, so the committed message proves it passed)."""
    from pymq.client import LocalTransactionState, TransactionProducer

    namesrv = acl_cluster.namesrv_addr
    broker = acl_cluster.broker
    before = broker.transactions.stats.committed
    async with TransactionProducer(
        "TxP",
        namesrv,
        execute=lambda msg, arg: LocalTransactionState.COMMIT_MESSAGE,
        check=lambda msg: LocalTransactionState.COMMIT_MESSAGE,
        credentials=PRODUCER,
    ) as producer:
        sent = await producer.send_in_transaction(Message("Allowed", b"tx"))
        assert sent.status == "SEND_OK"
        await wait_until(lambda: broker.transactions.stats.committed == before + 1)
        with pytest.raises(MQClientError) as denied:
            await producer.send_in_transaction(Message("Denied", b"no"))
        assert "No default permission for topic:Denied" in denied.value.remark


async def test_pull_and_push_consumers_with_credentials(acl_cluster: Cluster) -> None:
    namesrv = acl_cluster.namesrv_addr
    async with Producer("P", namesrv, credentials=PRODUCER) as producer:
        for i in range(3):
            await producer.send(Message("Allowed", b"m%d" % i))
    # A new queue's first entry is dispatched by the reput task (its file made in a thread).
    await acl_cluster.broker.store.reput.do_reput()
    async with PullConsumer("Readers", namesrv, credentials=CONSUMER) as puller:
        pulled = []
        for mq in await puller.fetch_subscribe_message_queues("Allowed"):
            pulled += (await puller.pull(mq, "*", 0, 32)).messages
        assert sorted(m.body for m in pulled) == [b"m0", b"m1", b"m2"]
    async with PullConsumer("Readers", namesrv) as anonymous:
        mq = (await anonymous.fetch_subscribe_message_queues("Allowed"))[0]
        with pytest.raises(MQClientError, match="No accessKey is configured"):
            await anonymous.pull(mq, "*", 0, 32)
    async with PullConsumer("Others", namesrv, credentials=CONSUMER) as other_group:
        mq = (await other_group.fetch_subscribe_message_queues("Allowed"))[0]
        with pytest.raises(MQClientError, match="No default permission for group:Others"):
            await other_group.pull(mq, "*", 0, 32)

    got: list[MessageExt] = []
    arrived = trio.Event()

    async def handle(msgs: list[MessageExt]) -> bool:
        got.extend(msgs)
        if len(got) >= 3:
            arrived.set()
        return True

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with PushConsumer(
        "Readers", namesrv, handle, consume_from=first, credentials=CONSUMER
    ) as consumer:
        await consumer.subscribe("Allowed")
        with trio.fail_after(30):
            await arrived.wait()
    assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]


async def test_reload_on_file_change(acl_cluster: Cluster) -> None:
    namesrv = acl_cluster.namesrv_addr
    async with Producer("P", namesrv, credentials=PRODUCER) as producer:
        with pytest.raises(MQClientError, match="No default permission for topic:Denied"):
            await producer.send(Message("Denied", b"no"))
        path = acl_file(acl_cluster)
        path.write_text(path.read_text().replace("[Allowed=PUB]", "[Allowed=PUB, Denied=PUB]"))

        async def allowed_now() -> bool:
            try:
                await producer.send(Message("Denied", b"yes"))
            except MQClientError:
                return False
            return True

        await wait_until(allowed_now, timeout=10)
        # A broken file keeps the configuration in force.
        path.write_text("accounts: [\n")
        await trio.sleep(1.5)
        assert (await producer.send(Message("Denied", b"still"))).status == "SEND_OK"


async def test_acl_admin_codes_over_remoting(acl_cluster: Cluster) -> None:
    broker = acl_cluster.broker_addr

    def signed(code: int, ext: dict[str, str], who: tuple[str, str] = ADMIN) -> RemotingCommand:
        fields = dict(ext)
        sign_request(fields, None, *who)
        return RemotingCommand.request(code, fields)

    async with open_remoting_client() as client:
        create = {
            "accessKey": "lateUser1",
            "secretKey": "lateSecret1",
            "defaultTopicPerm": "PUB",
            "topicPerms": "Denied=DENY",
            "admin": "false",
        }
        refused = await client.invoke(
            broker, signed(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, create, PRODUCER)
        )
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert "Need admin permission for request code=50" in (refused.remark or "")
        ok = await client.invoke(broker, signed(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, create))
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        assert "lateUser1" in acl_file(acl_cluster).read_text()
        config = await client.invoke(broker, signed(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, {}))
        assert config.code == ResponseCode.SUCCESS
        assert b'"accessKey":"lateUser1"' in config.body
        info = await client.invoke(broker, signed(RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}))
        assert info.code == ResponseCode.SUCCESS
        assert (
            info.ext_fields["brokerAddr"] == broker and '"counter":1' in info.ext_fields["version"]
        )
        white = await client.invoke(
            broker,
            signed(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {"globalWhiteAddrs": "10.9.*.*"}),
        )
        assert white.code == ResponseCode.SUCCESS, white.remark
        bad = await client.invoke(
            broker,
            signed(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, {"accessKey": "x", "secretKey": "y"}),
        )
        assert bad.code == ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        deleted = await client.invoke(
            broker, signed(RequestCode.DELETE_ACL_CONFIG, {"accessKey": "lateUser1"})
        )
        assert deleted.code == ResponseCode.SUCCESS
        again = await client.invoke(
            broker, signed(RequestCode.DELETE_ACL_CONFIG, {"accessKey": "lateUser1"})
        )
        assert again.code == ResponseCode.DELETE_ACL_CONFIG_FAILED


async def test_broker_signs_its_requests_when_it_has_an_account(tmp_path: pathlib.Path) -> None:
    # RocketMQ's name server does not check ACL; a checking one stands in for any peer that does
    # (a master the slave syncs from), to see the broker's own requests signed.
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "plain_acl.yml").write_text(ACL)
    namesrv = make_namesrv(tmp_path)
    namesrv.server.access_check = AclManager(str(home)).check
    async with trio.open_nursery() as nursery:
        port = await nursery.start(namesrv.run)
        for account, registered in ((ADMIN, True), (("", ""), False)):
            store = MessageStoreConfig(
                store_path_root_dir=str(tmp_path / f"store{registered}"),
                mapped_file_size_commit_log=1 << 20,
            )
            config = BrokerConfig(
                broker_name=f"b{registered}",
                broker_ip1="127.0.0.1",
                namesrv_addr=f"127.0.0.1:{port}",
                access_key=account[0],
                secret_key=account[1],
            )
            broker = BrokerController(
                config,
                NettyServerConfig(listen_port=0, bind_address="127.0.0.1"),
                NettyClientConfig(),
                store,
            )
            async with trio.open_nursery() as broker_nursery:
                await broker_nursery.start(broker.run)
                names = set(namesrv.routes.broker_addr_table)
                assert (f"b{registered}" in names) is registered
                props, _ = broker.context.admin.config_properties()
                assert props["secretKey"] == ("******" if registered else "")
                broker_nursery.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def pymq_admin(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = await trio.run_process(
        [sys.executable, "-m", "pymq.admin", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_pymq_admin_acl_subcommands(acl_cluster: Cluster, tmp_path: pathlib.Path) -> None:
    namesrv, broker = acl_cluster.namesrv_addr, acl_cluster.broker_addr
    sign = ["--aclAccessKey", ADMIN[0], "--aclSecretKey", ADMIN[1]]
    target = ["-n", namesrv, "-b", broker]
    code, out, err = await pymq_admin(
        "updateAclConfig",
        *target,
        *sign,
        "-a",
        "cliAccount",
        "-s",
        "cliSecret1",
        "-i",
        "PUB",
        "-t",
        "Denied=DENY,Allowed=PUB|SUB",
        "-g",
        "Readers=SUB",
    )
    assert code == 0, err
    assert f"create or update plain access config to {broker} success." in out
    assert "cliSecret1" not in out
    written = yaml.safe_load(acl_file(acl_cluster).read_text())
    account = next(a for a in written["accounts"] if a["accessKey"] == "cliAccount")
    assert account["topicPerms"] == ["Denied=DENY", "Allowed=PUB|SUB"]
    async with Producer("P", namesrv, credentials=("cliAccount", "cliSecret1")) as producer:
        assert (await producer.send(Message("Allowed", b"cli"))).status == "SEND_OK"

    # Signed by tools.yml, as mqadmin is.
    home = tmp_path / "tools-home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "tools.yml").write_text(f"accessKey: {ADMIN[0]}\nsecretKey: {ADMIN[1]}\n")
    env = dict(os.environ, ROCKETMQ_HOME=str(home))
    code, out, err = await pymq_admin("clusterAclConfigVersion", *target, "--json", env=env)
    assert code == 0, err
    versions = json.loads(out)
    default = next(v for v in versions if v["aclFilePath"].endswith("plain_acl.yml"))
    assert default["aclConfigVersionNum"] == 1 and default["brokerAddr"] == broker
    code, out, err = await pymq_admin(
        "updateGlobalWhiteAddr", *target, "-g", "10.1.*.*,10.2.0.1", env=env
    )
    assert code == 0, err
    assert yaml.safe_load(acl_file(acl_cluster).read_text())["globalWhiteRemoteAddresses"] == [
        "10.1.*.*",
        "10.2.0.1",
    ]
    code, out, err = await pymq_admin("deleteAccessConfig", *target, "-a", "cliAccount", env=env)
    assert code == 0, err
    assert "cliAccount" not in acl_file(acl_cluster).read_text()

    # Unsigned, or by a non-admin: one error line, nothing changed.
    before = acl_file(acl_cluster).read_text()
    code, out, err = await pymq_admin("deleteAccessConfig", *target, "-a", PRODUCER[0])
    assert code == 1 and "No accessKey is configured" in err and err.count("\n") == 1
    code, out, err = await pymq_admin(
        "deleteAccessConfig",
        *target,
        "--aclAccessKey",
        PRODUCER[0],
        "--aclSecretKey",
        PRODUCER[1],
        "-a",
        PRODUCER[0],
    )
    assert code == 1 and "Need admin permission for request code=51" in err
    assert acl_file(acl_cluster).read_text() == before


async def test_admin_channel_shows_accounts_masked_and_edits_them(
    tmp_path: pathlib.Path,
) -> None:
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "plain_acl.yml").write_text(ACL)
    properties = dict(TEST_PROPERTIES, aclEnable="true", rocketmqHome=str(home))
    async with open_cluster(
        str(tmp_path / "data"),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
        admin_port=ADMIN_ANY_PORT,
    ) as cluster:
        channel = cluster.admin_channel
        assert channel is not None
        async with open_websocket_url(ws_url(cluster)) as ws:
            admin = AdminClient(ws)
            await admin.call("auth", token=channel.token)
            view = await admin.call("acl.list")
            assert view["enabled"] is True
            accounts = {a["accessKey"]: a for a in view["accounts"]}
            assert set(accounts) == {"RocketMQAdmin", "producerUser", "consumerUser"}
            text = json.dumps(view)
            for secret in ("12345678admin", "producerSecret", "consumerSecret"):
                assert secret not in text
            assert accounts["producerUser"]["secretKey"].startswith("pr")
            assert accounts["producerUser"]["topicPerms"] == ["Allowed=PUB"]
            # An edit without the secret keeps it; the change is in force at once.
            await admin.call(
                "acl.update",
                accessKey="producerUser",
                defaultTopicPerm="DENY",
                topicPerms="Allowed=PUB,Denied=PUB",
            )
            assert "producerSecret" in acl_file(cluster).read_text()
            async with Producer("P", cluster.namesrv_addr, credentials=PRODUCER) as producer:
                await topics.create_topic(
                    cluster.namesrv_addr,
                    "Denied",
                    brokers=[cluster.broker_addr],
                    credentials=ADMIN,
                )
                assert (await producer.send(Message("Denied", b"ok"))).status == "SEND_OK"
            refused = await admin.request("acl.update", accessKey="brandNewUser")
            assert refused["error"]["code"] == "BAD_REQUEST"
            bad = await admin.request("acl.update", accessKey="tiny", secretKey="tiny")
            assert bad["error"]["code"] == "UPDATE_AND_CREATE_ACL_CONFIG_FAILED"
            await admin.call("acl.updateGlobalWhiteAddrs", globalWhiteAddrs=["10.8.*.*"])
            assert (await admin.call("acl.list"))["defaultFileWhiteAddrs"] == ["10.8.*.*"]
            await admin.call("acl.delete", accessKey="consumerUser")
            names = {a["accessKey"] for a in (await admin.call("acl.list"))["accounts"]}
            assert "consumerUser" not in names


async def test_admin_channel_without_acl(tmp_path: pathlib.Path) -> None:
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES, adminToken="theAdminToken1"),
        admin_port=ADMIN_ANY_PORT,
    ) as cluster:
        # The token is never shown by the config answers (any signed account may read them).
        props, _ = cluster.broker.context.admin.config_properties()
        assert props["adminToken"] == "******"
        channel = cluster.admin_channel
        assert channel is not None
        async with open_websocket_url(ws_url(cluster)) as ws:
            admin = AdminClient(ws)
            await admin.call("auth", token=channel.token)
            assert (await admin.call("acl.list"))["enabled"] is False
            refused = await admin.request("acl.delete", accessKey="someone")
            assert "ACL is off" in refused["error"]["message"]


async def test_a_run_of_signed_sends_is_served_from_its_bytes_once_checked(
    acl_cluster: Cluster,
) -> None:
    """With ACL, a read's run of sends is decoded and checked frame by frame, and those the
    check passes are put from their bytes in one go, as without ACL; a refused frame in the
    middle (a bad signature, a topic the account may not write) is answered in its turn and
    stores nothing, and the sends after it are served too."""
    from pymq.remoting.headers import SendMessageRequestHeader
    from tests.helpers import answers_of_one_write

    cluster = acl_cluster
    send = cluster.broker.send_processor
    # The topic's first send is checked by the decoded way: it judges the topic for the rest.
    async with Producer("P", cluster.namesrv_addr, credentials=PRODUCER) as producer:
        assert (await producer.send(Message("Allowed", b"first"))).status == "SEND_OK"
    from_bytes: list[int] = []
    read_run = send.send_run  # called without a check for the frames the check passed

    def counting(*args: object) -> tuple[bytes, int, RemotingCommand | None]:
        joined, left, cmd = read_run(*args)  # type: ignore[arg-type]
        from_bytes.append(left - args[3])  # type: ignore[operator]
        return joined, left, cmd

    send.send_run = counting  # type: ignore[method-assign]

    def request(n: int, topic: str = "Allowed", forge: bool = False) -> RemotingCommand:
        ext = SendMessageRequestHeader.v2_ext(
            "P", topic, 0, 0, 1_800_000_000_000, 0, f"UNIQ_KEY\x01U{n}", False
        )
        body = b"run-%d" % n
        sign_request(ext, body, *PRODUCER)
        if forge:
            body = b"forged"  # signed for another body
        return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext, body)

    kinds = ["ok", "ok", "forged", "ok", "denied", "ok", "ok"]
    requests = [
        request(n, "Denied" if kind == "denied" else "Allowed", kind == "forged")
        for n, kind in enumerate(kinds)
    ]
    await cluster.broker.store.reput.do_reput()
    before = cluster.broker.store.get_max_offset_in_queue("Allowed", 0)
    answers = await answers_of_one_write(cluster.broker.port, requests)
    assert [a.opaque for a in answers] == [r.opaque for r in requests]
    codes = [a.code for a in answers]
    assert codes == [
        ResponseCode.SYSTEM_ERROR if kind != "ok" else ResponseCode.SUCCESS for kind in kinds
    ]
    assert "Check signature failed" in (answers[2].remark or "")
    assert "No default permission" in (answers[4].remark or "")
    # Served from their bytes, in runs between the refusals: 2, 1, 2 (not one by one).
    assert sum(from_bytes) == 5 and max(from_bytes) == 2, from_bytes
    await cluster.broker.store.reput.do_reput()
    assert cluster.broker.store.get_max_offset_in_queue("Allowed", 0) == before + 5


async def test_a_check_that_raises_refuses_that_send_alone(acl_cluster: Cluster) -> None:
    """An access check that raises (a defect) refuses the frame it judged, SYSTEM_ERROR: the
    frames before it in the run are answered once and stored once, the ones after it too."""
    from pymq.remoting.headers import SendMessageRequestHeader
    from tests.helpers import answers_of_one_write

    cluster = acl_cluster
    async with Producer("P", cluster.namesrv_addr, credentials=PRODUCER) as producer:
        assert (await producer.send(Message("Allowed", b"first"))).status == "SEND_OK"
    await cluster.broker.store.reput.do_reput()
    before = cluster.broker.store.get_max_offset_in_queue("Allowed", 0)

    def request(n: int) -> RemotingCommand:
        ext = SendMessageRequestHeader.v2_ext(
            "P", "Allowed", 0, 0, 1_800_000_000_000, 0, f"UNIQ_KEY\x01R{n}", False
        )
        body = b"boom" if n == 1 else b"run-%d" % n
        sign_request(ext, body, *PRODUCER)
        return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext, body)

    for server in (cluster.broker.server, cluster.broker.fast_server):
        real = server.access_check
        assert real is not None

        def raising(channel: object, req: RemotingCommand, real=real) -> RemotingCommand | None:  # type: ignore[no-untyped-def]
            if req.body == b"boom":
                raise RuntimeError("a defect in the check")
            return real(channel, req)  # type: ignore[arg-type]

        server.access_check = raising  # type: ignore[assignment]
    requests = [request(n) for n in range(3)]
    answers = await answers_of_one_write(cluster.broker.port, requests)
    assert [a.opaque for a in answers] == [r.opaque for r in requests]
    assert [a.code for a in answers] == [
        ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR, ResponseCode.SUCCESS
    ]  # fmt: skip
    assert "access check failed" in (answers[1].remark or "")
    await cluster.broker.store.reput.do_reput()
    assert cluster.broker.store.get_max_offset_in_queue("Allowed", 0) == before + 2
