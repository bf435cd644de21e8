"""Plain ACL on the broker (RocketMQ 4.9.x ``PlainAccessValidator`` + ``PlainPermissionManager``).

With ``aclEnable=true`` every request whose code the broker serves is checked before its
processor runs (:meth:`AclManager.check`, installed as the remoting servers' ``access_check``;
with ``aclEnable=false`` nothing is installed and the request path is unchanged):

1. a peer matching a ``globalWhiteRemoteAddresses`` pattern passes;
2. no ``AccessKey`` extField: refused ``No accessKey is configured``; an unknown key: ``No acl
   config for <key>``;
3. a peer matching the account's ``whiteRemoteAddress`` passes without signature;
4. the ``Signature`` is recomputed (:func:`pymq.acl.plain.signed_content`) and compared in
   constant time: ``Check signature failed for accessKey=<key>``;
5. admin-only codes need ``admin: true``; every resource the request code needs
   (:data:`RULES`) is checked against the account's ``topicPerms``/``groupPerms`` and defaults:
   ``No default permission for topic:T`` (or ``group:G``).  As ``checkPerm``, a listed topic or
   group is judged by its entry alone (``topicA=DENY`` refuses topicA whatever
   ``defaultTopicPerm`` says); the default applies to those not listed.
6. what a processor learns only by reading is checked by it, through :meth:`AclManager.authorize`,
   before it changes anything: the groups and topics of a heartbeat (whose body is read once,
   by the processor, never before the signature is checked), and the topic of the stored
   message that VIEW_MESSAGE_BY_ID, CONSUMER_SEND_MSG_BACK and CONSUME_MESSAGE_DIRECTLY name.

Stricter than 4.9.4 where it let an account reach what its permissions deny: a send to
``%RETRY%X`` needs SUB on group X (4.9.4: on the producer group the header names), the trace
topic needs PUB like any topic (4.9.4 skips every check for it), and the three reads above need
SUB on the stored message's topic (and CONSUME_MESSAGE_DIRECTLY SUB on its group).

A refusal is answered code 1 (SYSTEM_ERROR) with the remark the 4.9.4 broker writes
(``org.apache.rocketmq.acl.common.AclException: <message>, <where>``), nothing of the request is
served, and it is logged once per peer and reason (:data:`REFUSAL_LOG_MAX` remembered).

Accounts come from ``<rocketmqHome>/conf/plain_acl.yml`` and every ``.yml``/``.yaml`` file under
``<rocketmqHome>/conf/acl/`` (4.9.x): an access key defined in two files is taken from the first.
The files are checked every :data:`WATCH_PERIOD` seconds (a digest of each, and the set of
files) and reloaded on change; a file that does not parse leaves the last good
configuration in force and is logged.  The ACL admin codes (50-54) write the file back.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import yaml

from pymq.acl.plain import (
    ACCESS_KEY,
    PUB,
    SIGNATURE,
    SUB,
    Account,
    AclConfigError,
    AclDocument,
    AddressPattern,
    PlainAccessConfig,
    check_permission,
    compile_address_pattern,
    describe_resource,
    is_retry_topic,
    retry_topic,
)
from pymq.common.clock import now_ms
from pymq.common.consumer import HeartbeatData
from pymq.common.serde import check_body_size
from pymq.common.topic import RETRY_GROUP_TOPIC_PREFIX
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode

log = logging.getLogger(__name__)

# AclFileWatchService checks the files every 500 ms.
WATCH_PERIOD = 0.5
# Refusals logged once per (peer host, access key, reason); this many remembered, then forgotten.
REFUSAL_LOG_MAX = 4096
# Decisions kept per account ((code, resources) -> refusal or None); forgotten all at once when
# full.  Requests naming more resources than DECISION_RESOURCES_MAX (big heartbeats), or one
# longer than DECISION_RESOURCE_CHARS (RocketMQ's topics are at most 127 characters, groups
# 255, and a retry topic adds 7), are decided each time: at most some 1.5 MB per account.
DECISIONS_MAX = 1024
DECISION_RESOURCES_MAX = 4
DECISION_RESOURCE_CHARS = 300

_EXC = "org.apache.rocketmq.acl.common.AclException: "
_MANAGER = "org.apache.rocketmq.acl.plain.PlainPermissionManager"
_VALIDATOR = "org.apache.rocketmq.acl.plain.PlainAccessValidator"
# Where the 4.9.4 broker's AclException of each kind is thrown (the remark names it).
AT_NO_ACCESS_KEY = f"{_MANAGER}.validate(PlainPermissionManager.java:663)"
AT_NO_ACL_CONFIG = f"{_MANAGER}.validate(PlainPermissionManager.java:667)"
AT_SIGNATURE = f"{_MANAGER}.validate(PlainPermissionManager.java:683)"
AT_NEED_ADMIN = f"{_MANAGER}.checkPerm(PlainPermissionManager.java:580)"
AT_NO_PERMISSION = f"{_MANAGER}.checkPerm(PlainPermissionManager.java:605)"
AT_LISTED_NO_PERMISSION = f"{_MANAGER}.checkPerm(PlainPermissionManager.java:610)"
AT_PARSE = f"{_VALIDATOR}.parse(PlainAccessValidator.java:134)"
# The JVM's message when HEART_BEAT comes without a body.
NULL_BODY = 'Cannot read the array length because "bytes" is null'


def remark(message: str, where: str) -> str:
    return f"{_EXC}{message}, {where}"


class AclRefused(Exception):
    def __init__(self, message: str, where: str, reason: str) -> None:
        super().__init__(message)
        self.remark = remark(message, where)
        self.reason = reason


# -- what each request code needs ----------------------------------------------------------------

Resources = tuple[tuple[str, int], ...]
Rule = Callable[[dict[str, str], bytes], Resources]
_RC = RequestCode


def _java(value: str | None) -> str:
    """A missing field as Java prints it."""
    return "null" if value is None else value


def _signed_only(ext: dict[str, str], body: bytes) -> Resources:
    """Signature checked, no resource named (RocketMQ's default for reads and client upkeep)."""
    return ()


def _admin(ext: dict[str, str], body: bytes) -> Resources:
    """Admin accounts only (see :data:`ADMIN_CODES`)."""
    return ()


def _send(topic_key: str) -> Rule:
    def rule(ext: dict[str, str], body: bytes) -> Resources:
        topic = ext.get(topic_key)
        if topic is None:
            return (("null", PUB),)  # as Java prints a missing topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            # A consumer re-sending to its retry topic (the Java client's fallback when
            # CONSUMER_SEND_MSG_BACK fails, from the producer group CLIENT_INNER_PRODUCER):
            # SUB on the group whose retry topic it is.  4.9.4 asks SUB on the producer group
            # the header names, which let anyone write into another group's retries.
            return ((topic, SUB),)
        return ((topic, PUB),)

    rule.__doc__ = f"PUB on the topic ({topic_key}); a retry topic: SUB on its own group"
    return rule


def _group_sub(key: str) -> Rule:
    def rule(ext: dict[str, str], body: bytes) -> Resources:
        return ((retry_topic(ext.get(key)), SUB),)

    rule.__doc__ = f"SUB on the group ({key})"
    return rule


def _topic_and_group_sub(topic_key: str, group_key: str) -> Rule:
    def rule(ext: dict[str, str], body: bytes) -> Resources:
        return ((_java(ext.get(topic_key)), SUB), (retry_topic(ext.get(group_key)), SUB))

    rule.__doc__ = f"SUB on the topic ({topic_key}) and the group ({group_key})"
    return rule


def _topic_sub(ext: dict[str, str], body: bytes) -> Resources:
    """SUB on the topic."""
    return ((_java(ext.get("topic")), SUB),)


def _unregister(ext: dict[str, str], body: bytes) -> Resources:
    """SUB on the consumer group, when the client names one (a producer's unregister does not;
    the C++ client sends it empty)."""
    group = ext.get("consumerGroup")
    return ((retry_topic(group), SUB),) if group else ()


def _heartbeat(ext: dict[str, str], body: bytes) -> Resources:
    """A body (none fails Java's parse); the processor reads it, once, and then checks SUB on
    each consumer group and topic it names (:func:`heartbeat_resources`,
    :meth:`AclManager.authorize`): nothing is parsed before the signature is checked, nor on
    the event loop when it is big."""
    if not body:
        raise ValueError(NULL_BODY)
    return ()


def heartbeat_resources(data: HeartbeatData) -> Resources:
    """SUB on each consumer group of a heartbeat and each topic it subscribes."""
    needed: list[tuple[str, int]] = []
    for consumer in data.consumer_data_set:
        needed.append((retry_topic(consumer.group_name), SUB))
        for subscription in consumer.subscription_data_set:
            needed.append((subscription.topic, SUB))
    return tuple(needed)


# RocketMQ 4.9.4's admin-only codes (Permission.ADMIN_CODE), and the ACL codes themselves.
ADMIN_CODES = frozenset(
    {
        _RC.UPDATE_AND_CREATE_TOPIC,
        _RC.UPDATE_BROKER_CONFIG,
        _RC.DELETE_TOPIC_IN_BROKER,
        _RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        _RC.DELETE_SUBSCRIPTIONGROUP,
        _RC.UPDATE_AND_CREATE_ACL_CONFIG,
        _RC.DELETE_ACL_CONFIG,
        _RC.GET_BROKER_CLUSTER_ACL_INFO,
        _RC.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
        _RC.GET_BROKER_CLUSTER_ACL_CONFIG,
        # pymq: the codes that delete data or state (4.9.4 asks only for a signature).
        _RC.DELETE_EXPIRED_COMMITLOG,
        _RC.CLEAN_EXPIRED_CONSUMEQUEUE,
        _RC.CLEAN_UNUSED_TOPIC,
        # pymq: it writes into the half queue (4.9.4 asks only for a signature).
        _RC.RESUME_CHECK_HALF_MESSAGE,
    }
)

# The rule of every request code the broker serves.  A served code missing here is refused as
# if it were admin-only (and tests/unit/test_acl.py fails).
RULES: dict[int, Rule] = {
    _RC.SEND_MESSAGE: _send("topic"),
    _RC.SEND_MESSAGE_V2: _send("b"),
    _RC.SEND_BATCH_MESSAGE: _send("b"),
    # RocketMQ 5 asks PUB on the topic (RecallMessageRequestHeader's @RocketMQAction).
    _RC.RECALL_MESSAGE: _send("topic"),
    # A reply needs a valid signature only, as 4.9.4 asks (its replies go to the cluster's
    # reply topic, a system topic accounts do not list).
    _RC.SEND_REPLY_MESSAGE: _signed_only,
    _RC.SEND_REPLY_MESSAGE_V2: _signed_only,
    # And SUB on the stored message's topic, checked by the processor once it has read it
    # (AclManager.authorize): the offset may name any topic's message.
    _RC.CONSUMER_SEND_MSG_BACK: _group_sub("group"),
    _RC.PULL_MESSAGE: _topic_and_group_sub("topic", "consumerGroup"),
    _RC.QUERY_MESSAGE: _topic_sub,
    _RC.HEART_BEAT: _heartbeat,
    _RC.UNREGISTER_CLIENT: _unregister,
    _RC.GET_CONSUMER_LIST_BY_GROUP: _group_sub("consumerGroup"),
    _RC.QUERY_CONSUMER_OFFSET: _topic_and_group_sub("topic", "consumerGroup"),
    _RC.UPDATE_CONSUMER_OFFSET: _topic_and_group_sub("topic", "consumerGroup"),
    _RC.CHECK_CLIENT_CONFIG: _signed_only,
    # Its header names no topic; the half message's send was checked for PUB on the real
    # topic, and 4.9.4 asks only for a valid signature here.
    _RC.END_TRANSACTION: _signed_only,
    _RC.LOCK_BATCH_MQ: _signed_only,
    _RC.UNLOCK_BATCH_MQ: _signed_only,
    _RC.GET_ALL_TOPIC_CONFIG: _signed_only,
    _RC.GET_BROKER_CONFIG: _signed_only,
    _RC.GET_BROKER_RUNTIME_INFO: _signed_only,
    _RC.GET_TIMER_METRICS: _signed_only,
    _RC.GET_TIMER_CHECK_POINT: _signed_only,
    _RC.SEARCH_OFFSET_BY_TIMESTAMP: _signed_only,
    _RC.GET_MAX_OFFSET: _signed_only,
    _RC.GET_MIN_OFFSET: _signed_only,
    _RC.GET_EARLIEST_MSG_STORETIME: _signed_only,
    # SUB on the stored message's topic, checked by the processor once it has read it.
    _RC.VIEW_MESSAGE_BY_ID: _signed_only,
    _RC.GET_ALL_CONSUMER_OFFSET: _signed_only,
    _RC.GET_ALL_DELAY_OFFSET: _signed_only,
    _RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: _signed_only,
    _RC.GET_CONSUMER_CONNECTION_LIST: _signed_only,
    _RC.GET_GRPC_STATUS: _signed_only,
    _RC.GET_TOPIC_STATS_INFO: _signed_only,
    _RC.GET_CONSUME_STATS: _signed_only,
    _RC.INVOKE_BROKER_TO_RESET_OFFSET: _signed_only,
    # The operator tools' queries and calls (mqadmin, the dashboard): a valid signature, as
    # 4.9.4 asks.
    _RC.GET_PRODUCER_CONNECTION_LIST: _signed_only,
    _RC.QUERY_TOPIC_CONSUME_BY_WHO: _signed_only,
    _RC.QUERY_CONSUME_TIME_SPAN: _signed_only,
    _RC.VIEW_BROKER_STATS_DATA: _signed_only,
    _RC.GET_BROKER_CONSUME_STATS: _signed_only,
    _RC.GET_CONSUMER_RUNNING_INFO: _signed_only,
    # SUB on the group the message is delivered to, and on the stored message's topic
    # (checked by the processor once it has read it): 4.9.4 asks only for a signature, which
    # let any account have any message delivered to a consumer of its own.
    _RC.CONSUME_MESSAGE_DIRECTLY: _group_sub("consumerGroup"),
    _RC.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: _signed_only,
    _RC.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: _signed_only,
    _RC.CLONE_GROUP_OFFSET: _signed_only,
    _RC.QUERY_CONSUME_QUEUE: _signed_only,
    _RC.QUERY_CORRECTION_OFFSET: _signed_only,
    _RC.GET_ALL_PRODUCER_INFO: _signed_only,
    **{code: _admin for code in ADMIN_CODES},
}
# The codes whose body the broker parses (JSON; UPDATE_BROKER_CONFIG's properties): a body over
# JSON_BODY_MAX is refused before the signature is computed over it, as Java's parse fails
# before its validate (the processors refuse it too, for peers the ACL lets through).
PARSED_BODY_CODES = frozenset(
    {
        _RC.HEART_BEAT,
        _RC.LOCK_BATCH_MQ,
        _RC.UNLOCK_BATCH_MQ,
        _RC.CHECK_CLIENT_CONFIG,
        _RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        _RC.UPDATE_BROKER_CONFIG,
    }
)
# The rules that read only the header (never raise): those the check's fast path may run.
HEADER_RULES: dict[int, Rule] = {
    code: rule
    for code, rule in RULES.items()
    if rule is not _heartbeat and code not in PARSED_BODY_CODES
}


def _authorize(
    account: Account, code: int, rule: Rule | None, needed: Resources
) -> tuple[str, str, str] | None:
    """What refuses ``account`` a request of ``code`` naming ``needed`` (AclRefused's
    arguments), or None: its signature already checked."""
    # Traces (RMQ_SYS_TRACE_TOPIC) need PUB on the trace topic like any send: 4.9.4 skips every
    # check for them, which let an account denied everything write forged trace steps.
    if (rule is _admin or rule is None) and not account.admin:
        return (
            f"Need admin permission for request code={code}, but accessKey="
            f"{account.access_key} is not",
            AT_NEED_ADMIN,
            "admin",
        )
    owned = account.resource_perms
    if not needed or (owned is None and account.admin):
        return None
    for resource, perm in needed:
        # A listed topic or group decides alone; the default is for those not listed
        # (checkPerm: an entry of DENY, or of SUB for a send, refuses whatever the default).
        have = owned.get(resource) if owned is not None else None
        if have is None:
            group = is_retry_topic(resource)
            have = account.default_group_perm if group else account.default_topic_perm
            where = AT_NO_PERMISSION
        else:
            where = AT_LISTED_NO_PERMISSION
        if not check_permission(perm, have):
            return (f"No default permission for {describe_resource(resource)}", where, "permission")
    return None


def _signature_refused(access_key: str) -> AclRefused:
    return AclRefused(
        f"Check signature failed for accessKey={access_key}", AT_SIGNATURE, "signature"
    )


def _decision(
    account: Account, code: int, rule: Rule | None, needed: Resources
) -> tuple[str, str, str] | None:
    """:func:`_authorize`, kept with the account per (code, resources): what the account may do
    depends on nothing else (a reload builds new accounts, and so forgets it).  Only requests
    naming a few resources of sound length are kept (names come from the request: a kept
    decision must not pin what a client sends), at most DECISIONS_MAX per account."""
    decisions = account.decisions
    key = (code, needed)
    try:
        return decisions[key]
    except KeyError:
        pass
    refusal = _authorize(account, code, rule, needed)
    if len(needed) <= DECISION_RESOURCES_MAX and all(
        len(resource) <= DECISION_RESOURCE_CHARS for resource, _ in needed
    ):
        if len(decisions) >= DECISIONS_MAX:
            decisions.clear()
        decisions[key] = refusal
    return refusal


# -- the configuration in force ----------------------------------------------------------------


@attrs.frozen
class AclState:
    """One loaded configuration: replaced whole on reload, never changed in place."""

    accounts: dict[str, Account]
    account_file: dict[str, Path]
    global_white: tuple[AddressPattern, ...]
    documents: dict[Path, AclDocument]
    files: tuple[Path, ...]
    # The accounts whose every request is judged by signature and permissions alone (no white
    # address of their own, and no global white list in force): the check's fast path.
    signed_accounts: dict[str, Account] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        signed = (
            {}
            if self.global_white
            else {k: a for k, a in self.accounts.items() if a.white.kind == "none"}
        )
        object.__setattr__(self, "signed_accounts", signed)


def _read_document(path: Path) -> AclDocument:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise AclConfigError(f"{path}: not UTF-8: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AclConfigError(f"{path}: not YAML: {exc}") from None
    try:
        return AclDocument.from_mapping(data)
    except AclConfigError as exc:
        raise AclConfigError(f"{path}: {exc}") from None


def _write_document(path: Path, document: AclDocument) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        yaml.safe_dump(document.to_mapping(), f, sort_keys=False, default_flow_style=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class AclManager:
    """The broker's ACL: files, reload, the per-request check and the admin updates."""

    def __init__(self, rocketmq_home: str) -> None:
        if not rocketmq_home:
            raise AclConfigError(
                "aclEnable=true needs rocketmqHome (or the ROCKETMQ_HOME environment "
                "variable): the accounts are read from <rocketmqHome>/conf/plain_acl.yml and "
                "<rocketmqHome>/conf/acl/"
            )
        self.home = Path(rocketmq_home)
        self.default_file = self.home / "conf" / "plain_acl.yml"
        self.acl_dir = self.home / "conf" / "acl"
        self._lock = threading.Lock()
        self._logged: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self.refused = 0
        self._stamp: dict[Path, bytes] = {}
        self.state = self._load()

    # -- files ----------------------------------------------------------------------------

    def acl_files(self) -> list[Path]:
        """The 4.9.x list: every .yml/.yaml under conf/acl (recursively), then plain_acl.yml."""
        files: list[Path] = []
        if self.acl_dir.is_dir():
            for root, dirs, names in os.walk(self.acl_dir):
                dirs.sort()
                files.extend(Path(root) / n for n in sorted(names) if n.endswith((".yml", ".yaml")))
        if self.default_file.exists() and self.default_file not in files:
            files.append(self.default_file)
        return files

    def _stamps(self, files: list[Path]) -> dict[Path, bytes]:
        """A digest of each file's content (RocketMQ's watcher compares MD5s): an edit is seen
        whatever the file system's time resolution."""
        stamps = {}
        for path in files:
            try:
                stamps[path] = hashlib.sha256(path.read_bytes()).digest()
            except OSError:
                continue
        return stamps

    def _load(self) -> AclState:
        """Read every file; AclConfigError (naming the file) if one is broken."""
        if not self.default_file.exists():
            # RocketMQ creates it, empty, so that there is a file to hold the white list.
            self.default_file.parent.mkdir(parents=True, exist_ok=True)
            self.default_file.touch()
        files = self.acl_files()
        stamps = self._stamps(files)
        documents: dict[Path, AclDocument] = {}
        accounts: dict[str, Account] = {}
        account_file: dict[str, Path] = {}
        white: list[AddressPattern] = []
        for path in files:
            try:
                document = _read_document(path)
            except OSError as exc:
                raise AclConfigError(f"{path}: cannot read: {exc}") from None
            documents[path] = document
            white.extend(compile_address_pattern(p) for p in document.global_white_addrs)
            for config in document.accounts:
                if config.access_key in accounts:
                    log.warning(
                        "The accessKey %s is repeated in multiple ACL files; %s ignored",
                        config.access_key,
                        path,
                    )
                    continue
                accounts[config.access_key] = Account.build(config)
                account_file[config.access_key] = path
        self._stamp = stamps
        log.info(
            "ACL: %d accounts, %d global white patterns from %d files",
            len(accounts),
            len(white),
            len(files),
        )
        return AclState(accounts, account_file, tuple(white), documents, tuple(files))

    def changed(self) -> bool:
        """Whether the ACL files (their set, or a content) differ from those loaded."""
        files = self.acl_files()
        return self._stamps(files) != self._stamp

    def reload_if_changed(self) -> bool:
        """Reload when the files changed; a broken file keeps the configuration in force (and
        is logged once per change).  Blocking: run in a thread.  True if a new one was loaded."""
        with self._lock:
            if not self.changed():
                return False
            try:
                state = self._load()
            except AclConfigError as exc:
                # Remember the broken stamps so that the error is logged once, not every 500 ms.
                self._stamp = self._stamps(self.acl_files())
                log.error("ACL files not reloaded, the last good configuration stays: %s", exc)
                return False
            self.state = state
            log.info("ACL configuration reloaded")
            return True

    # -- the check ------------------------------------------------------------------------

    def validate(self, host: str, code: int, ext: dict[str, str], body: bytes) -> None:
        """Raise :class:`AclRefused` unless the request may be served."""
        state = self.state
        for pattern in state.global_white:
            if pattern.matches(host):
                return
        rule = RULES.get(code)
        try:
            if code in PARSED_BODY_CODES:
                check_body_size(body)
            needed = rule(ext, body) if rule is not None else ()
        except Exception as exc:  # an unreadable body or header: what Java's parse throws
            raise AclRefused(str(exc) or type(exc).__name__, AT_PARSE, "unreadable") from None
        access_key = ext.get(ACCESS_KEY)
        if access_key is None:
            raise AclRefused("No accessKey is configured", AT_NO_ACCESS_KEY, "no-key")
        account = state.accounts.get(access_key)
        if account is None:
            raise AclRefused(f"No acl config for {access_key}", AT_NO_ACL_CONFIG, "unknown-key")
        if account.white.kind != "none" and account.white.matches(host):
            return
        if not account.key.verify(ext, body, ext.get(SIGNATURE)):
            raise _signature_refused(access_key)
        refusal = _decision(account, code, rule, needed)
        if refusal is not None:
            raise AclRefused(*refusal)

    def check(self, channel: Any, request: RemotingCommand) -> RemotingCommand | None:
        """The remoting servers' access check: None to serve the request, else the refusal.

        The common request (an account without white addresses, no global white list, a
        code whose rule reads only the header) is judged here with validate's steps in one
        call, its signature computed once; anything else goes the whole way through
        :meth:`validate`.  Both give the same answers (tests/unit/test_acl.py compares them)."""
        ext = request.ext_fields
        account = self.state.signed_accounts.get(ext.get(ACCESS_KEY))  # type: ignore[arg-type]
        if account is not None:
            code = request.code
            rule = HEADER_RULES.get(code)
            if rule is not None:
                # validate's steps for such an account and code, the signature computed once
                # whatever is kept (so a bad signature costs the same, kept decision or not).
                body = request.body
                if not account.key.verify(ext, body, ext.get(SIGNATURE)):
                    refused = _signature_refused(account.access_key)
                else:
                    refusal = _decision(account, code, rule, rule(ext, body))
                    if refusal is None:
                        return None
                    refused = AclRefused(*refusal)
                host = _host(channel.remote_address)
                self._log_refusal(host, request, refused)
                return request.response(ResponseCode.SYSTEM_ERROR, refused.remark)
        host = _host(channel.remote_address)
        try:
            self.validate(host, request.code, request.ext_fields, request.body)
        except AclRefused as refused:
            self._log_refusal(host, request, refused)
            return request.response(ResponseCode.SYSTEM_ERROR, refused.remark)
        return None

    def validate_signed(
        self,
        remote_address: str,
        access_key: str | None,
        signed: str,
        signature: str | None,
        code: int,
        fields: dict[str, str],
    ) -> None:
        """The check of a request signed another way than the remoting fields (RocketMQ 5's
        gRPC clients: ``signature`` = hex HMAC-SHA1 of ``signed``, their ``x-mq-date-time``,
        by the account's secret), with the permissions the 4.x request ``code`` naming
        ``fields`` needs.  Raises :class:`AclRefused`, as :meth:`validate` does."""
        host = _host(remote_address)
        state = self.state
        for pattern in state.global_white:
            if pattern.matches(host):
                return
        if not access_key:
            raise AclRefused("No accessKey is configured", AT_NO_ACCESS_KEY, "no-key")
        account = state.accounts.get(access_key)
        if account is None:
            raise AclRefused(f"No acl config for {access_key}", AT_NO_ACL_CONFIG, "unknown-key")
        if account.white.kind != "none" and account.white.matches(host):
            return
        expected = hmac.new(account.secret, signed.encode(), hashlib.sha1).hexdigest()
        if signature is None or not hmac.compare_digest(expected, signature.lower()):
            raise _signature_refused(access_key)
        rule = RULES.get(code)
        needed = rule(fields, b"") if rule is not None and rule is not _heartbeat else ()
        refusal = _decision(account, code, rule if rule is not _heartbeat else _signed_only, needed)
        if refusal is not None:
            raise AclRefused(*refusal)

    def authorize(
        self, channel: Any, request: RemotingCommand, needed: Resources
    ) -> RemotingCommand | None:
        """The permissions of resources a processor learns only by reading: a heartbeat's
        groups and topics, the stored message a CONSUMER_SEND_MSG_BACK or VIEW_MESSAGE_BY_ID
        names.  :meth:`check` has passed the request (its signature); None to serve it, else
        the refusal, answered and logged as check's, before the processor changes anything."""
        state = self.state
        host = _host(channel.remote_address)
        for pattern in state.global_white:
            if pattern.matches(host):
                return None
        access_key = request.ext_fields.get(ACCESS_KEY)
        account = state.accounts.get(access_key) if access_key is not None else None
        if account is None:  # removed by a reload since check passed the request
            refused = AclRefused(f"No acl config for {access_key}", AT_NO_ACL_CONFIG, "unknown-key")
        elif account.white.kind != "none" and account.white.matches(host):
            return None
        else:
            refusal = _decision(account, request.code, RULES.get(request.code), needed)
            if refusal is None:
                return None
            refused = AclRefused(*refusal)
        self._log_refusal(host, request, refused)
        return request.response(ResponseCode.SYSTEM_ERROR, refused.remark)

    def _log_refusal(self, host: str, request: RemotingCommand, refused: AclRefused) -> None:
        self.refused += 1
        key = (host, request.ext_fields.get(ACCESS_KEY, ""), refused.reason)
        if key in self._logged:
            return
        if len(self._logged) >= REFUSAL_LOG_MAX:
            self._logged.popitem(last=False)
        self._logged[key] = None
        log.warning(
            "ACL refused code %d from %s (accessKey=%s): %s (further refusals of this kind "
            "from this client are not logged)",
            request.code,
            host,
            key[1] or "-",
            refused,
        )

    # -- admin: the ACL codes 50-54 -------------------------------------------------------

    def _document(self, path: Path) -> AclDocument:
        try:
            return _read_document(path) if path.exists() else AclDocument()
        except OSError as exc:
            raise AclConfigError(f"{path}: cannot read: {exc}") from None

    def _write(self, path: Path, document: AclDocument) -> None:
        version = document.data_version or {"timestamp": now_ms(), "counter": 0}
        document.data_version = {"timestamp": now_ms(), "counter": version["counter"] + 1}
        _write_document(path, document)

    def update_account(self, config: PlainAccessConfig) -> None:
        """Create or replace an account, in the file that holds it (new ones: plain_acl.yml),
        and load the result.  Blocking."""
        config.check()
        Account.build(config)  # patterns and permissions readable before anything is written
        with self._lock:
            path = self.state.account_file.get(config.access_key, self.default_file)
            document = self._document(path)
            for i, existing in enumerate(document.accounts):
                if existing.access_key == config.access_key:
                    document.accounts[i] = config
                    break
            else:
                document.accounts.append(config)
            self._write(path, document)
            self.state = self._load()

    def delete_account(self, access_key: str) -> bool:
        """Remove an account from its file; False when there is none.  Blocking."""
        with self._lock:
            path = self.state.account_file.get(access_key)
            if path is None:
                return False
            document = self._document(path)
            kept = [a for a in document.accounts if a.access_key != access_key]
            if len(kept) == len(document.accounts):
                return False
            document.accounts = kept
            self._write(path, document)
            self.state = self._load()
            return True

    def update_global_white(self, addresses: list[str], file: str | None = None) -> None:
        """Replace the global white list of ``file`` (default plain_acl.yml).  Blocking."""
        for address in addresses:
            compile_address_pattern(address)
        path = Path(file) if file else self.default_file
        resolved = path.resolve()
        if not resolved.is_relative_to(self.home.resolve()):
            raise AclConfigError(f"{file} is not under rocketmqHome {self.home}")
        if path.is_dir() or not path.name.endswith((".yml", ".yaml")):
            raise AclConfigError(f"{file} is not an ACL configuration file")
        with self._lock:
            document = self._document(path)
            document.global_white_addrs = list(addresses)
            self._write(path, document)
            self.state = self._load()

    def all_config(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_ACL_CONFIG's body: every account and white address."""
        state = self.state
        white: list[str] = []
        configs: list[dict[str, Any]] = []
        for path in state.files:
            document = state.documents[path]
            white.extend(document.global_white_addrs)
            configs.extend(
                account.config.to_json_dict()
                for key, account in state.accounts.items()
                if state.account_file[key] == path
            )
        return {"globalWhiteAddrs": white, "plainAccessConfigs": configs}

    def console_view(self) -> dict[str, Any]:
        """Accounts and white addresses for people: secrets masked, each account's file."""
        state = self.state
        accounts = []
        for key, account in sorted(state.accounts.items()):
            view = account.config.to_json_dict(mask_secret=True)
            view["file"] = str(state.account_file[key])
            accounts.append(view)
        white = [w for path in state.files for w in state.documents[path].global_white_addrs]
        default = state.documents.get(self.default_file)
        return {
            "globalWhiteAddrs": white,
            # The ones the console edits (and UPDATE_GLOBAL_WHITE_ADDRS_CONFIG by default).
            "defaultFileWhiteAddrs": list(default.global_white_addrs) if default else [],
            "defaultFile": str(self.default_file),
            "accounts": accounts,
            "files": [str(path) for path in state.files],
        }

    def versions(self) -> tuple[str, str]:
        """The default file's DataVersion JSON and every file's, as GET_BROKER_CLUSTER_ACL_INFO
        answers them."""
        state = self.state

        def version_json(path: Path) -> dict[str, Any]:
            document = state.documents.get(path)
            version = (document.data_version if document else None) or {
                "timestamp": 0,
                "counter": 0,
            }
            return {"counter": version["counter"], "timestamp": version["timestamp"]}

        default = json.dumps(version_json(self.default_file), separators=(",", ":"))
        every = json.dumps(
            {str(path): version_json(path) for path in state.files}, separators=(",", ":")
        )
        return default, every


@functools.lru_cache(maxsize=REFUSAL_LOG_MAX)
def _host(remote_address: str) -> str:
    host, _, _ = remote_address.rpartition(":")
    return host.strip("[]") if host else remote_address
