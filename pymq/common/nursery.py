"""A nursery for the context managers pymq hands to users, whose body's error comes out as itself.

Trio wraps every exception that leaves a nursery in an ``ExceptionGroup``, the body's own
included. A context manager built on a nursery (``async with Producer(...)``,
``open_remoting_client()``, the embedded cluster) would then turn a caller's ``KeyError``, or
the ``MQClientError`` of a refused request, into "Exceptions from Trio nursery (1
sub-exception)", and ``except MQClientError`` around it would not catch it. Here, when the only
exception is the one the body raised, that exception is raised itself; anything else (a
background task that failed, alone or beside the body's error) stays a group, as Trio gives it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def open_nursery_unwrapped() -> AsyncIterator[trio.Nursery]:
    body: list[BaseException] = []
    alone: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                yield nursery
            except BaseException as exc:
                body.append(exc)
                raise
    except BaseExceptionGroup as group:
        if not (body and len(group.exceptions) == 1 and group.exceptions[0] is body[0]):
            raise
        alone = body[0]
    if alone is not None:
        # Raised outside the handler, so that its own __context__ and __cause__ stay as the
        # body left them (the group is not chained on).
        raise alone
