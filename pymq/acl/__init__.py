"""Plain ACL (RocketMQ's ``acl`` module).

* :mod:`pymq.acl.plain` -- the plain ACL as data: permissions, address patterns
  (``RemoteAddressStrategyFactory``), accounts (``PlainAccessConfig``, ``plain_acl.yml``'s
  document) and the request signature (``AclUtils`` / ``AclSigner``);
* :mod:`pymq.acl.rpc_hook` -- the client side, ``AclClientRPCHook``: signs each request a
  remoting client sends.

It depends on :mod:`pymq.common` and :mod:`pymq.remoting` only.  The broker's validator (reading
``plain_acl.yml``, checking each request, the ACL admin codes) is :mod:`pymq.broker.acl`.
"""
