"""RocketMQ 4.x plain ACL as data: permissions, address patterns, accounts and signatures.

No I/O here: the broker (:mod:`pymq.broker.acl`) reads ``plain_acl.yml`` and checks requests with
these pieces, the clients sign with :func:`sign_request`, the admin tools build accounts.

**Signature** (what ``AclClientRPCHook`` sends and ``PlainAccessValidator`` checks): the
request's ``extFields`` except ``Signature`` (and ``_UNIQUE_KEY_QUERY``, which 4.9.x brokers leave
out), sorted by key in Java String order, their *values* concatenated and UTF-8 encoded, then
the body bytes; HMAC-SHA1 with the secret key, standard Base64.
The broker compares in constant time.

**Permissions** are RocketMQ's bits: ``DENY`` 1, ``ANY`` 2, ``PUB`` 4, ``SUB`` 8; a group's
permission is kept under its retry topic (``%RETRY%<group>``), as RocketMQ does.

**Address patterns** (``globalWhiteRemoteAddresses``, an account's ``whiteRemoteAddress``), as
RocketMQ's ``RemoteAddressStrategyFactory`` accepts them: blank (matches nothing), ``*`` /
``*.*.*.*`` / ``*:*:*:*:*:*:*:*`` (everything), one address (IPv4 or IPv6), a comma list of
addresses, ``192.168.1.{1,2,3}`` (a set in the last part), and ranges: ``192.168.0.*``,
``192.168.1.1-100``, ``10.*.*.*``, ``1050:0:0:0:5:600:300c:*`` (a ``*`` or ``a-b`` part, and only
``*`` after it).  A pattern RocketMQ would refuse raises :class:`AclConfigError`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from pymq.common.topic import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

DENY, ANY, PUB, SUB = 1, 2, 4, 8
# extFields the request carries for ACL.
ACCESS_KEY, SIGNATURE, SECURITY_TOKEN = "AccessKey", "Signature", "SecurityToken"
# Left out of the signed content by the 4.9.x broker (older clients did not sign it).
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
_UNSIGNED = frozenset({SIGNATURE, UNIQUE_KEY_QUERY})
# AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_MIN_LENGTH: keys must be longer than this.
KEY_MIN_LENGTH = 6

_PERM_NAMES = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}


class AclConfigError(ValueError):
    """An ACL file, account or address pattern RocketMQ would refuse."""


# -- permissions -------------------------------------------------------------------------------


def parse_perm(text: object) -> int:
    """``Permission.parsePermFromString``: PUB, SUB, PUB|SUB (or SUB|PUB), DENY; anything else,
    or nothing, is DENY."""
    if text is None:
        return DENY
    return _PERM_NAMES.get(str(text).strip(), DENY)


def check_permission(needed: int, owned: int) -> bool:
    """``Permission.checkPermission``: DENY owns nothing; ANY is satisfied by PUB or SUB."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def retry_topic(group: str | None) -> str:
    """``%RETRY%<group>`` (a missing group reads ``null``, as Java's string concatenation)."""
    return RETRY_GROUP_TOPIC_PREFIX + ("null" if group is None else group)


def is_retry_topic(resource: str | None) -> bool:
    return resource is not None and resource.startswith(RETRY_GROUP_TOPIC_PREFIX)


def describe_resource(resource: str | None) -> str:
    """``PlainAccessResource.printStr``: ``group:G`` for a retry topic, else ``topic:T``."""
    if resource is not None and is_retry_topic(resource):
        return "group:" + resource[len(RETRY_GROUP_TOPIC_PREFIX) :]
    return f"topic:{'null' if resource is None else resource}"


# -- address patterns ----------------------------------------------------------------------------


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _exact(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    addr = _address(text)
    if addr is None:
        raise AclConfigError(f"Netaddress examine Exception netaddress is {text}")
    return addr


def _ipv6_groups(text: str) -> list[str] | None:
    """The 8 groups of an IPv6 pattern (``::`` expanded), or None when it cannot be 8."""
    if "::" in text:
        head, _, tail = text.partition("::")
        left = head.split(":") if head else []
        right = tail.split(":") if tail else []
        missing = 8 - len(left) - len(right)
        if missing < 1:
            return None
        return left + ["0"] * missing + right
    parts = text.split(":")
    return parts if len(parts) == 8 else None


@attrs.frozen
class AddressPattern:
    """A compiled white-address pattern; :meth:`matches` takes the peer's host."""

    text: str
    kind: str  # "none", "all", "set", "range"
    addresses: frozenset[Any] = frozenset()
    # For ranges: the version (4 or 6) and, per part, (low, high) inclusive.
    version: int = 4
    parts: tuple[tuple[int, int], ...] = ()

    def matches(self, host: str) -> bool:
        kind = self.kind
        if kind == "all":
            return True
        if kind == "none":
            return False
        addr = _address(host)
        if addr is None:
            return False
        if kind == "set":
            return addr in self.addresses
        if addr.version != self.version:
            return False
        if self.version == 4:
            values = list(addr.packed)
        else:
            packed = addr.packed
            values = [int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2)]
        return all(low <= v <= high for v, (low, high) in zip(values, self.parts, strict=True))


def compile_address_pattern(text: str | None) -> AddressPattern:
    """The pattern ``text`` as RocketMQ reads it, or :class:`AclConfigError`."""
    if text is None or not text.strip():
        return AddressPattern(text or "", "none")
    text = text.strip()
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return AddressPattern(text, "all")
    if text.endswith("}"):
        prefix, brace, inner = text.partition("{")
        sep = ":" if ":" in prefix else "."
        if not brace or not prefix.endswith(sep):
            raise AclConfigError(
                "MultipleRemoteAddressStrategy netaddress examine scope Exception "
                f"netaddress {text}"
            )
        items = [prefix + item.strip() for item in inner[:-1].split(",") if item.strip()]
        return AddressPattern(text, "set", frozenset(_exact(item) for item in items))
    if "," in text:
        items = [item for item in text.split(",") if item.strip()]
        return AddressPattern(text, "set", frozenset(_exact(item) for item in items))
    if "*" in text or "-" in text:
        return _range_pattern(text)
    return AddressPattern(text, "set", frozenset({_exact(text)}))


def _range_pattern(text: str) -> AddressPattern:
    bad = AclConfigError(f"RangeRemoteAddressStrategy netaddress examine scope Exception {text}")
    if ":" in text:
        version, base, top, groups = 6, 16, 0xFFFF, _ipv6_groups(text)
    else:
        version, base, top, groups = 4, 10, 255, text.split(".")
        if len(groups) != 4:
            groups = None
    if groups is None:
        raise bad
    parts: list[tuple[int, int]] = []
    wild = False
    for group in groups:
        group = group.strip()
        try:
            if group == "*":
                low, high = 0, top
                wild = True
            elif "-" in group:
                if wild:  # only "*" may follow a range
                    raise bad
                first, _, last = group.partition("-")
                low, high = int(first, base), int(last, base)
                wild = True
            else:
                if wild:
                    raise bad
                low = high = int(group, base)
        except ValueError:
            raise bad from None
        if not (0 <= low <= high <= top):
            raise bad
        parts.append((low, high))
    if not wild:
        raise bad
    return AddressPattern(text, "range", version=version, parts=tuple(parts))


# -- accounts ----------------------------------------------------------------------------------


def _str_list(value: object, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, list):
        return [str(item) for item in value if item is not None]
    raise AclConfigError(f"{what} must be a list, not {value!r}")


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() == "true"


@attrs.define
class PlainAccessConfig:
    """One account of ``plain_acl.yml`` (RocketMQ's ``PlainAccessConfig``), as written."""

    access_key: str
    secret_key: str
    white_remote_address: str | None = None
    admin: bool = False
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: list[str] = attrs.Factory(list)
    group_perms: list[str] = attrs.Factory(list)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PlainAccessConfig:
        if not isinstance(data, Mapping):
            raise AclConfigError(f"an account must be a mapping, not {data!r}")
        access_key = data.get("accessKey")
        secret_key = data.get("secretKey")
        white = data.get("whiteRemoteAddress")
        config = cls(
            access_key="" if access_key is None else str(access_key),
            secret_key="" if secret_key is None else str(secret_key),
            white_remote_address=None if white is None else str(white),
            admin=_bool(data.get("admin", False)),
            default_topic_perm=_opt_str(data.get("defaultTopicPerm")),
            default_group_perm=_opt_str(data.get("defaultGroupPerm")),
            topic_perms=_str_list(data.get("topicPerms"), "topicPerms"),
            group_perms=_str_list(data.get("groupPerms"), "groupPerms"),
        )
        config.check()
        return config

    def check(self) -> None:
        """``checkPlainAccessConfig``: both keys present and longer than 6 characters."""
        if len(self.access_key) <= KEY_MIN_LENGTH or len(self.secret_key) <= KEY_MIN_LENGTH:
            raise AclConfigError(
                f"The accessKey={self.access_key or None} and secretKey="
                f"{'***' if self.secret_key else None} cannot be null and length should "
                "longer than 6"
            )

    def to_mapping(self) -> dict[str, Any]:
        """The account as ``plain_acl.yml`` writes it."""
        out: dict[str, Any] = {"accessKey": self.access_key, "secretKey": self.secret_key}
        if self.white_remote_address is not None:
            out["whiteRemoteAddress"] = self.white_remote_address
        out["admin"] = self.admin
        if self.default_topic_perm:
            out["defaultTopicPerm"] = self.default_topic_perm
        if self.default_group_perm:
            out["defaultGroupPerm"] = self.default_group_perm
        out["topicPerms"] = list(self.topic_perms)
        out["groupPerms"] = list(self.group_perms)
        return out

    def to_json_dict(self, *, mask_secret: bool = False) -> dict[str, Any]:
        """As RocketMQ's ``PlainAccessConfig`` JSON (GET_BROKER_CLUSTER_ACL_CONFIG's body)."""
        out = self.to_mapping()
        if mask_secret:
            out["secretKey"] = mask(self.secret_key)
        return out


def mask(secret: str) -> str:
    """A secret as shown to people: its first two characters, then stars (not its length)."""
    return secret[:2] + "******" if secret else ""


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _resource_perms(items: Iterable[str], *, group: bool) -> dict[str, int]:
    perms: dict[str, int] = {}
    for item in items:
        parts = [p for p in item.split("=") if p]
        if len(parts) != 2:
            kind = "group" if group else "topic"
            raise AclConfigError(f"Parse resource permission failed for {kind}:{item}")
        name = parts[0].strip()
        perms[retry_topic(name) if group else name] = parse_perm(parts[1])
    return perms


@attrs.frozen
class Account:
    """An account ready for checking (RocketMQ's ``PlainAccessResource`` built from a config)."""

    access_key: str
    secret: bytes
    key: SigningKey
    white: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    # Topic -> perm, and %RETRY%group -> perm; None when the account names no resource.
    resource_perms: dict[str, int] | None
    config: PlainAccessConfig
    # The broker's decisions for this account, (code, resources) -> refusal or None
    # (pymq.broker.acl); a reload builds new accounts, and so forgets them.
    decisions: dict[Any, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @classmethod
    def build(cls, config: PlainAccessConfig) -> Account:
        config.check()
        perms = _resource_perms(config.topic_perms, group=False)
        perms.update(_resource_perms(config.group_perms, group=True))
        return cls(
            access_key=config.access_key,
            secret=config.secret_key.encode(),
            key=SigningKey(config.secret_key.encode()),
            white=compile_address_pattern(config.white_remote_address),
            admin=config.admin,
            default_topic_perm=parse_perm(config.default_topic_perm),
            default_group_perm=parse_perm(config.default_group_perm),
            resource_perms=perms or None,
            config=config,
        )


@attrs.define
class AclDocument:
    """One ACL file: its global white addresses, accounts, and data version (if it has one)."""

    global_white_addrs: list[str] = attrs.Factory(list)
    accounts: list[PlainAccessConfig] = attrs.Factory(list)
    data_version: dict[str, int] | None = None

    @classmethod
    def from_mapping(cls, data: object) -> AclDocument:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise AclConfigError(
                "an ACL file must be a mapping of globalWhiteRemoteAddresses, "
                "accounts and dataVersion"
            )
        white = _str_list(data.get("globalWhiteRemoteAddresses"), "globalWhiteRemoteAddresses")
        for pattern in white:
            compile_address_pattern(pattern)
        accounts_data = data.get("accounts") or []
        if not isinstance(accounts_data, list):
            raise AclConfigError("accounts must be a list")
        accounts = [PlainAccessConfig.from_mapping(item) for item in accounts_data]
        for account in accounts:
            Account.build(account)  # every pattern and permission readable
        version = None
        versions = data.get("dataVersion")
        if isinstance(versions, list) and versions and isinstance(versions[0], Mapping):
            try:
                version = {
                    "timestamp": int(versions[0].get("timestamp", 0)),
                    "counter": int(versions[0].get("counter", 0)),
                }
            except (TypeError, ValueError):
                raise AclConfigError(f"dataVersion is not readable: {versions[0]!r}") from None
        return cls(white, accounts, version)

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "globalWhiteRemoteAddresses": list(self.global_white_addrs),
            "accounts": [account.to_mapping() for account in self.accounts],
        }
        if self.data_version is not None:
            out["dataVersion"] = [dict(self.data_version)]
        return out


# -- signatures --------------------------------------------------------------------------------


def _java_order(key: str) -> bytes:
    # Java compares Strings by UTF-16 code units (which differs from code point order only past
    # the BMP); extField keys are ASCII in practice, and those are sorted as they are.
    return key.encode("utf-16-be")


# The signed keys in order, and what picks their values, per key sequence seen (a client sends
# the same keys in the same order request after request); at most this many sequences kept.
KEY_ORDERS_MAX = 1024
KEY_ORDER_CHARS_MAX = 1024
_KeyOrder = tuple[tuple[str, ...], Callable[[Mapping[str, str]], Any]]
_key_orders: dict[tuple[str, ...], _KeyOrder] = {}


def _key_order(shape: tuple[str, ...]) -> _KeyOrder:
    keys = [k for k in shape if k not in _UNSIGNED]
    if "".join(keys).isascii():
        keys.sort()
    else:
        keys.sort(key=_java_order)
    getter: Callable[[Mapping[str, str]], Any]
    if len(keys) == 1:
        only = keys[0]
        getter = lambda ext: (ext[only],)  # noqa: E731
    elif not keys:
        getter = lambda ext: ()  # noqa: E731
    else:
        getter = operator.itemgetter(*keys)
    return tuple(keys), getter


def _signed_keys(ext_fields: Mapping[str, str]) -> _KeyOrder:
    shape = tuple(ext_fields)
    order = _key_orders.get(shape)
    if order is None:
        order = _key_order(shape)
        # Key names come from the request: only sound ones are kept.
        if len(_key_orders) < KEY_ORDERS_MAX and sum(map(len, shape)) <= KEY_ORDER_CHARS_MAX:
            _key_orders[shape] = order
    return order


def _signed_values(ext_fields: Mapping[str, str]) -> bytes:
    return "".join(_signed_keys(ext_fields)[1](ext_fields)).encode()


def signed_content(ext_fields: Mapping[str, str], body: bytes | None) -> bytes:
    """What the signature covers: the values of ``ext_fields`` (but Signature and
    _UNIQUE_KEY_QUERY) in Java key order, then ``body``."""
    content = _signed_values(ext_fields)
    return content + body if body else content


def calc_signature(content: bytes, secret: bytes) -> str:
    """HMAC-SHA1 of ``content`` with ``secret``, Base64 (``AclUtils.calSignature``)."""
    return base64.b64encode(hmac.digest(secret, content, hashlib.sha1)).decode("ascii")


class SigningKey:
    """A secret ready to sign: HMAC-SHA1's inner and outer hash states computed once (RFC 2104,
    by hashlib, i.e. OpenSSL's SHA-1), so that each signature costs two hash copies instead of
    the key schedule; same result as :func:`calc_signature`.  (Two hashlib copies measure
    faster than ``hmac.HMAC.copy()``, whose wrapper is Python, on a 1 KiB request.)"""

    __slots__ = ("_inner", "_outer")

    def __init__(self, secret: bytes) -> None:
        if len(secret) > _SHA1_BLOCK:
            secret = hashlib.sha1(secret).digest()
        padded = secret.ljust(_SHA1_BLOCK, b"\0")
        self._inner = hashlib.sha1(bytes(b ^ 0x36 for b in padded))
        self._outer = hashlib.sha1(bytes(b ^ 0x5C for b in padded))

    def __repr__(self) -> str:
        return "SigningKey(***)"

    def signature(self, content: bytes, body: bytes | None = None) -> str:
        """The signature of ``content`` followed by ``body``."""
        inner = self._inner.copy()
        inner.update(content)
        if body:
            inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return binascii.b2a_base64(outer.digest(), newline=False).decode("ascii")

    def sign_fields(self, ext_fields: Mapping[str, str], body: bytes | None) -> str:
        """The signature of a request of ``ext_fields`` and ``body``."""
        return self.signature(_signed_values(ext_fields), body)

    def verify(self, ext_fields: Mapping[str, str], body: bytes | None, given: str | None) -> bool:
        """Whether ``given`` is the signature of a request of ``ext_fields`` and ``body``,
        compared in constant time (what the broker checks)."""
        if given is None:
            return False
        expected = self.sign_fields(ext_fields, body)
        try:
            return hmac.compare_digest(expected, given)
        except TypeError:  # a given signature with non-ASCII characters: no Base64, no match
            return False


_SHA1_BLOCK = 64


def sign_request(
    ext_fields: dict[str, str],
    body: bytes | None,
    access_key: str,
    secret_key: str | SigningKey,
    security_token: str | None = None,
) -> str:
    """Add ``AccessKey`` (and ``SecurityToken``) to ``ext_fields`` and then its ``Signature``,
    as ``AclClientRPCHook`` does; returns the signature."""
    key = SigningKey(secret_key.encode()) if isinstance(secret_key, str) else secret_key
    ext_fields.pop(SIGNATURE, None)
    ext_fields[ACCESS_KEY] = access_key
    if security_token:
        ext_fields[SECURITY_TOKEN] = security_token
    signature = key.sign_fields(ext_fields, body)
    ext_fields[SIGNATURE] = signature
    return signature
