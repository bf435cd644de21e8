"""The bodies of RocketMQ's remoting protocol and the JSON they are written in.

* :mod:`pymq.remoting.protocol.fastjson` -- the JSON dialect of ``RemotingSerializable`` (Java
  encodes bodies with fastjson's defaults, and its tools parse them with fastjson);
* :mod:`pymq.remoting.protocol.body` -- the admin bodies the broker answers with, as the Java
  classes of ``protocol/body`` (``org.apache.rocketmq.common.protocol.body`` in 4.x,
  ``org.apache.rocketmq.remoting.protocol.body`` since 5.0), which ``tools`` (mqadmin) and the
  dashboard parse.

Like the rest of :mod:`pymq.remoting` they depend on :mod:`pymq.common` only.
"""
