"""Plain ACL: signatures and refusals against the 4.9.4 captures, address patterns, the rule of
every served request code, the files (several, reload, broken file) and the admin updates."""

from __future__ import annotations

import json
import logging
import pathlib

import pytest
import yaml

from pymq.acl.plain import (
    DENY,
    PUB,
    SUB,
    AclConfigError,
    PlainAccessConfig,
    SigningKey,
    calc_signature,
    check_permission,
    compile_address_pattern,
    parse_perm,
    sign_request,
    signed_content,
)
from pymq.acl.rpc_hook import AclSigner
from pymq.broker.acl import ADMIN_CODES, RULES, AclManager, AclRefused, heartbeat_resources
from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.common.config import ConfigError
from pymq.common.consumer import ConsumerData, HeartbeatData, SubscriptionData
from pymq.common.serde import from_json, to_json
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import MessageStoreConfig

# Captured from a RocketMQ 4.9.4 broker with aclEnable=true (requests of the Java client).
SAMPLES = pathlib.Path(__file__).parents[1] / "data" / "acl"

# The accounts of the capture (java-wire-samples.md, section 7).
CAPTURE_ACL = """\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: RocketMQAdmin
    secretKey: 12345678admin
    admin: true
  - accessKey: normalUser
    secretKey: normalSecret1
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - TopicA=PUB
    groupPerms:
      - G=SUB
"""
CASES = [
    "signed-admin-ok",
    "signed-normal-ok",
    "no-credentials",
    "unknown-accesskey",
    "wrong-signature",
    "no-topic-permission",
]


def write_home(tmp_path: pathlib.Path, text: str = CAPTURE_ACL) -> pathlib.Path:
    conf = tmp_path / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "plain_acl.yml").write_text(text)
    return tmp_path


def sample(name: str) -> tuple[dict, bytes, dict]:
    base = SAMPLES / f"ACL-SEND_MESSAGE_V2-310-{name}"
    request = json.loads((base.with_name(base.name + ".request-header.json")).read_text())
    body = base.with_name(base.name + ".request-body.txt").read_bytes()
    response = json.loads(base.with_name(base.name + ".response-header.json").read_text())
    return request, body, response


def command(code: int, ext: dict[str, str], body: bytes = b"") -> RemotingCommand:
    return RemotingCommand(code=code, ext_fields=dict(ext), body=body)


class FakeChannel:
    def __init__(self, address: str = "127.0.0.1:50000") -> None:
        self.remote_address = address


# -- signatures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("signed-admin-ok", "12345678admin"),
        ("signed-normal-ok", "normalSecret1"),
        ("no-topic-permission", "normalSecret1"),
    ],
)
def test_signature_recomputed_as_the_java_client_signed(name: str, secret: str) -> None:
    request, body, _ = sample(name)
    ext = request["extFields"]
    assert calc_signature(signed_content(ext, body), secret.encode()) == ext["Signature"]
    # Signing the same fields again (as AclClientRPCHook does) gives the same signature.
    fields = {k: v for k, v in ext.items() if k not in ("Signature", "AccessKey")}
    assert sign_request(fields, body, ext["AccessKey"], secret) == ext["Signature"]


def test_signature_leaves_out_the_unique_key_query_flag_and_sorts_as_java() -> None:
    ext = {"b": "2", "a": "1", "AccessKey": "K", "_UNIQUE_KEY_QUERY": "true", "Signature": "x"}
    assert signed_content(ext, b"body") == b"K12body"


def test_signer_signs_and_extends_the_prewritten_json() -> None:
    signer = AclSigner('some"User', "someSecret")
    request = command(RequestCode.SEND_MESSAGE_V2, {"b": "T", "a": "G"}, b"x")
    request.ext_json = '"a":"G","b":"T"'
    signer(request)
    assert request.ext_fields["AccessKey"] == 'some"User'
    expected = calc_signature(b'some"UserGTx', b"someSecret")
    assert request.ext_fields["Signature"] == expected
    # The pre-written JSON says what the fields say.
    assert request.ext_json is not None
    assert json.loads("{" + request.ext_json + "}") == request.ext_fields
    # Signed again (a retry of the same request): the JSON is written from the fields.
    signer(request)
    assert request.ext_json is None and request.ext_fields["Signature"] == expected
    assert "someSecret" not in repr(signer)


def test_signing_key_is_hmac_sha1() -> None:
    for secret in (b"short", b"k" * 64, b"long" * 40):
        for content in (b"", b"abc", b"x" * 5000):
            assert SigningKey(secret).signature(content) == calc_signature(content, secret)


def test_sign_fields_and_verify_agree_with_calc_signature() -> None:
    """sign_fields signs the values in Java key order then the body (long values, many keys,
    non-ASCII); verify accepts exactly that signature (not another value, length or type)."""
    key = SigningKey(b"k")
    for sizes in ([600], [300, 300], [100, 500, 20], [511, 1, 512, 513], [5] * 200):
        ext = {f"k{i:03d}": chr(0xE9 + i % 26) * n for i, n in enumerate(sizes)}
        content = "".join(ext[k] for k in sorted(ext)).encode()
        expected = calc_signature(content + b"body", b"k")
        assert key.sign_fields(ext, b"body") == expected
        assert key.verify(ext, b"body", expected)
        for wrong in (expected[:-1], expected + "A", "\u00e9" * 28, None):
            assert not key.verify(ext, b"body", wrong)
        assert not key.verify(ext, b"other", expected)


# -- the 4.9.4 broker's answers -------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_refusals_answer_as_the_captured_broker(tmp_path: pathlib.Path, name: str) -> None:
    acl = AclManager(str(write_home(tmp_path)))
    request, body, response = sample(name)
    cmd = command(request["code"], request["extFields"], body)
    answer = acl.check(FakeChannel(), cmd)
    if response["code"] == 0:
        assert answer is None
    else:
        assert answer is not None
        assert answer.code == response["code"] == ResponseCode.SYSTEM_ERROR
        assert answer.remark == response["remark"]


def test_non_admin_is_refused_admin_codes_and_may_read_config(tmp_path: pathlib.Path) -> None:
    acl = AclManager(str(write_home(tmp_path)))
    create = {"topic": "T1", "defaultTopic": "TBW102", "readQueueNums": "4"}
    sign_request(create, None, "normalUser", "normalSecret1")
    answer = acl.check(FakeChannel(), command(RequestCode.UPDATE_AND_CREATE_TOPIC, create))
    assert answer is not None
    assert answer.remark == (
        "org.apache.rocketmq.acl.common.AclException: Need admin permission for request "
        "code=17, but accessKey=normalUser is not, org.apache.rocketmq.acl.plain."
        "PlainPermissionManager.checkPerm(PlainPermissionManager.java:580)"
    )
    read: dict[str, str] = {}
    sign_request(read, None, "normalUser", "normalSecret1")
    assert acl.check(FakeChannel(), command(RequestCode.GET_BROKER_CONFIG, read)) is None
    unsigned = acl.check(FakeChannel(), command(RequestCode.GET_BROKER_CONFIG, {}))
    assert unsigned is not None and "No accessKey is configured" in (unsigned.remark or "")


def test_heartbeat_without_body_and_with_groups(tmp_path: pathlib.Path) -> None:
    acl = AclManager(str(write_home(tmp_path)))
    answer = acl.check(FakeChannel(), command(RequestCode.HEART_BEAT, {}))
    assert answer is not None
    assert answer.remark == (
        "org.apache.rocketmq.acl.common.AclException: Cannot read the array length because "
        '"bytes" is null, org.apache.rocketmq.acl.plain.PlainAccessValidator.parse('
        "PlainAccessValidator.java:134)"
    )

    def heartbeat(group: str, topic: str) -> RemotingCommand:
        data = HeartbeatData(
            "c1", [], [ConsumerData(group, subscription_data_set=[SubscriptionData(topic=topic)])]
        )
        body = to_json(data)
        ext: dict[str, str] = {}
        sign_request(ext, body, "normalUser", "normalSecret1")
        return command(RequestCode.HEART_BEAT, ext, body)

    def check_heartbeat(group: str, topic: str) -> RemotingCommand | None:
        """check (the signature, before any parse), then what the processor asks once it has
        read the body."""
        request = heartbeat(group, topic)
        assert acl.check(FakeChannel(), request) is None
        data = from_json(request.body, HeartbeatData)
        return acl.authorize(FakeChannel(), request, heartbeat_resources(data))

    # normalUser: group G SUB, but TopicA only PUB (and topics default DENY).
    refused = check_heartbeat("G", "TopicA")
    assert refused is not None and "No default permission for topic:TopicA" in refused.remark
    refused = check_heartbeat("H", "TopicA")
    assert refused is not None and "No default permission for group:H" in refused.remark
    # A wrong signature is refused before the body is read.
    forged = heartbeat("G", "TopicA")
    forged.ext_fields["Signature"] = "AAAA"
    forged.body = forged.body[:-1] + b"!"  # not JSON: never parsed
    refused = acl.check(FakeChannel(), forged)
    assert refused is not None and "Check signature failed" in refused.remark


def test_retry_topic_send_needs_the_groups_sub(tmp_path: pathlib.Path) -> None:
    acl = AclManager(str(write_home(tmp_path)))
    for group, ok in (("G", True), ("H", False)):
        ext = {"a": group, "b": "%RETRY%" + group, "c": "TBW102"}
        sign_request(ext, b"x", "normalUser", "normalSecret1")
        answer = acl.check(FakeChannel(), command(RequestCode.SEND_MESSAGE_V2, ext, b"x"))
        assert (answer is None) is ok


def test_decisions_kept_per_account_never_pass_what_the_full_check_refuses(
    tmp_path: pathlib.Path,
) -> None:
    """The check's fast path (a decision kept per code and resources) answers as the whole
    check does, request after request: a refused topic stays refused, a bad signature is
    refused on a topic already passed, and a reload (new permissions) forgets the decisions."""
    home = write_home(tmp_path)
    acl = AclManager(str(home))

    def send(topic: str, secret: str = "normalSecret1", body: bytes = b"x") -> str | None:
        ext = {"a": "G", "b": topic, "c": "TBW102", "d": "4", "e": "0"}
        sign_request(ext, body, "normalUser", secret)
        answer = acl.check(FakeChannel(), command(RequestCode.SEND_MESSAGE_V2, ext, body))
        return None if answer is None else answer.remark

    for _ in range(3):
        assert send("TopicA") is None
        assert "No default permission for topic:TopicB" in (send("TopicB") or "")
        assert "Check signature failed" in (send("TopicA", secret="wrong") or "")
        assert send("TopicA", body=b"another body") is None
    decisions = acl.state.accounts["normalUser"].decisions
    assert len(decisions) == 2  # (send, TopicA) passed and (send, TopicB) refused
    # Permissions change in the file: the next check follows the file, not the kept decisions.
    (home / "conf" / "plain_acl.yml").write_text(CAPTURE_ACL.replace("TopicA=PUB", "TopicB=PUB"))
    assert acl.reload_if_changed()
    assert "No default permission for topic:TopicA" in (send("TopicA") or "")
    assert send("TopicB") is None


def test_decisions_kept_are_bounded(tmp_path: pathlib.Path) -> None:
    """At most DECISIONS_MAX per account, allowed or refused, and none for a resource longer
    than any RocketMQ name (a kept decision must not pin what a client sends)."""
    from pymq.broker.acl import DECISIONS_MAX

    text = CAPTURE_ACL.replace("defaultTopicPerm: DENY", "defaultTopicPerm: PUB")
    acl = AclManager(str(write_home(tmp_path, text)))
    decisions = acl.state.accounts["normalUser"].decisions
    for i in range(DECISIONS_MAX + 10):
        ext = {"a": "G", "b": f"T{i}"}
        sign_request(ext, b"x", "normalUser", "normalSecret1")
        assert acl.check(FakeChannel(), command(RequestCode.SEND_MESSAGE_V2, ext, b"x")) is None
        assert len(decisions) <= DECISIONS_MAX
    decisions.clear()
    for topic in ("T" * 1000, "%RETRY%" + "G" * 1000):
        ext = {"a": "G" * 1000, "b": topic}
        sign_request(ext, b"x", "normalUser", "normalSecret1")
        acl.check(FakeChannel(), command(RequestCode.SEND_MESSAGE_V2, ext, b"x"))
    assert not decisions


def test_a_bad_signature_costs_one_signature_whatever_is_kept(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong signature is refused after one HMAC, whether or not a decision is kept for the
    topic: its time says nothing of what the account uses (the secret is needed to learn it)."""
    from pymq.acl.plain import SigningKey

    acl = AclManager(str(write_home(tmp_path)))
    good = {"a": "G", "b": "TopicA"}
    sign_request(good, b"x", "normalUser", "normalSecret1")
    assert acl.check(FakeChannel(), command(RequestCode.SEND_MESSAGE_V2, good, b"x")) is None
    signatures = 0
    real_sign = SigningKey.sign_fields

    def counted(self: SigningKey, ext: object, body: object) -> str:
        nonlocal signatures
        signatures += 1
        return real_sign(self, ext, body)  # type: ignore[arg-type]

    monkeypatch.setattr(SigningKey, "sign_fields", counted)
    monkeypatch.setattr(
        SigningKey,
        "verify",
        lambda self, ext, body, given: counted(self, ext, body) == given,
    )
    for topic in ("TopicA", "TopicZ"):  # a decision kept for TopicA, none for TopicZ
        signatures = 0
        bad = {"a": "G", "b": topic, "AccessKey": "normalUser", "Signature": "AAAA"}
        answer = acl.check(FakeChannel(), command(RequestCode.SEND_MESSAGE_V2, bad, b"x"))
        assert answer is not None and "Check signature failed" in (answer.remark or "")
        assert signatures == 1, topic


_ACCOUNTS_TEXT = (
    CAPTURE_ACL
    + """\
  - accessKey: whiteUser
    secretKey: whiteSecret1
    whiteRemoteAddress: 10.0.0.*
    defaultTopicPerm: SUB
"""
)


@pytest.mark.parametrize("global_white", [False, True])
def test_check_answers_as_validate_does(tmp_path: pathlib.Path, global_white: bool) -> None:
    """The check's fast path and kept decisions against validate with nothing kept, over every
    mix of account, code, topic, group, signature and peer, asked twice (kept the second
    time)."""
    import itertools

    text = _ACCOUNTS_TEXT
    if global_white:
        text = text.replace(
            "globalWhiteRemoteAddresses: []", "globalWhiteRemoteAddresses: [10.9.9.9]"
        )
    acl = AclManager(str(write_home(tmp_path, text)))
    fresh = AclManager(str(write_home(tmp_path / "fresh", text)))
    secrets = {
        "RocketMQAdmin": "12345678admin",
        "normalUser": "normalSecret1",
        "whiteUser": "whiteSecret1",
    }
    codes = [
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.PULL_MESSAGE,
        RequestCode.GET_BROKER_CONFIG,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UNREGISTER_CLIENT,
        9999,
    ]
    cases = list(
        itertools.product(
            ["RocketMQAdmin", "normalUser", "whiteUser", "nobody", None],
            codes,
            ["TopicA", "TopicB", "%RETRY%G", "RMQ_SYS_TRACE_TOPIC"],
            ["G", "H"],
            ["good", "bad", "none"],
            ["127.0.0.1:1", "10.0.0.5:1", "10.9.9.9:1"],
        )
    )
    for _ in range(2):  # the second round with the decisions kept by the first
        for key, code, topic, group, signature, peer in cases:
            ext = {"a": group, "b": topic, "topic": topic, "consumerGroup": group}
            if key is not None:
                sign_request(ext, b"x", key, secrets.get(key, "whatever"))
                if signature == "bad":
                    ext["Signature"] = "AAAA" + ext["Signature"][4:]
                elif signature == "none":
                    del ext["Signature"]
            got = acl.check(FakeChannel(peer), command(code, ext, b"x"))
            try:
                fresh.validate(peer.rpartition(":")[0], code, dict(ext), b"x")
                expected = None
            except AclRefused as refused:
                expected = refused.remark
            for account in fresh.state.accounts.values():
                account.decisions.clear()
            answer = None if got is None else got.remark
            assert answer == expected, (key, code, topic, group, signature, peer)


def test_refusals_are_logged_once_per_client(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    acl = AclManager(str(write_home(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="pymq.broker.acl"):
        for _ in range(5):
            acl.check(FakeChannel("10.0.0.1:1"), command(RequestCode.GET_BROKER_CONFIG, {}))
        acl.check(FakeChannel("10.0.0.2:1"), command(RequestCode.GET_BROKER_CONFIG, {}))
    refusals = [r for r in caplog.records if "ACL refused" in r.getMessage()]
    assert len(refusals) == 2
    assert acl.refused == 6


# -- permissions and address patterns ---------------------------------------------------------


def test_permission_strings_and_checks() -> None:
    assert parse_perm("PUB") == PUB and parse_perm(" SUB ") == SUB
    assert parse_perm("PUB|SUB") == parse_perm("SUB|PUB") == PUB | SUB
    assert parse_perm("DENY") == parse_perm(None) == parse_perm("nonsense") == DENY
    assert check_permission(PUB, PUB | SUB) and not check_permission(SUB, PUB)
    assert not check_permission(PUB, DENY | PUB)


# The permission strings an account may give, None: not given (a missing default is DENY).
_PERMS = ["DENY", "PUB", "SUB", "PUB|SUB", None]
# What each grants (Permission.checkPermission: DENY grants nothing).
_GRANTS = {"DENY": set(), "PUB": {"PUB"}, "SUB": {"SUB"}, "PUB|SUB": {"PUB", "SUB"}, None: set()}


@pytest.mark.parametrize("default", _PERMS)
@pytest.mark.parametrize("listed", _PERMS)
@pytest.mark.parametrize("kind", ["topic", "group"])
def test_a_listed_entry_decides_alone_and_the_default_covers_the_rest(
    tmp_path: pathlib.Path, default: str | None, listed: str | None, kind: str
) -> None:
    """Every (default, entry for the resource or none, PUB or SUB asked): an entry decides by
    itself whatever the default (PlainPermissionManager.checkPerm), and the default decides
    only for a resource the account does not list; the remark names where 4.9.4 throws."""
    lines = ["accounts:", "  - accessKey: matrixUser", "    secretKey: matrixSecret"]
    if default is not None:
        lines.append(f"    default{kind.capitalize()}Perm: {default}")
    # Another resource listed too: the account has a resource table either way.
    entries = ["Elsewhere=PUB|SUB"] + ([f"R={listed}"] if listed is not None else [])
    lines.append(f"    {kind}Perms: [{', '.join(entries)}]")
    acl = AclManager(str(write_home(tmp_path, "\n".join(lines) + "\n")))
    # A request that needs exactly PUB or SUB on R (no request asks PUB on a group).
    requests = {
        ("topic", "PUB"): (RequestCode.SEND_MESSAGE_V2, {"a": "G", "b": "R"}),
        ("topic", "SUB"): (RequestCode.QUERY_MESSAGE, {"topic": "R", "key": "k"}),
        ("group", "SUB"): (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "R"}),
    }
    owned = _GRANTS[listed] if listed is not None else _GRANTS[default]
    for (for_kind, asked), (code, ext) in requests.items():
        if for_kind != kind:
            continue
        fields = dict(ext)
        sign_request(fields, None, "matrixUser", "matrixSecret")
        answer = acl.check(FakeChannel(), command(code, fields))
        case = (kind, default, listed, asked)
        if asked in owned:
            assert answer is None, case
        else:
            assert answer is not None, case
            line = "610" if listed is not None else "605"
            assert answer.remark == (
                "org.apache.rocketmq.acl.common.AclException: No default permission for "
                f"{kind}:R, org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm("
                f"PlainPermissionManager.java:{line})"
            ), case


def test_readme_accounts_listed_entries_refuse_what_the_default_allows(
    tmp_path: pathlib.Path,
) -> None:
    """The requests of issue #37 (item 5) through the whole check: README's account
    (defaultGroupPerm SUB, groupA=DENY) pulling and committing as groupA, and a PUB|SUB default
    with payroll=DENY and audit=SUB sending and pulling."""
    text = """\
accounts:
  - accessKey: RocketMQ
    secretKey: "12345678"
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
    groupPerms: [groupA=DENY, groupB=PUB|SUB]
  - accessKey: payrollUser
    secretKey: payrollSecret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
    topicPerms: [payroll=DENY, audit=SUB]
"""
    acl = AclManager(str(write_home(tmp_path, text)))
    secrets = {"RocketMQ": "12345678", "payrollUser": "payrollSecret"}

    def ask(who: str, code: int, ext: dict[str, str]) -> str | None:
        fields = dict(ext)
        sign_request(fields, b"", who, secrets[who])
        answer = acl.check(FakeChannel(), command(code, fields))
        return None if answer is None else answer.remark

    def pull(topic: str, group: str) -> tuple[int, dict[str, str]]:
        return RequestCode.PULL_MESSAGE, {"consumerGroup": group, "topic": topic, "queueId": "0"}

    def commit(topic: str, group: str) -> tuple[int, dict[str, str]]:
        ext = {"consumerGroup": group, "topic": topic, "queueId": "0", "commitOffset": "1"}
        return RequestCode.UPDATE_CONSUMER_OFFSET, ext

    def send(topic: str) -> tuple[int, dict[str, str]]:
        return RequestCode.SEND_MESSAGE_V2, {"a": "P", "b": topic}

    refused = [
        ("RocketMQ", pull("topicB", "groupA"), "group:groupA"),
        ("RocketMQ", commit("topicB", "groupA"), "group:groupA"),
        ("payrollUser", send("payroll"), "topic:payroll"),
        ("payrollUser", pull("payroll", "g"), "topic:payroll"),
        ("payrollUser", send("audit"), "topic:audit"),
        ("RocketMQ", send("topicC"), "topic:topicC"),
    ]
    for who, (code, ext), what in refused:
        remark = ask(who, code, ext)
        assert remark is not None and f"No default permission for {what}," in remark, (who, ext)
    allowed = [
        ("RocketMQ", pull("topicB", "groupB")),
        ("RocketMQ", pull("topicC", "someGroup")),
        ("payrollUser", pull("audit", "g")),
        ("payrollUser", send("other")),
    ]
    for who, (code, ext) in allowed:
        assert ask(who, code, ext) is None, (who, ext)


def test_retry_topic_sends_need_sub_on_that_topics_group(tmp_path: pathlib.Path) -> None:
    """A send to %RETRY%X needs SUB on group X, whatever producer group the header names (4.9.4
    asked SUB on the header's group, so a member of one group could write into another's
    retries); the trace topic needs PUB like any topic."""
    text = CAPTURE_ACL.replace("      - G=SUB", "      - G=SUB\n      - Other=DENY")
    acl = AclManager(str(write_home(tmp_path, text)))

    def send(producer_group: str, topic: str) -> str | None:
        ext = {"a": producer_group, "b": topic}
        sign_request(ext, b"x", "normalUser", "normalSecret1")
        answer = acl.check(FakeChannel(), command(RequestCode.SEND_MESSAGE_V2, ext, b"x"))
        return None if answer is None else answer.remark

    assert send("CLIENT_INNER_PRODUCER", "%RETRY%G") is None  # the Java client's fallback
    assert "group:Other" in (send("G", "%RETRY%Other") or "")
    assert "group:Unlisted" in (send("G", "%RETRY%Unlisted") or "")
    assert "topic:RMQ_SYS_TRACE_TOPIC" in (send("G", "RMQ_SYS_TRACE_TOPIC") or "")


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*", ["1.2.3.4", "::1"], []),
        ("*.*.*.*", ["10.0.0.1"], []),
        ("", [], ["127.0.0.1"]),
        ("192.168.0.1", ["192.168.0.1"], ["192.168.0.2"]),
        ("192.168.0.*", ["192.168.0.1", "192.168.0.255"], ["192.168.1.1"]),
        ("192.168.1.1-100", ["192.168.1.1", "192.168.1.100"], ["192.168.1.101", "192.168.2.5"]),
        ("10.*.*.*", ["10.9.8.7"], ["11.0.0.1"]),
        ("192.168.1.{1,2,3}", ["192.168.1.2"], ["192.168.1.4"]),
        ("192.168.1.1,10.0.0.1", ["10.0.0.1"], ["10.0.0.2"]),
        ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["::2"]),
        ("1050:0:0:0:5:600:300c:*", ["1050::5:600:300c:1"], ["1050::5:600:300d:1"]),
        ("1050::5:600:300c:1-ff", ["1050::5:600:300c:ff"], ["1050::5:600:300c:100"]),
    ],
)
def test_address_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    compiled = compile_address_pattern(pattern)
    for host in yes:
        assert compiled.matches(host), (pattern, host)
    for host in no:
        assert not compiled.matches(host), (pattern, host)


@pytest.mark.parametrize(
    "pattern", ["192.168.1", "192.168.*.1", "192.168.1.300", "192.168.5-1.*", "not-an-address"]
)
def test_address_patterns_rocketmq_refuses(pattern: str) -> None:
    with pytest.raises(AclConfigError):
        compile_address_pattern(pattern)


def test_white_addresses_bypass_signatures(tmp_path: pathlib.Path) -> None:
    home = write_home(
        tmp_path,
        "globalWhiteRemoteAddresses: ['10.10.*.*']\n"
        "accounts:\n"
        "  - accessKey: trustedApp\n    secretKey: trustedSecret\n"
        "    whiteRemoteAddress: 192.168.0.*\n    defaultTopicPerm: DENY\n",
    )
    acl = AclManager(str(home))
    unsigned = command(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T"})
    assert acl.check(FakeChannel("10.10.3.4:999"), unsigned) is None
    keyed = command(RequestCode.SEND_MESSAGE_V2, {"b": "T", "AccessKey": "trustedApp"})
    assert acl.check(FakeChannel("192.168.0.7:999"), keyed) is None
    answer = acl.check(FakeChannel("192.168.1.7:999"), keyed)
    assert answer is not None and "Check signature failed" in (answer.remark or "")


# -- every request code has a rule ---------------------------------------------------------------


def test_every_served_request_code_has_an_acl_rule(tmp_path: pathlib.Path) -> None:
    store = MessageStoreConfig(store_path_root_dir=str(tmp_path / "store"))
    controller = BrokerController(
        BrokerConfig(), NettyServerConfig(listen_port=0), NettyClientConfig(), store
    )
    served = set(controller.server.routes) | set(controller.fast_server.routes)
    missing = sorted(RequestCode(code).name for code in served if code not in RULES)
    assert not missing, f"request codes served without an ACL rule: {missing}"
    # The admin codes are the 4.9.4 broker's and the ACL codes themselves.
    assert {17, 25, 215, 200, 207, 50, 51, 52, 53, 54} <= set(ADMIN_CODES)
    for code in ADMIN_CODES:
        assert code in served


def test_an_unlisted_code_is_admin_only(tmp_path: pathlib.Path) -> None:
    acl = AclManager(str(write_home(tmp_path)))
    ext: dict[str, str] = {}
    sign_request(ext, None, "normalUser", "normalSecret1")
    with pytest.raises(AclRefused, match="Need admin permission for request code=9999"):
        acl.validate("127.0.0.1", 9999, ext, b"")


# -- files ---------------------------------------------------------------------------------------


def test_acl_directory_of_several_files(tmp_path: pathlib.Path) -> None:
    home = write_home(tmp_path)
    acl_dir = home / "conf" / "acl" / "team"
    acl_dir.mkdir(parents=True)
    (acl_dir / "one.yml").write_text(
        "globalWhiteRemoteAddresses: ['172.16.0.1']\n"
        "accounts:\n  - accessKey: teamOneUser\n    secretKey: teamOneSecret\n"
        "  - accessKey: normalUser\n    secretKey: shadowedSecret\n"
    )
    (home / "conf" / "acl" / "ignored.txt").write_text("not yaml: [")
    acl = AclManager(str(home))
    assert set(acl.state.accounts) == {"RocketMQAdmin", "normalUser", "teamOneUser"}
    # conf/acl is read first: its normalUser wins, plain_acl.yml's is ignored.
    assert acl.state.accounts["normalUser"].secret == b"shadowedSecret"
    assert acl.state.global_white[0].matches("172.16.0.1")


def test_broken_file_at_start_stops_the_broker(tmp_path: pathlib.Path) -> None:
    home = write_home(tmp_path, "accounts:\n  - accessKey: short\n    secretKey: x\n")
    with pytest.raises(AclConfigError, match="longer than 6"):
        AclManager(str(home))
    store = MessageStoreConfig(store_path_root_dir=str(tmp_path / "store"))
    config = BrokerConfig(acl_enable=True, rocketmq_home=str(home))
    with pytest.raises(ConfigError, match="aclEnable=true but the ACL configuration"):
        BrokerController(config, NettyServerConfig(listen_port=0), NettyClientConfig(), store)
    with pytest.raises(AclConfigError, match="rocketmqHome"):
        AclManager("")


def test_reload_on_change_and_a_broken_file_keeps_the_last_good(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = write_home(tmp_path)
    acl = AclManager(str(home))
    assert not acl.reload_if_changed()
    path = home / "conf" / "plain_acl.yml"
    path.write_text(CAPTURE_ACL.replace("normalSecret1", "changedSecret1") + "\n")
    assert acl.reload_if_changed()
    assert acl.state.accounts["normalUser"].secret == b"changedSecret1"
    with caplog.at_level(logging.ERROR, logger="pymq.broker.acl"):
        path.write_text("accounts: [\n")
        assert not acl.reload_if_changed()
        assert not acl.reload_if_changed()  # logged once, not every period
        path.write_bytes(b"accounts: \xff\xfe\n")
        assert not acl.reload_if_changed()
    assert acl.state.accounts["normalUser"].secret == b"changedSecret1"
    assert len([r for r in caplog.records if "not reloaded" in r.getMessage()]) == 2


def test_admin_updates_write_the_file_back(tmp_path: pathlib.Path) -> None:
    home = write_home(tmp_path)
    acl = AclManager(str(home))
    path = home / "conf" / "plain_acl.yml"
    acl.update_account(
        PlainAccessConfig(
            "newAccount1", "newSecret12", default_topic_perm="PUB", topic_perms=["TopicZ=SUB"]
        )
    )
    written = yaml.safe_load(path.read_text())
    account = next(a for a in written["accounts"] if a["accessKey"] == "newAccount1")
    assert account["topicPerms"] == ["TopicZ=SUB"] and account["defaultTopicPerm"] == "PUB"
    assert written["dataVersion"][0]["counter"] == 1
    assert "newAccount1" in acl.state.accounts
    with pytest.raises(AclConfigError):
        acl.update_account(PlainAccessConfig("tiny", "tiny"))
    assert acl.delete_account("newAccount1")
    assert not acl.delete_account("newAccount1")
    assert "newAccount1" not in acl.state.accounts
    acl.update_global_white(["10.1.1.*", "192.168.0.1"])
    assert yaml.safe_load(path.read_text())["globalWhiteRemoteAddresses"] == [
        "10.1.1.*",
        "192.168.0.1",
    ]
    assert acl.state.global_white[0].matches("10.1.1.9")
    with pytest.raises(AclConfigError):
        acl.update_global_white(["10.1.1.*"], "/etc/passwd.yml")
    config = acl.all_config()
    assert config["globalWhiteAddrs"] == ["10.1.1.*", "192.168.0.1"]
    assert {c["accessKey"] for c in config["plainAccessConfigs"]} == {
        "RocketMQAdmin",
        "normalUser",
    }
    default, every = acl.versions()
    assert json.loads(default)["counter"] == 3
    assert str(path) in json.loads(every)


def test_a_parsed_body_over_the_limit_is_refused_before_its_signature(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The codes whose body the broker parses: a body over JSON_BODY_MAX is refused as Java's
    parse fails, before the HMAC over it is computed (or the body read)."""
    from pymq.broker.acl import PARSED_BODY_CODES
    from pymq.common.serde import JSON_BODY_MAX

    acl = AclManager(str(write_home(tmp_path)))
    signatures = 0
    real = SigningKey.verify

    def counted(self: SigningKey, ext: object, body: object, given: object) -> bool:
        nonlocal signatures
        signatures += 1
        return real(self, ext, body, given)  # type: ignore[arg-type]

    monkeypatch.setattr(SigningKey, "verify", counted)
    big = b"{" * (JSON_BODY_MAX + 1)
    for code in sorted(PARSED_BODY_CODES):
        ext = {"AccessKey": "normalUser", "Signature": "AAAA"}
        answer = acl.check(FakeChannel(), command(code, ext, big))
        assert answer is not None and f"over the {JSON_BODY_MAX}-byte limit" in answer.remark
        assert "PlainAccessValidator.parse" in answer.remark
    assert signatures == 0
    # At the limit the signature decides.
    ext = {"AccessKey": "normalUser", "Signature": "AAAA"}
    answer = acl.check(FakeChannel(), command(RequestCode.LOCK_BATCH_MQ, ext, big[1:]))
    assert answer is not None and "Check signature failed" in answer.remark
