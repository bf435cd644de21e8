"""Who may replicate from a master: the HA port's guard, and pymq's slave handshake.

RocketMQ 4.9.4's HA port (and 5.x's) takes anyone: the protocol has no credentials, so a stranger
reporting offset 0 is streamed the whole commit log.  pymq keeps that protocol, and by default
(no ACL, no TLS, none of the keys below) accepts any slave as RocketMQ does, Java's included.
What switches protection on, and what a RocketMQ (Java) slave can still do then:

* ``haSlaveAllowList`` (master; default empty: any host): RocketMQ white-address patterns (the
  syntax of ``plain_acl.yml``'s ``whiteRemoteAddress``: ``10.1.2.3``, ``10.1.2.*``,
  ``10.1.2.1-20``, ``10.1.2.{3,4}``, ``10.1.2.3,10.1.2.4``), separated by ``;``.  A connection
  from any other host is closed before a byte is read.  A Java slave on a listed host works.
* ``tls.server.mode`` (the remoting ports' TLS, ``pymq.remoting.tls``): the HA port serves TLS
  in the same mode, with the same certificate and client-certificate demand
  (``tls.server.need.client.auth``).  Enforcing: plain connections are refused, so a Java slave
  (its HA client has no TLS) cannot replicate; permissive: it can, as on the remoting ports.
  A pymq slave connects with TLS when its ``tls.enable`` is true.  TLS without a client
  certificate encrypts but does not tell who the slave is: with ``need.client.auth=require`` a
  stranger without a certificate signed by ``tls.server.trustCertPath`` gets nothing.
* ``haSecret`` (both; default empty): a shared secret.  Set on the master, every slave must
  prove it knows it (below) before anything is sent; a Java slave cannot.
* ``aclEnable=true`` on the master: every slave must prove the secret of an admin ACL account
  (the slave's ``accessKey``/``secretKey``, the account it signs its requests to the master
  with), or ``haSecret`` when that is set.  Without ``haSecret``, a host on the ACL's global white
  list (``globalWhiteRemoteAddresses``, which the remoting ports let do anything unsigned) may
  replicate without proof: the one way for a Java slave under ACL.

The handshake (pymq only; a pymq slave starts it when it has a credential, ``haSecret`` or an
account; against RocketMQ's master, which knows no handshake, set neither).  It is mutual: the
slave proves the secret to the master, and the master proves it back, so that a slave given a
wrong or hostile ``haMasterAddress`` does not take a commit log from a peer that lacks it:

1. slave: :data:`HELLO` (8 bytes; as an offset report it would be negative, which no RocketMQ
   slave sends, so a master tells it from a plain report by its first 8 bytes), then its own
   random nonce of :data:`NONCE_SIZE` bytes;
2. master: :data:`HELLO` then its random nonce of :data:`NONCE_SIZE` bytes;
3. slave: ``u8 n | n bytes accessKey (UTF-8; empty for haSecret) |`` HMAC-SHA256 keyed by the
   secret of ``SLAVE_PROOF_CONTEXT | master nonce | slave nonce | accessKey``;
4. master, once the proof is good: :data:`PROVEN` then HMAC-SHA256 keyed by the same secret of
   ``MASTER_PROOF_CONTEXT | slave nonce | master nonce | accessKey``, or, when it asks no proof
   (no ``haSecret``, no ACL), :data:`UNPROVEN` then 32 zero bytes; then the plain protocol.

Each side's MAC covers the other's fresh nonce (no replay) under its own context (a proof is
never valid the other way round), and is compared in constant time.  A slave proving
``haSecret`` accepts only a master's good proof; a slave proving an ACL account accepts
:data:`UNPROVEN` too (a master without ``aclEnable`` admits it unproven), but never a wrong
proof.  The master proves only to a slave that proved first, so it is no oracle for strangers.
What the handshake does not do is bind the stream after it: against a man in the middle who can
reach the real master, use TLS with the master's certificate checked (``tls.client.authServer``).

The master sends nothing but the challenge before a good proof; a wrong one closes the
connection.  The whole admission (TLS handshake, first 8 bytes, handshake) must end within
``haHousekeepingInterval``, as any silence on the port must.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from pymq.acl.plain import AclConfigError, AddressPattern, compile_address_pattern
from pymq.common.config import ConfigError
from pymq.store.ha.framing import HAProtocolError

if TYPE_CHECKING:
    from pymq.remoting.tls import TlsServer

# The slave's first 8 bytes when it starts the handshake; the master's challenge starts with them.
# Version 2 (mutual); version 1's slaves (one-way) are not answered.
HELLO = b"\xffPYMQHA\x02"
NONCE_SIZE = 32
MAC_SIZE = 32  # HMAC-SHA256
# The slave's hello (HELLO and its nonce) and the master's challenge (HELLO and its nonce).
SLAVE_HELLO_SIZE = CHALLENGE_SIZE = len(HELLO) + NONCE_SIZE
# What each side's MAC covers before the nonces: the protocol, its version and the direction.
SLAVE_PROOF_CONTEXT = b"pymq-ha-slave-proof-2"
MASTER_PROOF_CONTEXT = b"pymq-ha-master-proof-2"
# The master's answer to a good proof: one of these bytes, then MAC_SIZE bytes.
PROVEN = b"\x01"
UNPROVEN = b"\x00"
ANSWER_SIZE = 1 + MAC_SIZE
# An accessKey in a proof is at most this many bytes (its length is one byte).
MAX_ACCESS_KEY_BYTES = 255
ALLOW_LIST_SEPARATOR = ";"


def parse_allow_list(text: str, key: str = "haSlaveAllowList") -> tuple[AddressPattern, ...]:
    """The patterns of ``text`` (``;``-separated white-address patterns); ConfigError naming
    ``key`` when one is not a pattern."""
    patterns = []
    for item in text.split(ALLOW_LIST_SEPARATOR):
        if not item.strip():
            continue
        try:
            patterns.append(compile_address_pattern(item))
        except AclConfigError as exc:
            raise ConfigError(f"{key}: {item.strip()!r} is not an address pattern: {exc}") from None
    return tuple(patterns)


def _mac(secret: bytes, context: bytes, first: bytes, second: bytes, access_key: bytes) -> bytes:
    return hmac.digest(secret, context + first + second + access_key, hashlib.sha256)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_SIZE)


def slave_hello() -> tuple[bytes, bytes]:
    """``(slave nonce, hello bytes)`` for one connection."""
    nonce = new_nonce()
    return nonce, HELLO + nonce


def new_challenge() -> tuple[bytes, bytes]:
    """``(master nonce, challenge bytes)`` for one connection."""
    nonce = new_nonce()
    return nonce, HELLO + nonce


def proof_mac(secret: bytes, master_nonce: bytes, slave_nonce: bytes, access_key: bytes) -> bytes:
    """The slave's MAC."""
    return _mac(secret, SLAVE_PROOF_CONTEXT, master_nonce, slave_nonce, access_key)


def master_mac(secret: bytes, slave_nonce: bytes, master_nonce: bytes, access_key: bytes) -> bytes:
    """The master's MAC."""
    return _mac(secret, MASTER_PROOF_CONTEXT, slave_nonce, master_nonce, access_key)


def encode_proof(challenge: bytes, slave_nonce: bytes, access_key: str, secret: bytes) -> bytes:
    """The slave's answer to the master's ``challenge``; HAProtocolError when ``challenge`` is
    not one (a master that does not know the handshake)."""
    if len(challenge) != CHALLENGE_SIZE or not challenge.startswith(HELLO):
        raise HAProtocolError(
            "the master did not answer the HA handshake (RocketMQ's master knows none: against "
            "it, set neither haSecret nor accessKey/secretKey on the slave)"
        )
    key = access_key.encode()
    if len(key) > MAX_ACCESS_KEY_BYTES:
        raise HAProtocolError(f"accessKey longer than {MAX_ACCESS_KEY_BYTES} bytes")
    master_nonce = challenge[len(HELLO) :]
    return bytes([len(key)]) + key + proof_mac(secret, master_nonce, slave_nonce, key)


def encode_answer(
    secret: bytes | None, slave_nonce: bytes, master_nonce: bytes, key: bytes
) -> bytes:
    """The master's answer to a good proof: its own proof by ``secret``, or UNPROVEN (None:
    it asked no proof)."""
    if secret is None:
        return UNPROVEN + bytes(MAC_SIZE)
    return PROVEN + master_mac(secret, slave_nonce, master_nonce, key)


def check_answer(
    answer: bytes, challenge: bytes, slave_nonce: bytes, access_key: str, secret: bytes
) -> None:
    """HAProtocolError unless ``answer`` is the master's good proof of ``secret`` (or, for an
    ACL account's proof, UNPROVEN: a master that asks no proof)."""
    if len(answer) != ANSWER_SIZE:
        raise HAProtocolError("the master closed the HA handshake: it refused this slave's proof")
    key = access_key.encode()
    if answer[:1] == UNPROVEN and key:
        return
    if answer[:1] != PROVEN:
        raise HAProtocolError(
            "the master does not prove haSecret (a master without haSecret, or not this "
            "slave's master): refused"
        )
    master_nonce = challenge[len(HELLO) :]
    if not hmac.compare_digest(master_mac(secret, slave_nonce, master_nonce, key), answer[1:]):
        raise HAProtocolError("the master's proof is wrong (its secret differs): refused")


@attrs.frozen
class HAGuard:
    """What the master's HA port admits (see the module's docstring).  The default admits
    anyone, in plain TCP: RocketMQ's behaviour."""

    # Hosts that may connect; empty: any.
    allow: tuple[AddressPattern, ...] = ()
    # TLS on the port (tls.server.mode), or None.
    tls: TlsServer | None = None
    # haSecret, or None.
    secret: bytes | None = None
    # aclEnable: the secret of an admin account by accessKey (None for any other key).
    account_secret: Callable[[str], bytes | None] | None = None
    # aclEnable: whether a host is on the ACL's global white list.
    white_host: Callable[[str], bool] | None = None

    def allows(self, host: str) -> bool:
        return not self.allow or any(p.matches(host) for p in self.allow)

    @property
    def proof_required(self) -> bool:
        return self.secret is not None or self.account_secret is not None

    def admits_plain(self, host: str) -> bool:
        """Whether ``host`` may replicate without the handshake (RocketMQ's plain protocol)."""
        if not self.proof_required:
            return True
        return self.secret is None and self.white_host is not None and self.white_host(host)

    def verify(self, access_key: bytes, nonces: tuple[bytes, bytes], mac: bytes) -> bytes | None:
        """The secret by which the proof ``mac`` of ``access_key`` over ``nonces`` (the
        master's, the slave's) is good, or None when no proof is asked; HAProtocolError saying
        why it is refused."""
        if not self.proof_required:
            return None  # nothing to prove here: a plain slave would be taken as well
        if not access_key:
            secret = self.secret
            if secret is None:
                raise HAProtocolError("a proof by haSecret, but this master has no haSecret")
        else:
            if self.account_secret is None:
                raise HAProtocolError(
                    "a proof by an ACL account, but this master has aclEnable=false"
                )
            try:
                found = self.account_secret(access_key.decode())
            except UnicodeDecodeError:
                found = None
            if found is None:
                raise HAProtocolError(
                    f"accessKey {access_key!r} is not an admin account of this master's ACL"
                )
            secret = found
        if not hmac.compare_digest(proof_mac(secret, *nonces, access_key), mac):
            raise HAProtocolError("a wrong proof (the secret differs)")
        return secret
