"""The ACL admin codes: UPDATE_AND_CREATE_ACL_CONFIG (50), DELETE_ACL_CONFIG (51),
GET_BROKER_CLUSTER_ACL_INFO (52), UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (53) and
GET_BROKER_CLUSTER_ACL_CONFIG (54), over :class:`pymq.broker.acl.AclManager`.

Changes are written back to the ACL file that holds the account (new accounts and the global
white list: ``plain_acl.yml``), with the file's ``dataVersion`` counted up, and take effect at
once.  Failures answer RocketMQ's codes (209, 210, 211) with the reason as remark; a broker
without ``aclEnable`` answers them too, saying so.  Only admin accounts reach these codes
(:data:`pymq.broker.acl.ADMIN_CODES`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import trio

from pymq.acl.plain import AclConfigError, PlainAccessConfig
from pymq.broker.acl import AclManager
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import ResponseCode

log = logging.getLogger(__name__)

ACL_DISABLED = "The broker does not enable acl (aclEnable=false)"


def _split(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


class AclProcessor:
    def __init__(
        self, manager: AclManager | None, identity: Callable[[], tuple[str, str, str]]
    ) -> None:
        self.manager = manager
        # (brokerName, brokerAddr, clusterName), known once the broker listens.
        self.identity = identity

    async def update_and_create_acl_config(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        failed = ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        if self.manager is None:
            return req.response(failed, ACL_DISABLED)
        head: H.CreateAccessConfigRequestHeader = H.decode_request(req)
        config = PlainAccessConfig(
            access_key=head.access_key,
            secret_key=head.secret_key or "",
            white_remote_address=head.white_remote_address,
            admin=head.admin,
            default_topic_perm=head.default_topic_perm,
            default_group_perm=head.default_group_perm,
            topic_perms=_split(head.topic_perms),
            group_perms=_split(head.group_perms),
        )
        try:
            await trio.to_thread.run_sync(self.manager.update_account, config)
        except (AclConfigError, OSError) as exc:
            log.warning("updateAclConfig for %s refused: %s", head.access_key, exc)
            return req.response(failed, str(exc))
        log.info("updateAclConfig called by %s: %s", channel.remote_address, head.access_key)
        return req.response()

    async def delete_acl_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        failed = ResponseCode.DELETE_ACL_CONFIG_FAILED
        if self.manager is None:
            return req.response(failed, ACL_DISABLED)
        access_key = H.decode_request(req).access_key
        try:
            deleted = await trio.to_thread.run_sync(self.manager.delete_account, access_key)
        except (AclConfigError, OSError) as exc:
            return req.response(failed, str(exc))
        if not deleted:
            return req.response(
                failed,
                f"The accessKey[{access_key}] corresponding to accessConfig has been deleted "
                "failed.",
            )
        log.info("DeleteAccessConfig called by %s: %s", channel.remote_address, access_key)
        return req.response()

    async def update_global_white_addrs_config(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        failed = ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
        if self.manager is None:
            return req.response(failed, ACL_DISABLED)
        head: H.UpdateGlobalWhiteAddrsConfigRequestHeader = H.decode_request(req)
        try:
            await trio.to_thread.run_sync(
                self.manager.update_global_white,
                _split(head.global_white_addrs),
                head.acl_file_full_path,
            )
        except (AclConfigError, OSError) as exc:
            return req.response(failed, str(exc))
        addrs = head.global_white_addrs
        log.info("updateGlobalWhiteAddr called by %s: %s", channel.remote_address, addrs)
        return req.response()

    async def get_broker_cluster_acl_info(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        if self.manager is None:
            return req.response(ResponseCode.SYSTEM_ERROR, ACL_DISABLED)
        version, every = self.manager.versions()
        name, addr, cluster = self.identity()
        head = H.GetBrokerAclConfigResponseHeader(
            version=version,
            all_acl_file_version=every,
            broker_name=name,
            broker_addr=addr,
            cluster_name=cluster,
        )
        response = req.response()
        response.ext_fields = H.encode(head)
        return response

    async def get_broker_cluster_acl_config(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        if self.manager is None:
            return req.response(ResponseCode.SYSTEM_ERROR, ACL_DISABLED)
        body = json.dumps(self.manager.all_config(), separators=(",", ":")).encode()
        return req.response(body=body)
