"""Message filtering by expression (RocketMQ's ``filter`` module).

:mod:`pymq.filter.sql92` is the SQL92 selector: its parser, checks and compiler (Java's
``SelectorParser``, ``SqlFilter`` and the expression classes ``FilterFactory`` hands out).  It
depends on nothing of pymq but :mod:`pymq.common`; the broker's use of it (the registered filters
of consumer groups and the pull path's record filter, Java's ``broker.filter``) stays in
:mod:`pymq.broker`.
"""
