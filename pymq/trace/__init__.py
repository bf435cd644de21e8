"""Message trace (RocketMQ's ``client/trace`` package).

:mod:`pymq.trace.data` is the trace topic's data: the records clients write there (Java's
``TraceDataEncoder``) and a message's trace as ``mqadmin queryMsgTraceById`` shows it
(``TraceView``).  RocketMQ keeps it in the client, but the broker reads it too (pymq's admin
service answers a message's trace), so it is a package of its own that depends on
:mod:`pymq.common` only: neither the broker nor the admin tools import the client for it.
"""
