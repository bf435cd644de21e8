"""The client side of plain ACL: RocketMQ's ``AclClientRPCHook``.

:class:`AclSigner` is handed to a remoting client (``signer=``) and signs every request it sends:
``AccessKey`` (and ``SecurityToken``) added to the extFields, then ``Signature`` over them and
the body (:func:`pymq.acl.plain.sign_request`).  Remoting knows only a hook called before each
send; the credentials and the signature are this package's, as in RocketMQ, where the hook is
the ``acl`` module's and ``remoting`` only calls ``RPCHook.doBeforeRequest``.
"""

from __future__ import annotations

from pymq.acl.plain import ACCESS_KEY, SIGNATURE, SigningKey, sign_request
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.headers import extend_ext_json


class AclSigner:
    """Signs each request as RocketMQ's ``AclClientRPCHook`` does: ``AccessKey`` (and
    ``SecurityToken``) added to the extFields, then ``Signature`` over them and the body."""

    def __init__(self, access_key: str, secret_key: str, security_token: str | None = None) -> None:
        if not access_key or not secret_key:
            raise ValueError("credentials need both an access key and a secret key")
        self.access_key = access_key
        self._key = SigningKey(secret_key.encode())
        self.security_token = security_token
        # The AccessKey field as the pre-written send JSON gets it, written once.
        self._access_key_json = extend_ext_json("", {ACCESS_KEY: access_key})
        self._tail_fields = f',{self._access_key_json},"{SIGNATURE}":"'.encode()

    def __repr__(self) -> str:  # never the secret
        return f"AclSigner(access_key={self.access_key!r})"

    def signs_frames(self) -> bool:
        """Whether :meth:`send_tail` can sign a producer's pre-written send frame (not with a
        security token: such requests take the general path)."""
        return self.security_token is None

    def send_tail(self, values: str, body: bytes, tail: bytes) -> bytes:
        """A producer's pre-written send frame's header tail (``tail``: its last extFields
        members, then the rest of the header) with ``AccessKey`` and ``Signature`` added as
        :meth:`__call__` adds them.  ``values``: the frame's other extFields values in Java's
        key order (the signature covers the access key, then those, then ``body``)."""
        signature = self._key.signature((self.access_key + values).encode(), body)
        cut = tail.index(b"}")  # the end of the extFields object (no brace before it)
        return b"".join((tail[:cut], self._tail_fields, signature.encode(), b'"', tail[cut:]))

    def __call__(self, request: RemotingCommand) -> None:
        ext_json = request.ext_json
        resigned = ACCESS_KEY in request.ext_fields
        signature = sign_request(
            request.ext_fields, request.body, self.access_key, self._key, self.security_token
        )
        if ext_json is not None:
            # The send path's pre-written extFields JSON: the two fields appended (a request
            # signed before, or with a token, falls back to writing the fields).
            if resigned or self.security_token or not ext_json:
                request.ext_json = None
            else:
                # A Base64 signature needs no escaping.
                request.ext_json = f'{ext_json},{self._access_key_json},"{SIGNATURE}":"{signature}"'
