"""Runtime config changes are saved as RocketMQ saves them, so that a restart keeps them:
UPDATE_BROKER_CONFIG into the broker's config file, UPDATE_NAMESRV_CONFIG into the name
server's; a change that cannot be saved is refused and changes nothing."""

from __future__ import annotations

from pathlib import Path

from pymq.broker.__main__ import build_configs
from pymq.common.files import PropertiesFile
from pymq.common.properties import parse_properties
from pymq.embedded import open_cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode


async def _update(client: RemotingClient, addr: str, code: int, body: bytes) -> RemotingCommand:
    return await client.invoke(addr, RemotingCommand.request(code, body=body))


async def test_a_restart_keeps_runtime_changes(tmp_path: Path, client: RemotingClient) -> None:
    data = str(tmp_path)
    async with open_cluster(data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1") as c:
        answer = await _update(
            client,
            c.broker_addr,
            RequestCode.UPDATE_BROKER_CONFIG,
            b"fileReservedTime=12\ndeleteWhen=03\n",
        )
        assert answer.code == ResponseCode.SUCCESS
        answer = await _update(
            client,
            c.namesrv_addr,
            RequestCode.UPDATE_NAMESRV_CONFIG,
            b"orderMessageEnable=true\n",
        )
        assert answer.code == ResponseCode.SUCCESS
    saved = parse_properties((tmp_path / "store" / "config" / "broker.properties").read_text())
    assert saved == {"fileReservedTime": "12", "deleteWhen": "03"}
    async with open_cluster(data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1") as c:
        assert c.broker.store_config.file_reserved_time == 12
        assert c.broker.store_config.delete_when == "03"
        assert c.namesrv.namesrv_config.order_message_enable is True


async def test_changes_go_into_the_file_the_broker_was_started_with(
    pymq_cluster, tmp_path: Path, client: RemotingClient
) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("# my broker\nbrokerClusterName=DefaultCluster\nfileReservedTime=72\n")
    pymq_cluster.broker.config_file = PropertiesFile(str(conf))
    addr = pymq_cluster.broker_addr
    answer = await _update(client, addr, RequestCode.UPDATE_BROKER_CONFIG, b"fileReservedTime=6\n")
    assert answer.code == ResponseCode.SUCCESS
    assert conf.read_text() == "# my broker\nbrokerClusterName=DefaultCluster\nfileReservedTime=6\n"


async def test_a_change_that_cannot_be_saved_changes_nothing(
    pymq_cluster, tmp_path: Path, client: RemotingClient
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    pymq_cluster.broker.config_file = PropertiesFile(str(blocker / "broker.properties"))
    before = pymq_cluster.broker.store_config.file_reserved_time
    addr = pymq_cluster.broker_addr
    answer = await _update(client, addr, RequestCode.UPDATE_BROKER_CONFIG, b"fileReservedTime=5\n")
    assert answer.code == ResponseCode.SYSTEM_ERROR
    assert "could not be saved" in answer.remark and str(tmp_path) not in answer.remark
    assert pymq_cluster.broker.store_config.file_reserved_time == before


def test_a_broker_started_without_a_file_reads_its_saved_changes(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "broker.properties").write_text("fileReservedTime=7\n")
    root = {"storePathRootDir": str(tmp_path)}
    assert build_configs(None, root)[3].file_reserved_time == 7
    # The command line still wins over what was saved.
    assert build_configs(None, {**root, "fileReservedTime": "9"})[3].file_reserved_time == 9
    # With -c the saved file is not read: the -c file is where changes go.
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=x\n")
    assert build_configs(str(conf), root)[3].file_reserved_time == 72
