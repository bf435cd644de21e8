"""A 5.x client's Telemetry stream as the broker's calls see it (pymq.proxy.clients): calls
wait for the answer with their nonce, bounded in number, refused at once when the stream is
not read, forgotten after their timeout; answers map onto the 4.x bodies as the proxy's."""

from __future__ import annotations

import pytest
import trio
from rocketmq.grpc_protocol import definition_pb2, service_pb2

from pymq.proxy.clients import MAX_PENDING_CALLS, MAX_QUEUED_COMMANDS, TelemetryChannel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingSendError, RemotingTimeoutError
from pymq.remoting.protocol import fastjson

Code = definition_pb2.Code


def running_info() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO)


def answer(channel: TelemetryChannel, code: int, stack: str = "") -> int:
    """Answers every thread-stack command queued so far; how many."""
    answered = 0
    while True:
        try:
            data = channel.queued.receive_nowait()
        except trio.WouldBlock:
            return answered
        command = service_pb2.TelemetryCommand.FromString(data)
        nonce = command.print_thread_stack_trace_command.nonce
        reply = service_pb2.TelemetryCommand(
            status=definition_pb2.Status(code=code),
            thread_stack_trace=service_pb2.ThreadStackTrace(nonce=nonce, thread_stack_trace=stack),
        )
        assert channel.answered(reply)
        answered += 1


async def test_answers_by_nonce_and_their_mapping() -> None:
    channel = TelemetryChannel("c", "127.0.0.1:1", "127.0.0.1:2")
    results: list[RemotingCommand] = []

    async def call() -> None:
        results.append(await channel.invoke(running_info(), 5))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        assert answer(channel, Code.OK, "main: parked") == 3
    assert [r.code for r in results] == [ResponseCode.SUCCESS] * 3
    assert fastjson.loads(results[0].body)["jstack"] == "main: parked"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        answer(channel, Code.VERIFY_FIFO_MESSAGE_UNSUPPORTED)
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        answer(channel, Code.INTERNAL_SERVER_ERROR)
    assert [r.code for r in results[3:]] == [ResponseCode.NO_PERMISSION, ResponseCode.SYSTEM_ERROR]
    # An answer nobody waits for (late, or a made-up nonce) is ignored.
    stray = service_pb2.TelemetryCommand(thread_stack_trace=service_pb2.ThreadStackTrace(nonce="x"))
    assert channel.answered(stray) and channel._calls == {}


async def test_calls_are_bounded_and_time_out() -> None:
    channel = TelemetryChannel("c", "127.0.0.1:1", "127.0.0.1:2")
    refused: list[Exception] = []

    async def call(timeout: float) -> None:
        try:
            await channel.invoke(running_info(), timeout)
        except (RemotingSendError, RemotingTimeoutError) as exc:
            refused.append(exc)

    async with trio.open_nursery() as nursery:
        for _ in range(MAX_PENDING_CALLS + 1):
            nursery.start_soon(call, 0.5)
        await trio.testing.wait_all_tasks_blocked()
        assert len(channel._calls) == MAX_PENDING_CALLS
        assert len(refused) == 1 and isinstance(refused[0], RemotingSendError)
    # Unanswered: each waited its timeout, then is forgotten.
    assert len(refused) == MAX_PENDING_CALLS + 1
    assert all(isinstance(e, RemotingTimeoutError) for e in refused[1:])
    assert channel._calls == {}
    # A stream nobody reads: once its queue is full, a call is refused at once.
    queued = MAX_PENDING_CALLS  # the commands of the calls above, never read
    for _ in range(MAX_QUEUED_COMMANDS - queued):
        channel.outgoing.send_nowait(b"")
    with pytest.raises(RemotingSendError, match="not being read"):
        await channel.invoke(running_info(), 5)
    assert channel._calls == {}
    channel.closed = True
    with pytest.raises(RemotingSendError, match="closed"):
        await channel.invoke(running_info(), 5)
